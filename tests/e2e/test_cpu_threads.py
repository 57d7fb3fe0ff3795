"""CPU threads: each instance's torch uses the threads the plan decided, not the one thread oneMKL picks under MPI's variables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.helpers import plan_of

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PY = sys.executable
PROGRAM = ("import json, os, torch; print(json.dumps({'index': int(os.environ['POPDIST_INSTANCE_INDEX']), "
           "'threads': torch.get_num_threads(), 'omp': os.environ.get('OMP_NUM_THREADS')}))")


def run(tmp_path: Path, *options: str, extra: dict[str, str] | None = None) -> list[dict[str, object]]:
    """Launch PROGRAM through the real CLI with ``options``; return each instance's line, by index."""
    pytest.importorskip("torch")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POPDIST_", "MASTER_", "POPRUN_", "OMP_", "MKL_"))}
    done = subprocess.run([PY, "-m", "poprun.cli.main", *options, PY, "-c", PROGRAM], cwd=tmp_path,
                          env=env | {"POPRUN_RUNS_DIR": str(tmp_path / "runs")} | (extra or {}), capture_output=True,
                          text=True, timeout=100, check=False)
    assert 0 == done.returncode, done.stderr
    return sorted((json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")),
                  key=lambda r: int(str(r["index"])))


def test_an_instance_alone_uses_every_cpu_it_may_as_under_torchrun(tmp_path: Path) -> None:
    """One instance on this machine: OMP_NUM_THREADS is every CPU this process may use, and torch uses them all."""
    options = ("--num-instances=1", "--num-replicas=2")
    cpus = len(os.sched_getaffinity(0))

    lines = run(tmp_path, *options)

    assert str(cpus) == plan_of(*options, PY, "-c", PROGRAM).instances[0].env.get("OMP_NUM_THREADS")
    assert [{"index": 0, "threads": cpus, "omp": str(cpus)}] == lines


def test_instances_sharing_a_host_share_its_cpus(tmp_path: Path) -> None:
    """Two instances on this machine: each gets the threads its plan says (its share of the CPUs it may use)."""
    options = ("--num-instances=2", "--num-replicas=2")
    plan = plan_of(*options, PY, "-c", PROGRAM)
    decided = [int(i.env.get("OMP_NUM_THREADS") or 0) for i in plan.instances]

    lines = run(tmp_path, *options)

    assert [max(len(os.sched_getaffinity(0)) // 2, 1)] * 2 == decided
    assert [{"index": i, "threads": n, "omp": str(n)} for i, n in enumerate(decided)] == lines


def test_the_users_thread_count_is_kept(tmp_path: Path) -> None:
    """-x OMP_NUM_THREADS=1 for one instance and the launching shell's for the other: each runs with what was given."""
    lines = run(tmp_path, "--num-instances=2", "--num-replicas=2", "--instance-mpi-local-args=1:-x OMP_NUM_THREADS=1",
                extra={"OMP_NUM_THREADS": "2"})

    assert [{"index": 0, "threads": 2, "omp": "2"}, {"index": 1, "threads": 1, "omp": "1"}] == lines
