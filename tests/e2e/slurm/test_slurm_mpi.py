"""
An MPI program inside a real allocation, under the plain command line: srun gets the pmix plugin by itself.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests.e2e.hosts.test_mpirun_backend import MPI_PROBE
from tests.e2e.slurm.test_slurm_backend import environ, salloc, values
from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PY = sys.executable


def test_an_mpi4py_program_forms_one_world_without_slurm_mpi_type(slurm_hosts: TestHosts, tmp_path: Path) -> None:
    """No SLURM_MPI_TYPE, the cluster's MpiDefault none: poprun passes --mpi=pmix, and rank = instance index."""
    (tmp_path / "probe.py").write_text(MPI_PROBE + "\n")
    env = {k: v for k, v in environ(slurm_hosts).items() if k != "SLURM_MPI_TYPE"}

    done = salloc(slurm_hosts, "--num-replicas", "6", PY, "probe.py", cwd=tmp_path, env=env)

    assert 0 == done.returncode, done.stderr
    assert [{"rank": i, "size": 6, "index": i, "instances": 6, "host": f"h{i // 2 + 1}", "sum": 15}
            for i in range(6)] == values(done.stdout, "rank")


def test_explain_shows_the_srun_plugin_chosen_for_an_mpi_program(slurm_hosts: TestHosts, tmp_path: Path) -> None:
    """plan --explain inside the allocation: the slurm backend, and srun mpi = pmix with its reason."""
    (tmp_path / "probe.py").write_text(MPI_PROBE + "\n")
    env = {k: v for k, v in environ(slurm_hosts).items() if k != "SLURM_MPI_TYPE"}

    done = salloc(slurm_hosts, "plan", "--explain", "--num-replicas", "6", PY, "probe.py", cwd=tmp_path, env=env)

    assert 0 == done.returncode, done.stderr
    assert re.search(r"^backend: slurm \(inside Slurm job \d+: the instances start as one srun step, with srun's MPI "
                     r"plugin pmix \(the program calls MPI: probe.py imports mpi4py\)\)$", done.stdout, re.MULTILINE), done.stdout
    assert re.search(r"^ *srun mpi +pmix +derived +the program calls MPI and srun here has the pmix plugin", done.stdout,
                     re.MULTILINE), done.stdout
