"""
The progress channel inside a real Slurm allocation: the slurm backend's instances send to ``$SLURM_SRUN_COMM_HOST``.

srun runs on poprun's machine and listens there: ``SLURM_SRUN_COMM_HOST`` in every task is the
address by which the task's host reaches it, and so poprun. Six instances on three hosts must
all be heard, each named by its host.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.progress_helpers import PROGRAM, PY, assert_progress_recorded, only_run
from tests.e2e.slurm.test_slurm_backend import environ, salloc
from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


def test_slurm_instances_on_three_hosts_report_progress(slurm_hosts: TestHosts, tmp_path: Path) -> None:
    """salloc -N3 with two tasks each: six instances' progress in the record, with their hosts; step times in the report."""
    runs = tmp_path / "runs"

    done = salloc(slurm_hosts, "--backend", "slurm", "--num-replicas", "6", PY, "-c", PROGRAM, cwd=tmp_path,
                  env=environ(slurm_hosts, POPRUN_RUNS_DIR=str(runs)), timeout=150)

    assert 0 == done.returncode, done.stderr
    run = only_run(runs)
    assert_progress_recorded(run, [f"h{i // 2 + 1}" for i in range(6)])
    assert json.loads((run / "report.json").read_text())["progress"]["forged"] == 0
