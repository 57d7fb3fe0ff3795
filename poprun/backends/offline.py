"""
The ``offline`` backend: every instance runs on this machine, whatever host it was planned for.

Layer: ``poprun.backends``; imports :mod:`poprun.backends.local` and ``poprun.planner.plan``.
With no devices and no partition, a multi-host or multi-ILD plan can be tried on a laptop:
the instances get exactly the plan's argv, cwd and environment, as with ``local``.
"""

from __future__ import annotations

from collections.abc import Mapping

from poprun.backends.local import LocalBackend
from poprun.planner.plan import LaunchPlan

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from typing import ClassVar


class OfflineBackend(LocalBackend):
    """The local backend without its host check: a host name in the plan is only a label here."""

    name: ClassVar[str] = "offline"
    skip_foreign_bindings: ClassVar[bool] = True  # bindings planned for CPUs this machine lacks are left out

    def check_hosts(self, plan: LaunchPlan) -> None:
        """Accept every host: offline, all instances run on this machine."""

    def run_on_host(self, host: str, script: str, *, environ: Mapping[str, str],  # noqa: ARG002 - every host is here
                    timeout_s: float) -> tuple[int, bytes]:
        """Run ``script`` with ``/bin/sh -s`` here, whatever ``host`` is: offline, every host's commands run here."""
        from poprun.process.hostscript import run_here

        return run_here(script, environ=environ, timeout_s=timeout_s)
