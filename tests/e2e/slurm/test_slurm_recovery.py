"""Recovery inside a real Slurm allocation: every instance restarts as a new srun step, with a port chosen on its node."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.slurm.test_slurm_backend import PY, environ, salloc
from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

FLAKY = ("import os, socket, sys; i = os.environ['POPDIST_INSTANCE_INDEX']; n = os.environ['POPRUN_RESTART_COUNT']\n"
         "print('run', n, i, socket.gethostname(), os.environ['MASTER_PORT'], os.environ['GROUP_RANK'], flush=True)\n"
         "sys.exit(3 if i == '4' and n == '0' else 0)")


def test_a_failed_step_starts_again_and_the_run_succeeds(slurm_hosts: TestHosts, tmp_path: Path) -> None:
    """6 instances on 3 nodes; instance 4 fails once: a second step runs all six, status 0, two attempts recorded."""
    runs = tmp_path / "runs"
    done = salloc(slurm_hosts, "--backend", "slurm", "--num-instances", "6", "--num-replicas", "6", "--max-restarts",
                  "2", "--restart-backoff", "0.1", PY, "-c", FLAKY, cwd=tmp_path,
                  env=environ(slurm_hosts, POPRUN_RUNS_DIR=str(runs)))

    assert 0 == done.returncode, done.stderr
    seen = [line.split()[1:] for line in done.stdout.splitlines() if line.startswith("run ")]
    second = sorted((i, host, group) for n, i, host, _, group in seen if n == "1")
    assert [(str(i), f"h{i // 2 + 1}", str(i // 2)) for i in range(6)] == second
    assert 1 == len({port for n, _, _, port, _ in seen if n == "1"})
    (run,) = list(runs.iterdir())
    report = json.loads((run / "report.json").read_text())
    assert [(3, 4), (0, None)] == [(a["status"], a["root_cause"]) for a in report["attempts"]]
    assert "attempt 1" not in (run / "attempts" / "0" / "logs" / "4.stdout").read_text()
