"""
The notifier and the metrics file with instances on real hosts: ssh (direct and relayed) and mpirun.

The instances run on the namespace hosts h1..h4 and report their steps over the progress
channel; the notifier and the metrics file stay on this machine. The file must name every
instance with its own host and last step, parse as OpenMetrics, and the notifier hear the run's
end once.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics

from tests.e2e.hosts.test_ssh_backend import poprun
from tests.e2e.progress_helpers import PROGRAM, PY, TOTAL
from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


@pytest.mark.parametrize("how", ["ssh", "relayed", "mpirun"])
def test_instances_on_four_hosts_are_in_the_metrics_file_and_the_end_is_notified(test_hosts: TestHosts,
                                                                                   tmp_path: Path, how: str) -> None:
    """Four hosts: each instance's host and last step in the file, its run succeeded, one run-ended line."""
    env = {"POPRUN_RUNS_DIR": str(tmp_path / "runs"), **({"POPRUN_SSH_RELAY": "on"} if how == "relayed" else {})}
    backend = ["--backend", "mpirun"] if how == "mpirun" else []

    done = poprun(test_hosts, *backend, "--host", ",".join(test_hosts.names), "--num-instances", "4",
                  "--num-replicas", "4", "--metrics-file", str(tmp_path / "poprun.prom"),
                  "--notify", f"cat >> {tmp_path / 'notes.jsonl'}", PY, "-c", PROGRAM, cwd=tmp_path, env=env,
                  timeout=150)

    assert 0 == done.returncode, done.stderr
    samples = [s for f in openmetrics((tmp_path / "poprun.prom").read_text()) for s in f.samples]
    steps = {(s.labels["instance"], s.labels["host"]): s.value for s in samples if s.name == "poprun_instance_step"}
    assert {(str(i), h): TOTAL - 1 for i, h in enumerate(test_hosts.names)} == {k: min(v, TOTAL - 1)
                                                                                 for k, v in steps.items()}
    assert [1] == [s.value for s in samples if s.name == "poprun_run_state" and s.labels["state"] == "succeeded"]
    notes = [json.loads(line) for line in (tmp_path / "notes.jsonl").read_text().splitlines()]
    assert [("run-ended", 0)] == [(n["event"], n["status"]) for n in notes]
