"""Bytes that are not UTF-8 in argv and a value reach every task of a Slurm step exactly."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.hosts.test_raw_bytes_on_hosts import LATIN1, SHOW
from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


def test_a_latin1_argument_and_value_reach_every_slurm_task_exactly(slurm_hosts: TestHosts, tmp_path: Path) -> None:
    """Under the slurm backend (one srun step), each task gets the argument's and F's bytes as given."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")} | slurm_hosts.env()
    done = subprocess.run(["salloc", "--quiet", "-N2", "--ntasks-per-node=1", sys.executable, "-m", "poprun.cli.main",
                           "--num-replicas", "2", f"--mpi-local-args=-x F={LATIN1}", sys.executable, "-c", SHOW,
                           LATIN1], cwd=tmp_path, capture_output=True, timeout=90, check=False,
                          env=env | {"POPRUN_RUNS_DIR": str(tmp_path / "runs")})

    assert 0 == done.returncode, done.stderr
    assert [f"{i} b'caf\\xe9.txt' b'caf\\xe9.txt'".encode() for i in (0, 1)] == sorted(done.stdout.splitlines())
