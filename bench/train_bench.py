"""
Training throughput: samples per second of ``examples/train_digits.py`` on 1, 2 and 4 instances.

Run: ``.venv/bin/python bench/train_bench.py [--runs N] [--steps S]`` (torch and scikit-learn
installed, as the ``test`` extra does). Each launch goes through the real CLI with one replica
per instance and the same global batch, offline (collectives over gloo) and, where ``mpirun``
is on PATH, through the mpirun backend (collectives over MPI). The figure is the median of
``--runs`` launches of instance 0's own measure: global-batch items per second over every step
after the first, which leaves out start-up (importing PyTorch) and PyTorch's lazy set-up. The
scaling ratio is that over the 1-instance figure; perfect data-parallel scaling would be N.
Nothing asserts: the figures are for people. On a machine with fewer cores than instances
(this project's CI has 2) the instances share the cores, so the ratio mostly shows the cost of
the collectives, not a speed-up.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))
from tests.ports import free_port_pair

if "POPRUN_RUNS_DIR" not in os.environ:  # the launches' run records go to a folder of the bench's, not the user's state
    os.environ["POPRUN_RUNS_DIR"] = tempfile.mkdtemp(prefix="poprun-bench-runs-")

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ROOT / "examples" / "train_digits.py"
SIZES = (1, 2, 4)


def launch(n: int, backend: list[str], args: argparse.Namespace) -> dict[str, object]:
    """Train on ``n`` instances with the given backend options; return instance 0's summary."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("POPDIST_", "MASTER_", "OMPI_"))}
    environ["MASTER_PORT"] = str(free_port_pair())
    command = [sys.executable, "-m", "poprun.cli.main", f"--num-instances={n}", f"--num-replicas={n}", *backend,
               sys.executable, str(TRAIN), "--steps", str(args.steps), "--hidden", str(args.hidden),
               "--global-batch-size", str(args.global_batch_size)]
    done = subprocess.run(command, cwd=ROOT, env=environ, capture_output=True, text=True, timeout=600, check=False)
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr}")
    result: dict[str, object] = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("{")))
    return result


def measure(name: str, backend: list[str], args: argparse.Namespace) -> None:
    """Print samples per second and the scaling ratio for each size, under one backend."""
    print(f"\n{name}: global batch {args.global_batch_size}, hidden {args.hidden}, {args.steps} steps, "
          f"median of {args.runs}")
    print(f"{'instances':>9}  {'collectives':>11}  {'samples/s':>10}  {'ratio to 1':>10}  {'efficiency':>10}")
    base = None
    for n in SIZES:
        results = [launch(n, backend, args) for _ in range(args.runs)]
        rate = statistics.median(float(str(r["samples_per_s"])) for r in results)
        base = base or rate
        print(f"{n:>9}  {results[0]['collectives']!s:>11}  {rate:>10.0f}  {rate / base:>10.2f}  "
              f"{rate / base / n:>10.2f}")


def main() -> None:
    """Measure offline (gloo), then under mpirun (MPI) where it exists."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--global-batch-size", type=int, default=256)
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPU cores; torch threads per instance: cores // instances on the host")
    measure("offline backend", ["--offline-mode=1"], args)
    if shutil.which("mpirun"):
        root = ["--allow-run-as-root=yes"] if os.geteuid() == 0 else []
        measure("mpirun backend", ["--backend=mpirun", *root], args)
    else:
        print("\nmpirun backend: skipped, mpirun is not on PATH")


if __name__ == "__main__":
    main()
