"""
Runs you can come back to: the record of every launch, kept without a daemon.

Layer: ``poprun.runs``, beside ``poprun.render``, ``poprun.backends`` and ``poprun.partitions``;
imports ``poprun.planner.plan`` and ``poprun.core``, never ``poprun.render`` or ``poprun.cli``.
:mod:`~poprun.runs.record` writes a run's directory as it happens (the apply step feeds it),
:mod:`~poprun.runs.store` finds and reads runs. The layout is in ``docs/runs.md``.

The names below are the library over run records (:mod:`~poprun.runs.api`: ``from poprun.runs
import locate, stop``): they return values and print nothing; ``poprun ps``, ``logs``,
``report``, ``stop`` and ``attach`` are these and the views of :mod:`poprun.render.runs`. They are
loaded on first use (PEP 562), so that the record a launch writes costs nothing more.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from poprun.runs.api import (
        Piece,
        Run,
        RunReport,
        RunStateError,
        StopResult,
        attach,
        check_attempt,
        check_instance,
        ended_with,
        follow,
        info,
        list_runs,
        locate,
        read_report,
        report_json,
        require_running,
        stop,
    )

__all__ = [
    "Piece",
    "Run",
    "RunReport",
    "RunStateError",
    "StopResult",
    "attach",
    "check_attempt",
    "check_instance",
    "ended_with",
    "follow",
    "info",
    "list_runs",
    "locate",
    "read_report",
    "report_json",
    "require_running",
    "stop",
]


def __getattr__(name: str) -> object:
    if name not in __all__:
        raise AttributeError(f"module 'poprun.runs' has no attribute {name!r}")
    from poprun.runs import api

    return getattr(api, name)
