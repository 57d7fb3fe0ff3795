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

The tool's output is read as untrusted: each command runs in its own session and is killed with
everything it started once ``timeout_s`` has passed in total (UnreachableError); it may print at
most 1 MiB, in UTF-8, and what it prints must have the documented shape: a table with a
``Partition`` column whose counts are numbers, names of printable characters, and an IPUoF
configuration that is a JSON object (MalformedAnswerError, PR510, otherwise). Its error messages
are shown with control characters escaped.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import Any

from poprun.partitions.provider import (
    CapacityError,
    ExistsError,
    MalformedAnswerError,
    NotFoundError,
    Owner,
    PartitionInfo,
    PartitionRequest,
    PartitionState,
    ProviderError,
    UnreachableError,
)
from poprun.partitions.wire import MAX_NAME, MAX_TEXT, printable

MAX_OUTPUT = 1 << 20  # bytes a vipu command may print (standard output and error together)
# Runs argv with a timeout; returns (exit status, stdout, stderr). Raises TimeoutError, OSError, MalformedAnswerError.
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
    """
    Run ``argv`` in its own session; return its status and output, all within ``timeout_s``.

    Whatever is left of it at the end (the tool, and anything it started) is killed.
    Raises TimeoutError, OSError, MalformedAnswerError (more than MAX_OUTPUT bytes, or not UTF-8).
    """
    env = None if path is None else {"PATH": path, "LC_ALL": "C"}
    end = time.monotonic() + timeout_s
    with subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,  # noqa: S603
                          stderr=subprocess.PIPE, env=env, start_new_session=True) as proc:
        try:
            out, err = _collect(proc, end)
            status = proc.wait(max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired as exc:
            raise TimeoutError(str(exc)) from exc
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # the process is not reaped yet: its group id is still its own
    return status, _decode(out, "standard output"), _decode(err, "standard error")


def _collect(proc: subprocess.Popen[bytes], end: float) -> tuple[bytes, bytes]:
    """Read both pipes to their end by ``end``. Raises TimeoutError, MalformedAnswerError (too much)."""
    assert proc.stdout is not None
    assert proc.stderr is not None
    chunks: dict[int, list[bytes]] = {proc.stdout.fileno(): [], proc.stderr.fileno(): []}
    total = 0
    with selectors.DefaultSelector() as selector:
        for fd in chunks:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            left = end - time.monotonic()
            if left <= 0:
                msg = "deadline passed"
                raise TimeoutError(msg)
            for key, _ in selector.select(left):
                data = os.read(key.fd, 65536)
                if not data:
                    selector.unregister(key.fd)
                    continue
                chunks[int(key.fd)].append(data)
                total += len(data)
                if total > MAX_OUTPUT:
                    msg = "it printed more than 1 MiB"
                    raise MalformedAnswerError(msg)
    return b"".join(chunks[proc.stdout.fileno()]), b"".join(chunks[proc.stderr.fileno()])


def _decode(data: bytes, stream: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        msg = f"its {stream} is not UTF-8 (byte 0x{data[exc.start]:02x} at offset {exc.start})"
        raise MalformedAnswerError(msg) from None


def parse_partition_table(text: str) -> tuple[PartitionInfo, ...]:
    """
    Return the partitions of a ``vipu list partitions`` table, sorted by name.

    Output without any ``|`` line but with text is not a table (a proxy's page, another program).
    Raises MalformedAnswerError.
    """
    header: list[str] | None = None
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        if "|" not in line:
            continue
        cells = [c.strip() for c in line.split("|")]
        if header is None:
            header = [_COLUMNS.get(c.lower(), "") for c in cells]
            if "name" not in header:
                msg = f"line {number} is not the header of a partition table: '{printable(line.strip(), 120)}'"
                raise MalformedAnswerError(msg)
            continue
        row = {k: v for k, v in zip(header, cells, strict=False) if k}
        if row.get("name"):
            found.append(_row_info(row, number))
    if header is None and text.strip():
        first = next(line for line in text.splitlines() if line.strip())
        msg = f"no partition table in its output, which starts '{printable(first.strip(), 120)}'"
        raise MalformedAnswerError(msg)
    return tuple(sorted(found, key=lambda i: i.name))


def _row_info(row: dict[str, str], line: int) -> PartitionInfo:
    def number(key: str) -> int:
        cell = row.get(key, "")
        if cell and not (cell.isascii() and cell.isdigit() and len(cell) <= 9):  # noqa: PLR2004 - a billion IPUs
            msg = f"line {line}: the {key.replace('num_', '')} column holds '{printable(cell, 40)}', not a count"
            raise MalformedAnswerError(msg)
        return int(cell) if cell else 0

    def text(key: str, limit: int = MAX_TEXT) -> str | None:
        cell = row.get(key) or None
        if cell is not None and (len(cell) > limit or not cell.isprintable()):
            msg = f"line {line}: the {key} column holds '{printable(cell, 60)}'"
            raise MalformedAnswerError(msg)
        return cell

    return PartitionInfo(
        name=text("name", MAX_NAME) or "", size=number("size"), num_gcds=number("num_gcds") or 1,
        num_ilds=number("num_ilds"), state=PartitionState.from_text(text("state") or ""), cluster=text("cluster"),
        allocation=text("allocation"), ipu_link_routing_type=(text("ipu_link_routing_type") or "").upper() or None,
        gw_link_routing_type=(text("gw_link_routing_type") or "").upper() or None)


def parse_ipuof_config(info: PartitionInfo, text: str) -> PartitionInfo:
    """
    Return ``info`` completed with the ``attributes`` of ``vipu get partition --ipuof-configs`` JSON.

    Raises MalformedAnswerError when the output is not such a JSON object.
    """
    try:
        doc = json.loads(text)
    except RecursionError:
        msg = "its IPUoF configuration is not JSON (nested too deeply)"
        raise MalformedAnswerError(msg) from None
    except ValueError as exc:
        msg = f"its IPUoF configuration is not JSON ({printable(str(exc), 100)})"
        raise MalformedAnswerError(msg) from None
    attributes = doc.get("attributes", {}) if isinstance(doc, dict) else None
    if not isinstance(attributes, dict):
        msg = "its IPUoF configuration is not a JSON object with an object of attributes"
        raise MalformedAnswerError(msg)
    replicas = _attribute(attributes, "Num Replicas")
    reconfigurable = _attribute(attributes, "Fabric Reconfigurable")
    routing, sync = _attribute(attributes, "Routing Type"), _attribute(attributes, "Sync Type")
    return PartitionInfo(
        name=info.name, size=info.size, num_gcds=info.num_gcds, num_ilds=info.num_ilds, state=info.state,
        cluster=info.cluster, allocation=info.allocation, gw_link_routing_type=info.gw_link_routing_type,
        ipu_link_routing_type=info.ipu_link_routing_type or (routing.upper() if routing else None),
        num_replicas=int(replicas) if replicas and replicas.isascii() and replicas.isdigit() else None,
        sync_type=sync.upper() if sync else None,
        reconfigurable=None if reconfigurable is None else reconfigurable.lower() == "true")


def _attribute(attributes: dict[str, Any], key: str) -> str | None:
    """Return an attribute as text (the tool writes numbers and booleans as strings). Raises MalformedAnswerError."""
    value = attributes.get(key)
    if value is None:
        return None
    if isinstance(value, bool):
        value = str(value).lower()
    elif isinstance(value, int) and 0 <= value < 10**9:
        value = str(value)
    if not isinstance(value, str) or len(value) > 64 or not value.isprintable():  # noqa: PLR2004
        msg = f"its IPUoF configuration's attribute {key!r} is {printable(repr(value), 60)}"
        raise MalformedAnswerError(msg)
    return value


def name_argument(name: str) -> str:
    """
    Return ``name`` as a word of a vipu command line: never one the tool could take for an option.

    Raises ProviderError for a name that starts with ``-`` (from a saved plan, or listed by the server).
    """
    if name.startswith("-"):
        msg = f"partition name '{printable(name, 60)}' starts with '-': the vipu tool would read it as an option"
        raise ProviderError(msg)
    return name


def create_argv(request: PartitionRequest) -> list[str]:
    """Return the words after ``vipu`` that create ``request``. Raises ProviderError (a name like an option)."""
    argv = ["create", "partition", name_argument(request.name), "--size", str(request.size), "--num-gcds", str(request.num_gcds)]
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
    text = printable(" ".join(output.split())) or f"vipu exited with status {status}"
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
        what = f"vipu {' '.join(words[:2])}"
        try:
            status, out, err = self._run(self.command(*words), self.timeout_s)
        except TimeoutError as exc:
            msg = f"{what}: no answer within {self.timeout_s:g} s"
            raise UnreachableError(msg) from exc
        except MalformedAnswerError as exc:
            msg = f"{what}: {exc.message}"
            raise MalformedAnswerError(msg) from exc
        except OSError as exc:
            msg = f"cannot run vipu: {exc.strerror or exc}"
            raise UnreachableError(msg) from exc
        if status != 0:
            raise error_of(status, err or out)
        return out

    def list(self) -> tuple[PartitionInfo, ...]:
        """Return every partition (``vipu list partitions``)."""
        try:
            return parse_partition_table(self._vipu("list", "partitions"))
        except MalformedAnswerError as exc:
            if exc.message.startswith("vipu "):
                raise
            msg = f"vipu list partitions: {exc.message}"
            raise MalformedAnswerError(msg) from exc

    def get(self, name: str) -> PartitionInfo | None:
        """Return the partition: its row of the list, completed by its IPUoF configuration."""
        info = next((i for i in self.list() if i.name == name), None)
        if info is None:
            return None
        word = name_argument(name)
        try:
            config = self._vipu("get", "partition", word, "--gcd", "0", "--ipuof-configs")
        except (UnreachableError, MalformedAnswerError):
            raise
        except ProviderError:
            config = ""
        if not config.strip():  # refused (an older tool) or silent: replicas, sync, reconfigurability unknown
            return info
        try:
            return parse_ipuof_config(info, config)
        except MalformedAnswerError as exc:
            msg = f"vipu get partition: {exc.message}"
            raise MalformedAnswerError(msg) from exc

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
        self._vipu("reset", "partition", name_argument(name))
        return self._must_get(name)

    def remove(self, name: str, *, owner: Owner | None = None) -> None:  # noqa: ARG002
        """Remove the partition (``vipu remove partition NAME``)."""
        self._vipu("remove", "partition", name_argument(name))

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
