"""
The instance watch inside a real Slurm allocation: a hung task is found, its stack read on its node, and the run restarted.

Six instances on three nodes (``salloc -N3 --ntasks-per-node=2``) report with ``popdist.progress``;
instance 3 (on h2) stops itself in attempt 0. Its stack is read there through the slurm
backend's host commands, and the restart (``--max-restarts 1``) runs every task again.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.progress_helpers import PY, only_run
from tests.e2e.slurm.test_slurm_backend import environ, salloc
from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

HANGS = """
import os, signal, time, popdist
index = int(os.environ["POPDIST_INSTANCE_INDEX"])
attempt = int(os.environ.get("POPRUN_RESTART_COUNT", "0"))
for step in range(1, 81):
    popdist.progress(step, 80)
    if index == 3 and attempt == 0 and step == 10:
        os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(0.1)
"""


def test_a_hung_slurm_task_is_named_read_and_restarted(slurm_hosts: TestHosts, tmp_path: Path) -> None:
    """--heartbeat-timeout 5 --max-restarts 1: attempt 0 ends as instance 3's hang on h2 (its stack read), attempt 1 ends well."""
    runs = tmp_path / "runs"

    done = salloc(slurm_hosts, "--backend", "slurm", "--num-replicas", "6", "--heartbeat-timeout", "5",
                  "--max-restarts", "1", "--restart-backoff", "0.1", PY, "-c", HANGS, cwd=tmp_path,
                  env=environ(slurm_hosts, POPRUN_RUNS_DIR=str(runs)), timeout=200)

    assert 0 == done.returncode, done.stderr
    run = only_run(runs)
    report = json.loads((run / "report.json").read_text())
    assert [(0, 124, 3), (1, 0, None)] == [(a["number"], a["status"], a["root_cause"]) for a in report["attempts"]]
    assert "instance 3 hung on h2: silent for 5 s (--heartbeat-timeout)" == report["attempts"][0]["cause"]
    told = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    (limit,) = [e for e in told if e["event"] == "limit-reached"]
    assert ("heartbeat", 3, "h2") == (limit["limit"], limit["instance"], limit["host"])
    (stacks,) = [e for e in told if e["event"] == "stacks-collected"]
    assert 3 in stacks["instances"]
