"""Run records on other hosts: the ssh and mpirun backends keep each remote instance's lines, events and report."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
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
    if backend == "ssh":  # its preflight: each host answered, before any instance started
        checked = [(e["host"], e["ok"]) for e in events if e["event"] == "host-checked"]
        assert [(host, True) for host in test_hosts.names] == checked
        kinds = [e["event"] for e in events]
        assert kinds.index("instance-started") > max(i for i, k in enumerate(kinds) if k == "host-checked")


def _running(runs: Path, within_s: float = 30) -> Path:
    """Wait for the one run under ``runs`` to have every instance started; return its directory."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        for run in runs.iterdir() if runs.exists() else ():
            events = run / "events.jsonl"
            if events.exists() and '"event":"launch-running"' in events.read_text():
                return run
        time.sleep(0.05)
    raise AssertionError("the run never ran")


@pytest.mark.parametrize("backend", ["ssh", "mpirun"])
def test_poprun_stop_ends_a_run_on_every_host(test_hosts: TestHosts, tmp_path: Path, backend: str) -> None:
    """'poprun stop RUN' from another shell: the run ends as on Ctrl-C (143), recorded, and nothing is left anywhere."""
    runs, mark = tmp_path / "runs", f"poprun-mark-{uuid.uuid4().hex[:8]}"
    env = os.environ | test_hosts.env() | {"POPRUN_RUNS_DIR": str(runs)}
    proc = subprocess.Popen([sys.executable, "-m", "poprun.cli.main", "--backend", backend, "--host",
                             ",".join(test_hosts.names), "--num-instances", "4", "--num-replicas", "4", "sh", "-c",
                             "sleep 60; :", mark], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        run = _running(runs)
        stopped = subprocess.run([sys.executable, "-m", "poprun.cli.main", "stop", run.name], cwd=tmp_path, env=env,
                                 capture_output=True, text=True, timeout=60, check=False)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()

    assert (0, 143) == (stopped.returncode, proc.returncode), stopped.stderr + err
    assert [signal.SIGTERM] == json.loads((run / "report.json").read_text())["signals"]
    deadline = time.monotonic() + 10
    while any(test_hosts.processes(name, mark) for name in test_hosts.names) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert {} == {name: found for name in test_hosts.names if (found := test_hosts.processes(name, mark))}
