"""
The ``offline`` backend: every instance runs on this machine, whatever host it was planned for.

Layer: ``poprun.backends``; imports :mod:`poprun.backends.local` and ``poprun.planner.plan``.
With no devices and no partition, a multi-host or multi-ILD plan can be tried on a laptop:
the instances get exactly the plan's argv, cwd and environment, as with ``local``.
"""

from __future__ import annotations

import os

from poprun.backends.local import LocalBackend
from poprun.planner.machine import parse_cpulist
from poprun.planner.plan import LaunchPlan

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from typing import ClassVar


class OfflineBackend(LocalBackend):
    """The local backend without its host check: a host name in the plan is only a label here."""

    name: ClassVar[str] = "offline"

    def check_hosts(self, plan: LaunchPlan) -> None:
        """Accept every host: offline, all instances run on this machine."""

    def cpu_masks(self, plan: LaunchPlan) -> list[set[int] | None]:
        """Return the planned bindings that this machine can honour; others (planned for other hosts) are left out."""
        allowed = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        masks: list[set[int] | None] = []
        for instance in plan.instances:
            cpus = set(parse_cpulist(instance.placement.cpus)) if instance.placement.cpus else None
            masks.append(cpus if cpus is not None and (allowed is None or cpus <= allowed) else None)
        return masks
