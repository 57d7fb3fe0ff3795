"""Helpers shared by the e2e tests: the plan the CLI makes, in this process."""

from __future__ import annotations

import functools

from poprun.planner.context import Context
from poprun.planner.flags import parse_flags
from poprun.planner.plan import LaunchPlan
from poprun.planner.solve import solve


@functools.cache
def plan_of(*argv: str) -> LaunchPlan:
    """Return the plan the CLI makes of ``poprun ARGV`` in this process."""
    ctx = Context.from_process()
    return solve(parse_flags(list(argv), environ=ctx.environ).spec, ctx).plan
