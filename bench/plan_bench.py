"""
Planning speed: a 256-host, 1024-instance, 4096-replica spec, and the CLI's start-up.

Run: ``python bench/plan_bench.py`` (after installing the project). Prints the median times,
the targets of the plan compiler, and ratios against peers measured in the same run:
``python3 -c pass`` (the interpreter's floor) and OpenMPI's ``mpirun --version`` when
installed. Nothing here asserts: figures are for people and the issue's closing note.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

from poprun.planner.context import Context
from poprun.planner.flags import parse_flags
from poprun.planner.serde import to_json
from poprun.planner.solve import solve

ARGV = ["--host=pod[1-256]", "--num-instances=1024", "--num-replicas=4096", "--num-ilds=64",
        "--mpi-local-args=-x PYTHONPATH -x A=1", "python3", "train.py"]


def median_s(fn: Callable[[], object], runs: int) -> float:
    """Return the median wall time of ``fn`` over ``runs`` runs, in seconds."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def command_s(argv: list[str], runs: int = 7) -> float:
    """Return the median wall time of a command, in seconds."""
    return median_s(lambda: subprocess.run(argv, check=True, stdout=subprocess.DEVNULL), runs)


def main() -> None:
    ctx = Context(environ={"PATH": "/usr/bin"}, cwd="/work")
    in_process = median_s(lambda: solve(parse_flags(ARGV).spec, ctx), 15)
    with_json = median_s(lambda: to_json(solve(parse_flags(ARGV).spec, ctx).plan), 7)
    poprun = shutil.which("poprun") or sys.exit("poprun is not on PATH: install the project first")
    plan_cli = command_s([poprun, "plan", "--format", "json", *ARGV])
    version = command_s([poprun, "--version"])
    floor = command_s([sys.executable, "-c", "pass"])
    rows = [
        ("plan 256 hosts/1024 instances/4096 replicas, in-process", in_process, 0.050),
        ("  ... and its JSON", with_json, None),
        ("poprun plan --format json (same spec), end to end", plan_cli, 0.400),
        ("poprun --version", version, 0.150),
        ("python3 -c pass (interpreter floor)", floor, None),
    ]
    mpirun = shutil.which("mpirun")
    if mpirun:
        rows.append(("mpirun --version (OpenMPI)", command_s([mpirun, "--version"]), None))
    for name, seconds, target in rows:
        verdict = "" if target is None else f"  target < {target * 1000:.0f} ms: {'ok' if seconds < target else 'MISSED'}"
        print(f"{name:<60} {seconds * 1000:8.1f} ms{verdict}")
    print(f"ratio poprun --version / python3 -c pass: {version / floor:.2f}")
    if mpirun:
        print(f"ratio poprun --version / mpirun --version: {version / rows[-1][1]:.2f}")
    else:
        print("mpirun not installed: no OpenMPI ratio (apt-get install openmpi-bin)")


if __name__ == "__main__":
    main()
