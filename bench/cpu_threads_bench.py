"""
A CPU training step under poprun and under torchrun, side by side: the threads each instance gets.

Run: ``.venv/bin/python bench/cpu_threads_bench.py [--runs N] [--steps S] [--hidden H]`` (torch
installed, as the ``test`` extra does).

K instances (1, then 2) on this machine each train the same small MLP (forward, backward, SGD
step on a fixed batch, no collectives: the figure is the CPU step alone), launched by
``poprun --num-instances K`` and by ``torchrun --nproc-per-node K``, taking turns. Each figure is
the median over ``--runs`` launches of the mean step time over every instance, after two warm-up
steps; the ratio is poprun / torchrun (1.00 is parity; below is faster). The third column is
poprun before it decided the threads: the plan's ``OMP_NUM_THREADS`` replaced by the thread
count torch's bundled oneMKL picks once ``OMPI_COMM_WORLD_LOCAL_SIZE`` is set, which is what
poprun's instances ran with (``MKL_DYNAMIC=TRUE``, oneMKL's default, and no ``OMP_NUM_THREADS``).
Each line also prints the threads torch reported in the instances. Nothing asserts: the figures
are for people.

Measured once on a quiet 16-core host (torch 2.11, the same MLP, the median step; the
environments poprun and torchrun give, run by hand): one instance, 11.2 ms under torchrun, 53 ms
with ``OMPI_COMM_WORLD_LOCAL_SIZE=1`` alone (one thread: poprun before), 11.4 ms with the plan's
``OMP_NUM_THREADS=16`` and 11.8 ms with ``MKL_DYNAMIC=FALSE`` alone (an unknown host); two
instances on 8 cores each, 45-50 ms under torchrun (``OMP_NUM_THREADS=1``), 47-52 ms before,
12.5-20 ms with the plan's ``OMP_NUM_THREADS=8``. On a loaded 2-core machine the figures mostly
show the load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))
from tests.ports import free_port_pair

if "POPRUN_RUNS_DIR" not in os.environ:  # the launches' run records go to a folder of the bench's, not the user's state
    os.environ["POPRUN_RUNS_DIR"] = tempfile.mkdtemp(prefix="poprun-bench-runs-")

PY = sys.executable
POPRUN = [PY, "-m", "poprun.cli.main"]
TORCHRUN = [PY, "-m", "torch.distributed.run"]
PROGRAM = """\
import json, os, sys, time
import torch

steps, hidden = int(sys.argv[1]), int(sys.argv[2])
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(hidden, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                            torch.nn.ReLU(), torch.nn.Linear(hidden, 10))
optimiser = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(512, hidden), torch.randint(0, 10, (512,))
times = []
for step in range(steps + 2):
    began = time.perf_counter()
    optimiser.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    optimiser.step()
    if step >= 2:
        times.append(time.perf_counter() - began)
print(json.dumps({"step_ms": 1000 * sum(times) / len(times), "threads": torch.get_num_threads()}), flush=True)
"""


def launch(command: list[str], program: str, args: argparse.Namespace) -> tuple[float, list[int]]:
    """Run ``command`` PROGRAM; return the mean step time over its instances (ms) and their thread counts."""
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith(("POPDIST_", "MASTER_", "OMPI_", "OMP_", "MKL_", "POPRUN_"))}
    environ |= {"MASTER_PORT": str(free_port_pair()), "POPRUN_RECORD": "0"}
    runner = [] if command[:3] == TORCHRUN else [PY]  # torchrun runs a script with its own Python
    done = subprocess.run([*command, *runner, program, str(args.steps), str(args.hidden)], env=environ,
                          capture_output=True, text=True, timeout=600, check=False)
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr}")
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    return statistics.mean(line["step_ms"] for line in lines), sorted(line["threads"] for line in lines)


def main() -> None:
    """Print, for 1 and 2 instances, the step time under poprun, torchrun and poprun as it was, and the ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--hidden", type=int, default=1024)
    args = parser.parse_args()
    cpus = len(os.sched_getaffinity(0))
    print(f"{cpus} CPUs for this process; MLP {args.hidden} wide, batch 512, {args.steps} steps, median of {args.runs}")
    print(f"{'instances':>9}  {'poprun ms':>9}  {'torchrun ms':>11}  {'as before ms':>12}  {'ratio':>5}  "
          f"{'before/torchrun':>15}  threads (poprun; torchrun; before)")
    with tempfile.TemporaryDirectory() as folder:
        program = str(Path(folder, "step.py"))
        Path(program).write_text(PROGRAM, encoding="utf-8")
        for k in (1, 2):
            replicas = ["--num-instances", str(k), "--num-replicas", str(2 * k)]
            before = [*POPRUN, *replicas, "--mpi-local-args=-x OMP_NUM_THREADS -x MKL_DYNAMIC=TRUE"]
            commands = {"poprun": [*POPRUN, *replicas], "torchrun": [*TORCHRUN, f"--nproc-per-node={k}"],
                        "before": before}
            found: dict[str, list[float]] = {name: [] for name in commands}
            threads: dict[str, list[int]] = {}
            for _ in range(args.runs):
                for name, command in commands.items():
                    ms, threads[name] = launch(command, program, args)
                    found[name].append(ms)
            ms = {name: statistics.median(values) for name, values in found.items()}
            print(f"{k:>9}  {ms['poprun']:>9.1f}  {ms['torchrun']:>11.1f}  {ms['before']:>12.1f}  "
                  f"{ms['poprun'] / ms['torchrun']:>5.2f}  {ms['before'] / ms['torchrun']:>15.2f}  "
                  f"{threads['poprun']}; {threads['torchrun']}; {threads['before']}")


if __name__ == "__main__":
    main()
