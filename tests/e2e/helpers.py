"""Helpers shared by the e2e tests: the plan the CLI makes in this process, and emulated hosts for a session."""

from __future__ import annotations

import functools
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from poprun.planner.context import Context
from poprun.planner.flags import parse_flags
from poprun.planner.plan import LaunchPlan
from poprun.planner.solve import solve
from tests.testhosts import TestHosts, TestHostsUnavailable, down, up


@functools.cache
def plan_of(*argv: str) -> LaunchPlan:
    """Return the plan the CLI makes of ``poprun ARGV`` in this process."""
    ctx = Context.from_process()
    return solve(parse_flags(list(argv), environ=ctx.environ).spec, ctx).plan


def session_hosts(state: Path, count: int, *, slurm: bool = False, what: str, decoy: bool = False) -> Iterator[TestHosts]:
    """
    Yield ``count`` emulated hosts (with a Slurm cluster when ``slurm``; a decoy interface each when ``decoy``), taken down after.

    Skips where the machine cannot host them (not root, a tool missing), except under
    ``POPRUN_CI=1``: CI installs what they need, so there a skip would hide a broken install
    and ``what`` fails instead.
    """
    try:
        hosts = up(count, state, slurm=slurm, decoy=decoy)
    except TestHostsUnavailable as exc:
        if os.environ.get("POPRUN_CI"):
            pytest.fail(f"CI must run {what}: {exc}")
        pytest.skip(str(exc))
    try:
        yield hosts
    finally:
        down(state)
