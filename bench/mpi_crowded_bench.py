"""
MPI on a crowded host: poprun's mpirun backend against ``mpirun --oversubscribe``, measured in the same run.

Run: ``.venv/bin/python bench/mpi_crowded_bench.py [--runs N] [--instances K] [--barriers B]`` (after
installing the project with its test extras, which bring mpi4py, and Debian's ``openmpi-bin``).

K instances (default 4) of an mpi4py program that runs B barriers (default 2,000) on this
machine, which has fewer CPUs than K on the machines this project is tested on (say so when it
has not: the comparison is then not the one this bench is for). poprun gives mpirun ``-H
localhost:K``, a slot per instance, so OpenMPI does not see the host as oversubscribed and its
processes busy-poll, unless poprun asks them to yield (``--mca mpi_yield_when_idle 1``, which
``poprun plan --explain`` shows when a host has more instances than CPUs). Each figure is the
median of ``--runs`` runs, the two commands taking turns; the ratio poprun / mpirun is printed
with its target (at most 2.0x). Nothing asserts: the figures are for people.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PY = sys.executable
POPRUN = [str(Path(PY).with_name("poprun"))] if Path(PY).with_name("poprun").exists() else [PY, "-m",
                                                                                          "poprun.cli.main"]
if "POPRUN_RUNS_DIR" not in os.environ:  # the launches' run records go to a folder of the bench's, not the user's state
    os.environ["POPRUN_RUNS_DIR"] = tempfile.mkdtemp(prefix="poprun-bench-runs-")
ENV = os.environ | {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
PROGRAM = """\
import sys
from mpi4py import MPI
world = MPI.COMM_WORLD
for _ in range(int(sys.argv[1])):
    world.Barrier()
"""


def timed(argv: list[str], cwd: str) -> float:
    """Return the wall time of ``argv``, which must succeed."""
    started = time.perf_counter()
    subprocess.run(argv, cwd=cwd, env=ENV, check=True, stdout=subprocess.DEVNULL, timeout=600)
    return time.perf_counter() - started


def main() -> int:
    """Print the medians and their ratio."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--instances", type=int, default=4)
    parser.add_argument("--barriers", type=int, default=2000)
    args = parser.parse_args()
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        print("mpirun is not installed (apt-get install openmpi-bin)")
        return 1
    cpus = len(os.sched_getaffinity(0))
    if cpus >= args.instances:
        print(f"note: this machine has {cpus} CPUs for {args.instances} instances: not a crowded host")
    with tempfile.TemporaryDirectory() as folder:
        Path(folder, "barriers.py").write_text(PROGRAM)
        n, b = str(args.instances), str(args.barriers)
        ours = [*POPRUN, "--backend=mpirun", "--num-instances", n, "--num-replicas", n, PY, "barriers.py", b]
        theirs = [mpirun, "--allow-run-as-root", "--oversubscribe", "-np", n, PY, "barriers.py", b]
        times: dict[str, list[float]] = {"poprun --backend mpirun": [], "mpirun --oversubscribe": []}
        for _ in range(args.runs):
            times["poprun --backend mpirun"].append(timed(ours, folder))
            times["mpirun --oversubscribe"].append(timed(theirs, folder))
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, value in medians.items():
        print(f"{name:26} {value * 1000:8.0f} ms  ({args.instances} instances, {cpus} CPUs, {args.barriers} barriers)")
    ratio = medians["poprun --backend mpirun"] / medians["mpirun --oversubscribe"]
    print(f"ratio poprun / mpirun: {ratio:.2f}x (target: at most 2.0x) {'ok' if ratio <= 2.0 else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
