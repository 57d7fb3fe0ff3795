"""A plan of instances that hang in a known function (``hang_here``), for the stacks tests here and on hosts."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from poprun.backends.conformance import MemorySink, probe_plan
from poprun.core.record import evolve
from poprun.planner.plan import LaunchPlan

# Instance 1 also renames itself (its /proc comm) to text that would forge records if it were parsed as text.
HANG = """\
import ctypes, os, sys, time
if os.environ.get("POPDIST_INSTANCE_INDEX") == "1":
    ctypes.CDLL(None).prctl(15, b"x\\nproc 9 0 $(id)", 0, 0, 0)
def hang_here():
    print("ready", flush=True)
    time.sleep(600)
hang_here()
"""


def hang_plan(workdir: Path, *, backend: str, hosts: tuple[str, ...], run_id: str, instances: int = 2,
              python: str = sys.executable, extra: tuple[tuple[str, str], ...] = (),
              environ: dict[str, str] | None = None) -> LaunchPlan:
    """
    Return a plan of ``instances`` instances of ``python -c HANG`` with POPRUN_RUN_ID=``run_id`` (and ``extra``) set.

    ``environ``: the environment whose settings the plan records (the test hosts' ssh_config).
    """
    plan = probe_plan(HANG, workdir, backend=backend, instances=instances, hosts=hosts, environ=environ)
    return evolve(plan, instances=tuple(
        evolve(i, argv=(python, "-c", HANG), env=evolve(i.env, set=(*i.env.set, ("POPRUN_RUN_ID", run_id), *extra)))
        for i in plan.instances))


def wait_ready(sink: MemorySink, count: int, *, word: str = "ready", within_s: float = 30) -> None:
    """Wait until ``count`` instances have printed the line ``word``."""
    deadline = time.monotonic() + within_s
    while sink.lines().count(word) < count:
        assert time.monotonic() < deadline, sink.written
        time.sleep(0.02)
