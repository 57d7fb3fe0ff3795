"""
The ``vipu`` provider: drives Graphcore's ``vipu`` command-line tool on a real Pod.

Layer: ``poprun.partitions``; the standard library (``subprocess``) and
:mod:`poprun.partitions.provider`.

Commands and outputs follow reference section 6 (``real-poprun-behaviour.md``):
``vipu list partitions`` prints a ``|`` table whose columns changed between V-IPU versions,
so columns are found by their header names (``Partition``, ``Cluster``, ``Allocation``,
``ILDs``, ``GW Routing``, ``ILD Routing``, ``Size``, ``GCDs``, ``State``); ``vipu get partition
NAME --gcd 0 --ipuof-configs`` prints the IPUoF JSON whose ``attributes`` give the replicas,
the sync type and whether the partition is reconfigurable. The real V-IPU server has no
leases: :meth:`VipuProvider.lease` and :meth:`VipuProvider.release` do nothing, and device
acquisition stays Poplar's (the seed's known issue 7.1 remains on a real Pod).
"""

from __future__ import annotations

import contextlib
import json
import subprocess
from collections.abc import Callable, Sequence

from poprun.partitions.provider import (
    CapacityError,
    ExistsError,
    NotFoundError,
    Owner,
    PartitionInfo,
    PartitionRequest,
    PartitionState,
    ProviderError,
    UnreachableError,
)

# Runs argv with a timeout; returns (exit status, stdout, stderr). Raises TimeoutError or OSError.
Runner = Callable[[Sequence[str], float], tuple[int, str, str]]
_COLUMNS = {"partition": "name", "cluster": "cluster", "allocation": "allocation", "ilds": "num_ilds",
            "gw routing": "gw_link_routing_type", "ild routing": "ipu_link_routing_type", "size": "size",
            "gcds": "num_gcds", "state": "state"}
# Words in the tool's messages -> the error they mean, first match wins.
_MESSAGES: tuple[tuple[tuple[str, ...], type[ProviderError]], ...] = (
    (("unable to connect", "context deadline exceeded", "connection refused", "no such host"), UnreachableError),
    (("already exists",), ExistsError),
    (("not found", "does not exist", "no partition"), NotFoundError),
    (("insufficient", "not enough", "no available", "no free"), CapacityError),
)


def run_subprocess(argv: Sequence[str], timeout_s: float, *, path: str | None = None) -> tuple[int, str, str]:
    """Run ``argv``; return its status and output. Raises TimeoutError, OSError."""
    env = None if path is None else {"PATH": path, "LC_ALL": "C"}
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, check=False, env=env)  # noqa: S603
    except subprocess.TimeoutExpired as exc:
        raise TimeoutError(str(exc)) from exc
    return done.returncode, done.stdout, done.stderr


def parse_partition_table(text: str) -> tuple[PartitionInfo, ...]:
    """Return the partitions of a ``vipu list partitions`` table, sorted by name."""
    header: list[str] | None = None
    found = []
    for line in text.splitlines():
        if "|" not in line:
            continue
        cells = [c.strip() for c in line.split("|")]
        if header is None:
            header = [_COLUMNS.get(c.lower(), "") for c in cells]
            continue
        row = {k: v for k, v in zip(header, cells, strict=False) if k}
        if row.get("name"):
            found.append(_row_info(row))
    return tuple(sorted(found, key=lambda i: i.name))


def _row_info(row: dict[str, str]) -> PartitionInfo:
    def number(key: str) -> int:
        return int(row[key]) if row.get(key, "").isdigit() else 0

    return PartitionInfo(
        name=row["name"], size=number("size"), num_gcds=number("num_gcds") or 1, num_ilds=number("num_ilds"),
        state=PartitionState.from_text(row.get("state", "")), cluster=row.get("cluster") or None,
        allocation=row.get("allocation") or None,
        ipu_link_routing_type=(row.get("ipu_link_routing_type") or "").upper() or None,
        gw_link_routing_type=(row.get("gw_link_routing_type") or "").upper() or None)


def parse_ipuof_config(info: PartitionInfo, text: str) -> PartitionInfo:
    """Return ``info`` completed with the ``attributes`` of ``vipu get partition --ipuof-configs`` JSON."""
    attributes = json.loads(text).get("attributes", {})
    replicas = attributes.get("Num Replicas")
    reconfigurable = attributes.get("Fabric Reconfigurable")
    routing, sync = attributes.get("Routing Type"), attributes.get("Sync Type")
    return PartitionInfo(
        name=info.name, size=info.size, num_gcds=info.num_gcds, num_ilds=info.num_ilds, state=info.state,
        cluster=info.cluster, allocation=info.allocation, gw_link_routing_type=info.gw_link_routing_type,
        ipu_link_routing_type=info.ipu_link_routing_type or (routing.upper() if routing else None),
        num_replicas=int(replicas) if str(replicas).isdigit() else None,
        sync_type=sync.upper() if sync else None,
        reconfigurable=None if reconfigurable is None else str(reconfigurable).lower() == "true")


def create_argv(request: PartitionRequest) -> list[str]:
    """Return the words after ``vipu`` that create ``request``."""
    argv = ["create", "partition", request.name, "--size", str(request.size), "--num-gcds", str(request.num_gcds)]
    if request.num_ilds:
        argv += ["--num-ilds", str(request.num_ilds)]
    for flag, value in (("--allocation", request.allocation), ("--sync-type", request.sync_type),
                        ("--ipu-link-routing-type", request.ipu_link_routing_type),
                        ("--gw-link-routing-type", request.gw_link_routing_type)):
        if value:
            argv += [flag, value]
    return [*argv, "--reconfigurable"] if request.reconfigurable else argv


def error_of(status: int, output: str) -> ProviderError:
    """Return the error a failed ``vipu`` command's output means."""
    text = " ".join(output.split()) or f"vipu exited with status {status}"
    lower = text.lower()
    kind = next((cls for words, cls in _MESSAGES if any(w in lower for w in words)), ProviderError)
    return kind(text)


class VipuProvider:
    """The ``vipu`` tool against the server at ``host:port`` (a :class:`~poprun.partitions.provider.Provider`)."""

    def __init__(self, host: str, port: int, *, timeout_s: float = 120.0, path: str | None = None,
                 run: Runner | None = None) -> None:
        self.host, self.port, self.timeout_s = host, port, timeout_s
        self._run: Runner = run or (lambda argv, t: run_subprocess(argv, t, path=path))

    @property
    def address(self) -> str:
        """``host:port``."""
        return f"{self.host}:{self.port}"

    def command(self, *words: str) -> list[str]:
        """Return the full argv of a ``vipu`` command against this server."""
        return ["vipu", "--api-host", self.host, "--api-port", str(self.port), *words]

    def _vipu(self, *words: str) -> str:
        """Run a vipu command; return its standard output or raise the error it reports."""
        try:
            status, out, err = self._run(self.command(*words), self.timeout_s)
        except TimeoutError as exc:
            msg = f"vipu {' '.join(words[:2])}: no answer within {self.timeout_s:g} s"
            raise UnreachableError(msg) from exc
        except OSError as exc:
            msg = f"cannot run vipu: {exc.strerror or exc}"
            raise UnreachableError(msg) from exc
        if status != 0:
            raise error_of(status, err or out)
        return out

    def list(self) -> tuple[PartitionInfo, ...]:
        """Return every partition (``vipu list partitions``)."""
        return parse_partition_table(self._vipu("list", "partitions"))

    def get(self, name: str) -> PartitionInfo | None:
        """Return the partition: its row of the list, completed by its IPUoF configuration."""
        info = next((i for i in self.list() if i.name == name), None)
        if info is None:
            return None
        try:
            return parse_ipuof_config(info, self._vipu("get", "partition", name, "--gcd", "0", "--ipuof-configs"))
        except (ProviderError, ValueError, AttributeError):
            return info  # the table alone: replicas, sync type and reconfigurability unknown

    def create(self, request: PartitionRequest, *, owner: Owner | None = None) -> PartitionInfo:  # noqa: ARG002
        """Create the partition (``owner`` is ignored: V-IPU has no leases)."""
        self._vipu(*create_argv(request))
        return self._must_get(request.name)

    def update(self, request: PartitionRequest, *, owner: Owner | None = None) -> PartitionInfo:
        """Remove the partition (if any) and create it again."""
        with contextlib.suppress(NotFoundError):
            self.remove(request.name)
        return self.create(request, owner=owner)

    def reset(self, name: str) -> PartitionInfo:
        """Reset the partition (``vipu reset partition NAME``)."""
        self._vipu("reset", "partition", name)
        return self._must_get(name)

    def remove(self, name: str, *, owner: Owner | None = None) -> None:  # noqa: ARG002
        """Remove the partition (``vipu remove partition NAME``)."""
        self._vipu("remove", "partition", name)

    def lease(self, name: str, owner: Owner, *, ttl_s: float) -> None:
        """Do nothing: the real V-IPU server has no leases."""

    def release(self, name: str, owner: Owner) -> None:
        """Do nothing: the real V-IPU server has no leases."""

    def _must_get(self, name: str) -> PartitionInfo:
        info = self.get(name)
        if info is None:
            msg = f"partition {name} not found after the command"
            raise NotFoundError(msg)
        return info
