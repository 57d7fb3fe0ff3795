"""
The partition diagnostics, ``PR500``-``PR510``: one function per code, with the seed's advice.

Layer: ``poprun.partitions``; imports ``poprun.core`` and :mod:`poprun.partitions.provider`.

Apply-time partition problems are operational (design: Terraform's sourceless rule), so their
spans name the V-IPU server or the partition rather than a flag: the plan's partition section
does not keep where each value was written.
"""

from __future__ import annotations

from collections.abc import Sequence

from poprun.core.diagnostic import Diagnostic, error, warning
from poprun.core.span import SourceSpan
from poprun.partitions.provider import PartitionInfo


def _server(address: str) -> SourceSpan:
    return SourceSpan.environment(f"V-IPU server {address}")


def _partition(name: str) -> SourceSpan:
    return SourceSpan.environment(f"partition {name}")


def plural(count: int, noun: str) -> str:
    """Return ``count noun`` with an s when the count is not one."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def describe(info: PartitionInfo) -> str:
    """Return a partition in a few words: ``p64 (64 IPUs, 1 GCD, PS_ACTIVE)``."""
    return f"{info.name} ({plural(info.size, 'IPU')}, {plural(info.num_gcds, 'GCD')}, {info.state.value})"


_UNNAMED = "(the only one)"  # the name actions.choose_name reports when none was given
# Unnamed, poprun can only use a partition: --update-partition=yes creates none, so it must be named.
_UNNAMED_HINT = ("name the partition with --vipu-partition NAME; with --update-partition=yes poprun creates it (and "
                 "removes it at exit), or create it first with 'vipu create partition NAME --size IPUS' (seed 2.10.1)")


def not_found(name: str, existing: Sequence[PartitionInfo], address: str) -> Diagnostic:
    """PR500: the named partition does not exist; list those that do."""
    have = "; it has " + ", ".join(describe(i) for i in existing) if existing else "; it has no partitions"
    return error("PR500", f"partition '{name}' not found",
                 detail=f"the V-IPU server at {address} has no partition '{name}'{have}",
                 span=_partition(name),
                 hint=_UNNAMED_HINT if name == _UNNAMED else
                 f"name an existing partition with --vipu-partition, or let poprun create '{name}' with "
                 "--update-partition=yes (list them with 'vipu list partitions'; seed 2.10.1)")


def unreachable(address: str, timeout_s: float, message: str) -> Diagnostic:
    """PR501: the V-IPU server cannot be contacted at apply time."""
    return error("PR501", "V-IPU server unreachable",
                 detail=f"cannot reach the V-IPU server at {address} (timeout {timeout_s:g} s): {message}",
                 span=_server(address),
                 hint="check --vipu-server-host and --vipu-server-port (or IPUOF_VIPU_API_HOST and "
                      "IPUOF_VIPU_API_PORT) and that the server runs ('vipu list partitions'; on its host "
                      "'systemctl status vipu-server'); a slow server needs a larger --vipu-server-timeout "
                      "(seed 2.10.1)")


def unreachable_at_planning(address: str, timeout_s: float, message: str) -> Diagnostic:
    """PR502: the V-IPU server did not answer the planning probe; actions are left to apply time."""
    return warning("PR502", "V-IPU server unreachable while planning",
                   detail=f"no answer from the V-IPU server at {address} within {timeout_s:g} s ({message}); "
                          "the partition actions are decided at apply time",
                   span=_server(address),
                   hint="start the server or check its address (--vipu-server-host, --vipu-server-port); "
                        "apply checks the partition again and stops if the server is still unreachable")


def several(existing: Sequence[PartitionInfo], address: str) -> Diagnostic:
    """PR503: no partition named and the allocation has several (or none to pick)."""
    return error("PR503", "several partitions, none named",
                 detail=f"the V-IPU server at {address} has {len(existing)} partitions: "
                        + ", ".join(describe(i) for i in existing),
                 span=_server(address),
                 hint="name the one to use with --vipu-partition (or IPUOF_VIPU_API_PARTITION_ID); without a "
                      "name poprun uses the only partition of the allocation (seed 2.8.3)")


def mismatch(name: str, differences: Sequence[str]) -> Diagnostic:
    """PR504: the existing partition does not meet the launch and may not be updated."""
    return error("PR504", f"partition '{name}' does not match the launch",
                 detail="; ".join(differences),
                 span=_partition(name),
                 hint=f"let poprun remove '{name}' and create it again to fit with --update-partition=yes, or "
                      "change the launch to fit the partition (seed 2.10.1)")


def capacity(name: str, size: int, address: str, message: str) -> Diagnostic:
    """PR505: the allocation has not enough free IPUs to create the partition."""
    return error("PR505", "not enough IPUs in the allocation",
                 detail=f"the V-IPU server at {address} cannot make partition '{name}' of "
                        f"{plural(size, 'IPU')}: {message}",
                 span=_partition(name),
                 hint="remove partitions that are no longer needed ('vipu list partitions', 'vipu remove "
                      "partition NAME'), or ask for fewer IPUs (seed 2.10.1)")


def in_use(name: str, holder: str) -> Diagnostic:
    """PR506: another launch leases the partition."""
    return error("PR506", f"partition '{name}' is in use",
                 detail=f"its devices are leased by another launch ({holder})",
                 span=_partition(name),
                 hint="wait for that launch to end or use another partition: IPUs cannot be shared by "
                      "different programs (seed 2.10.2); a lease of a launch that died expires by itself")


def not_active(name: str, state: str, step: str, attempts: int) -> Diagnostic:
    """PR507: after create or reset (or as found) the partition is not PS_ACTIVE."""
    return error("PR507", f"partition '{name}' is not active",
                 detail=f"after {step} it is in state {state}, not PS_ACTIVE ({plural(attempts, 'attempt')})",
                 span=_partition(name),
                 hint=f"reset it with 'vipu reset partition {name}' or --reset-partition=yes, or allow more "
                      "attempts with --vipu-partition-attempts; if it stays in error, an agent of the "
                      "partition may be faulty (seed 2.10.2)")


def not_released(name: str, step: str, message: str) -> Diagnostic:
    """PR508: the lease could not be released, or the partition poprun made could not be removed, at exit."""
    return warning("PR508", f"partition '{name}' not released at exit",
                   detail=f"could not {step}: {message}",
                   span=_partition(name),
                   hint=f"its lease expires by itself; if poprun created it, remove it with 'vipu remove "
                        f"partition {name}' once the server answers")


def request_failed(step: str, address: str, message: str) -> Diagnostic:
    """PR509: the V-IPU server refused a request for another reason."""
    return error("PR509", "V-IPU request failed",
                 detail=f"{step} at {address}: {message}",
                 span=_server(address),
                 hint="compare the request with 'vipu list partitions' and the V-IPU server's log; the "
                      "partition flags (--num-ilds, --sync-type, routing types) must be ones the server accepts")


def malformed(address: str, message: str) -> Diagnostic:
    """PR510: the V-IPU server (or the ``vipu`` tool) answered, but not with a V-IPU answer."""
    return error("PR510", "V-IPU answer not understood",
                 detail=f"the V-IPU server at {address} answered, but not as a V-IPU server does: {message}",
                 span=_server(address),
                 hint="check that --vipu-server-host and --vipu-server-port (or IPUOF_VIPU_API_HOST and "
                      "IPUOF_VIPU_API_PORT) name the V-IPU server itself, not a proxy or another service, and "
                      "that the 'vipu' on PATH is Graphcore's tool; the server's log may say more")
