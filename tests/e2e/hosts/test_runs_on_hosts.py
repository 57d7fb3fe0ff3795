"""Run records on other hosts: the ssh and mpirun backends keep each remote instance's lines, events and report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest

from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

SCHEMA = json.loads((Path(__file__).parents[3] / "docs" / "events.schema.json").read_text())
# Each instance prints its host and index on both streams; instance 3 then fails.
PROGRAM = ("import os, socket, sys, time; i = int(os.environ['POPDIST_INSTANCE_INDEX']); h = socket.gethostname(); "
           "print('out', i, h, flush=True); print('err', i, h, file=sys.stderr, flush=True); "
           "time.sleep(1); sys.exit(3 if i == 3 else 0)")


@pytest.mark.parametrize("backend", ["ssh", "mpirun"])
def test_a_run_on_four_hosts_is_recorded_instance_by_instance(test_hosts: TestHosts, tmp_path: Path,
                                                              backend: str) -> None:
    """4 hosts, one instance each: every instance's lines in its own log, valid events, the root cause reported."""
    runs = tmp_path / "runs"
    done = subprocess.run([sys.executable, "-m", "poprun.cli.main", "--backend", backend, "--host",
                           ",".join(test_hosts.names), "--num-instances", "4", "--num-replicas", "4",
                           sys.executable, "-c", PROGRAM], cwd=tmp_path, capture_output=True, text=True, timeout=90,
                          env=os.environ | test_hosts.env() | {"POPRUN_RUNS_DIR": str(runs)}, check=False)
    (run,) = list(runs.iterdir())

    assert 3 == done.returncode, done.stderr
    assert f"(run {run.name})" in done.stderr
    for i, host in enumerate(test_hosts.names):
        assert f"out {i} {host}\n" == (run / "logs" / f"{i}.stdout").read_text()
        assert f"err {i} {host}\n" == (run / "logs" / f"{i}.stderr").read_text()
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    for event in events:
        jsonschema.validate(event, SCHEMA)
    report = json.loads((run / "report.json").read_text())
    assert (3, 3, run.name) == (report["root_cause"], report["status"], report["run"])
    assert {(e["index"], e["host"]) for e in events if e["event"] == "instance-started"} == \
        set(enumerate(test_hosts.names))
