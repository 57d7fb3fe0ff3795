"""
The partition step of a launch and of a plan: when poprun deals with V-IPU, and how.

Layer: ``poprun.apply``; imports ``poprun.partitions`` lazily (nothing of it is loaded by a launch
without a partition step), and the settings table (``poprun.planner.setting``).

A plan that is not offline describes a partition (seed section 2.8). poprun acts on it when a
V-IPU service is there to act on: when ``POPRUN_PARTITION_PROVIDER`` names a provider (``none``:
never), when the
``vipu`` tool is on PATH, or when the plan names a partition, an allocation or a server (a flag,
``IPUOF_VIPU_API_*`` or the local vipu configuration). Without any of these (a machine with no
IPUs and nothing configured) the instances run without a partition step, as they always have
with the local backend. When it acts: before the backend starts anything, the partition is
acquired (:func:`poprun.partitions.actions.acquire`: used, created, updated or reset by the
seed's rules, verified, leased to this launch), its variables are added to every instance, and
at exit, on every path, it is released and what poprun created is removed.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Mapping

from poprun.core.diagnostic import Diagnostic
from poprun.core.events import Event, PartitionAcquired, PartitionAcquiring, PartitionReleased
from poprun.core.record import evolve
from poprun.planner.plan import LaunchPlan
from poprun.planner.setting import setting_value

PROVIDER = "POPRUN_PARTITION_PROVIDER"
_DEFAULT_SERVER = ("localhost", 8090)


def wanted(plan: LaunchPlan, environ: Mapping[str, str]) -> bool:
    """Return whether the launch of ``plan`` has a partition step (see the module docstring)."""
    partition = plan.partition
    if partition is None or plan.offline:
        return False
    if given := setting_value(PROVIDER, environ):
        return given != "none"
    from poprun.process.files import which

    if which("vipu", environ.get("PATH", os.defpath)) is not None:
        return True
    return (partition.name is not None or partition.allocation is not None
            or (partition.server_host, partition.server_port) != _DEFAULT_SERVER)


@contextlib.contextmanager
def acquired(plan: LaunchPlan, environ: Mapping[str, str], warnings: list[Diagnostic], *,
             emit: Callable[[Event], None]) -> Iterator[Mapping[str, str]]:
    """
    Yield the variables of ``plan``'s partition, acquired for this launch; release it after.

    Yields no variables when the launch has no partition step (:func:`wanted`). ``emit`` hears
    that the partition is being acquired, is acquired and is released; what releasing it warns
    about is added to ``warnings``.

    Raises:
        DiagnosticError: PR500-PR507, PR509 or PR510, when the partition cannot be had (nothing is left behind).
    """
    if not wanted(plan, environ):
        yield {}
        return
    assert plan.partition is not None
    from poprun.partitions.actions import acquire, connect

    name = plan.partition.name
    emit(PartitionAcquiring(partition=name))
    lease = acquire(plan.partition, connect(plan.partition, environ), owner="poprun")
    try:
        with lease:
            emit(PartitionAcquired(partition=name))
            yield lease.env
    finally:  # released by the lease on every path
        warnings.extend(lease.warnings)
        emit(PartitionReleased(partition=name))


def planned(plan: LaunchPlan, environ: Mapping[str, str]) -> tuple[LaunchPlan, tuple[Diagnostic, ...]]:
    """
    Return ``plan`` with its partition actions as the server's partitions decide them, and what to warn about.

    A bounded look (0.5 s): with the server unreachable the actions are marked as decided at
    apply time, with a warning (PR502); a decision that would fail at apply is shown as its error.
    """
    if not wanted(plan, environ):
        return plan, ()
    assert plan.partition is not None
    from poprun.partitions.actions import plan_actions, probe

    actions, diagnostics = plan_actions(plan.partition, probe(plan.partition, environ))
    return evolve(plan, partition=evolve(plan.partition, actions=actions)), tuple(diagnostics)
