"""
Planning speed: a 256-host, 1024-instance, 4096-replica spec, the CLI's start-up, planning at scale.

Run: ``python bench/plan_bench.py`` (after installing the project). Prints the median times,
the targets of the plan compiler, and ratios against peers measured in the same run:
``python3 -c pass`` (the interpreter's floor) and OpenMPI's ``mpirun --version`` when
installed. Then, at scale:

- ``poprun plan --format json`` for 256, 1,024 and 4,096 hosts (one instance and four replicas
  per host), end to end: the median wall time, the peak memory of the process (its maximum
  resident set) and how each grows from one count to the next against the count's growth.
  Targets: 4,096 hosts under 1 s, growth at most linear.
- the classic launch path: ``poprun --num-instances N --num-replicas N true`` (local backend),
  with the share of its start that is planning. Planning is the record's ``plan`` phase (from
  the command's start, after the interpreter and poprun's first imports, to the launch, read from
  the run record's ``report.json``); the start is the wall time from running poprun to the
  moment the last instance started (each prints the time). The target, planning under 10% of
  the start, is for launches on hosts (``bench/ssh_bench.py`` prints that share); here, where the
  whole start is about three interpreter start-ups, the share is printed for reference.

Nothing here asserts: figures are for people and the issue's closing note.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchsetup import compile_bytecode

from poprun.planner.context import Context
from poprun.planner.flags import parse_flags
from poprun.planner.serde import to_json
from poprun.planner.solve import solve

SCALE = (256, 1024, 4096)  # hosts planned at scale (one instance and four replicas each)
SCALE_TARGET_S = 1.0  # 4,096 hosts
PLAN_SHARE_TARGET = 0.10  # of a classic launch's start
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
    print(compile_bytecode())
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
    print()
    _scale(poprun)
    print()
    _plan_share(poprun)


def measured(argv: list[str], *, env: dict[str, str] | None = None) -> tuple[float, int]:
    """Run ``argv`` (its output discarded); return its wall time in seconds and its peak resident memory in bytes."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    took = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(argv[:4])} ... failed with {proc.returncode}")
    return took, usage.ru_maxrss * 1024  # ru_maxrss is in KiB on Linux


def _scale(poprun: str, runs: int = 5) -> None:
    """Print ``poprun plan --format json`` at each count of :data:`SCALE` hosts: time, memory, growth."""
    print("poprun plan --format json at scale (one instance, four replicas per host), end to end:")
    figures = {}
    for hosts in SCALE:
        argv = [poprun, "plan", "--format", "json", f"--host=pod[1-{hosts}]", f"--num-instances={hosts}",
                f"--num-replicas={4 * hosts}", "python3", "train.py"]
        samples = [measured(argv) for _ in range(runs)]
        figures[hosts] = (statistics.median(t for t, _ in samples), max(m for _, m in samples))
        seconds, peak = figures[hosts]
        verdict = ""
        if hosts == SCALE[-1]:
            verdict = f"  target < {SCALE_TARGET_S:g} s: {'ok' if seconds < SCALE_TARGET_S else 'MISSED'}"
        print(f"  {hosts:>5} hosts / {4 * hosts:>6} replicas {seconds * 1000:8.1f} ms {peak / 2**20:7.1f} MiB peak"
              f"{verdict}")
    for low, high in itertools.pairwise(SCALE):
        grows = high / low
        (t_low, m_low), (t_high, m_high) = figures[low], figures[high]
        words = "linear or better" if t_high / t_low <= grows and m_high / m_low <= grows else "WORSE than linear"
        print(f"  growth {low}->{high} hosts ({grows:.0f}x): time {t_high / t_low:.2f}x, memory {m_high / m_low:.2f}x"
              f" ({words})")


def _plan_share(poprun: str, runs: int = 9) -> None:
    """Print the share of a classic launch's start that is planning (local backend), read from its run records."""
    print("classic launch path (local backend), planning's share of the start (medians):")
    for instances in (1, 8):
        with tempfile.TemporaryDirectory(prefix="poprun-plan-bench-") as runs_dir:
            env = os.environ | {"POPRUN_RUNS_DIR": runs_dir}
            argv = [poprun, f"--num-instances={instances}", f"--num-replicas={instances}", "sh", "-c", "date +%s.%N"]
            starts = []
            for _ in range(runs):
                began = time.time()
                out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout
                starts.append(max(float(line) for line in out.split()) - began)  # the last instance's start
            phases = [json.loads(path.read_text())["phases"] for path in Path(runs_dir).glob("*/report.json")]
        if len(phases) != runs:
            sys.exit(f"expected {runs} run records, found {len(phases)}")
        plan, start = statistics.median(p["plan"] for p in phases), statistics.median(starts)
        share = plan / start
        print(f"  {instances} instance(s): planning {plan * 1000:6.1f} ms of a {start * 1000:6.1f} ms start = "
              f"{share:.0%} (for reference: the {PLAN_SHARE_TARGET:.0%} target is for launches on hosts, ssh_bench.py)")


if __name__ == "__main__":
    main()
