"""MPI programs under the plain command line: one MPI world of every instance, as under real PopRun."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

HELLO = """\
import sys
from mpi4py import MPI
world = MPI.COMM_WORLD
print(f"process {world.Get_rank()} of {world.Get_size()} total {world.allreduce(world.Get_rank())}", flush=True)
"""


def _need_mpi() -> None:
    if shutil.which("mpirun") is None or subprocess.run([sys.executable, "-c", "import mpi4py"],
                                                         check=False).returncode != 0:
        if os.environ.get("POPRUN_CI"):
            pytest.fail("CI must have Open MPI's mpirun and mpi4py")
        pytest.skip("needs Open MPI's mpirun and mpi4py")


@pytest.mark.parametrize("count", [2, 3])
def test_a_plain_poprun_gives_an_mpi4py_program_one_world_of_every_instance(tmp_path: Path, count: int) -> None:
    """poprun --num-instances N python3 hello.py: each instance is rank r of N, and an allreduce adds every rank."""
    _need_mpi()
    (tmp_path / "hello.py").write_text(HELLO)
    done = subprocess.run([sys.executable, "-m", "poprun.cli.main", "--num-instances", str(count), "--num-replicas",
                           str(count), sys.executable, "hello.py"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=90, check=False)

    total = sum(range(count))
    assert 0 == done.returncode, done.stderr
    assert sorted(f"process {r} of {count} total {total}" for r in range(count)) == sorted(done.stdout.splitlines())


def test_explain_says_why_the_mpirun_backend_was_chosen(tmp_path: Path) -> None:
    """The plan of an MPI program names mpirun as its backend and the evidence, before anything runs."""
    _need_mpi()
    (tmp_path / "hello.py").write_text(HELLO)
    done = subprocess.run([sys.executable, "-m", "poprun.cli.main", "plan", "--explain", "--num-instances", "2",
                           "--num-replicas", "2", "python3", "hello.py"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, check=False)

    assert 0 == done.returncode, done.stderr
    assert "backend: mpirun (the program calls MPI (hello.py imports mpi4py)" in done.stdout
