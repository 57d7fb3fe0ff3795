"""
A saved plan's notifier and metrics file (``$.observe``) checked as untrusted input.

Layer: ``poprun.planner``; imports ``poprun.core`` and the limits of
:mod:`poprun.planner.observe`; imported by :mod:`poprun.planner.plancheck` only for a plan that
has a notifier or a metrics file, so that a plan without them never loads these modules.

The rules are those :func:`poprun.planner.observe.observe` keeps: the command is bounded and
holds no NUL (it travels in an environment variable); the kinds are known ones, each once, in
their order, at least one; the timeout is from 1 ms to an hour; the metrics path is "" or an
absolute, normalised path of a file, without NUL. Whether a file can be kept there is the
apply step's check at launch (it may differ from the planning machine's). Each broken rule is
reported through ``fail(path, detail)`` (PR114).
"""

from __future__ import annotations

import os

from poprun.planner.observe import KINDS, MAX_COMMAND, MAX_TIMEOUT_S

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from collections.abc import Callable

    from poprun.planner import plan as p

__all__ = ["check_observe"]

WHERE = "$.observe"
MAX_PATH = 4096  # PATH_MAX


def check_observe(plan: p.LaunchPlan, fail: Callable[[str, str], None]) -> None:
    """Call ``fail(path, detail)`` for each broken rule of ``plan.observe``."""
    o = plan.observe
    if len(o.notify) > MAX_COMMAND:
        fail(f"{WHERE}.notify", f"is a command of {len(o.notify)} characters (at most {MAX_COMMAND})")
    if "\0" in o.notify:
        fail(f"{WHERE}.notify", "holds a NUL character")
    unknown = [k for k in o.notify_on if k not in KINDS]
    if unknown:
        fail(f"{WHERE}.notify_on", f"names {unknown[0][:40]!r}, not one of {', '.join(KINDS)}")
    elif not o.notify_on or tuple(k for k in KINDS if k in o.notify_on) != o.notify_on:
        fail(f"{WHERE}.notify_on", "must name one or more kinds, each once, in the order " + ", ".join(KINDS))
    if not 0 < o.notify_timeout_ms <= MAX_TIMEOUT_S * 1000:
        fail(f"{WHERE}.notify_timeout_ms", f"is {o.notify_timeout_ms}; it must be from 1 to {MAX_TIMEOUT_S * 1000}")
    path = o.metrics_file
    if path and ("\0" in path or len(path) > MAX_PATH or not os.path.isabs(path) or os.path.normpath(path) != path
                 or os.path.basename(path) in ("", ".", "..")):
        shown = path if len(path) <= 80 else path[:77] + "..."  # noqa: PLR2004
        fail(f"{WHERE}.metrics_file", f"is {shown!r}: it must be an absolute, normalised path of a file, or empty")
