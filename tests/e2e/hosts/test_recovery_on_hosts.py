"""Recovery on the test hosts (real sshd): restarts of every instance, the port plan on instance 0's host, remote stacks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.e2e.hosts.test_ssh_backend import marked_anywhere, wait_for
from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

# Instance 1 fails on the first attempt; each instance says where it runs and its MASTER_PORT.
FLAKY = ("import os, socket, sys; i = os.environ['POPDIST_INSTANCE_INDEX']; n = os.environ['POPRUN_RESTART_COUNT']\n"
         "print('run', n, i, socket.gethostname(), os.environ['MASTER_PORT'], flush=True)\n"
         "sys.exit(3 if i == '1' and n == '0' else 0)\n# {mark}")
HANG = ("import os, time\ndef hang_here():\n    time.sleep(600)\nprint('ready', flush=True)\n"
        "if os.environ['POPDIST_INSTANCE_INDEX'] == '2':\n    hang_here()\ntime.sleep(600)\n# {mark}")


def poprun(hosts: TestHosts, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("POPDIST_", "MASTER_", "OMPI_", "POPRUN_"))}
    return subprocess.run([sys.executable, "-m", "poprun.cli.main", *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, check=False,
                          env=environ | hosts.env() | {"POPRUN_RUNS_DIR": str(tmp_path / "runs")})


def the_run(tmp_path: Path) -> Path:
    (run,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    return run


@pytest.mark.parametrize("backend", ["ssh", "mpirun"])
def test_every_instance_starts_again_on_its_host_with_a_port_chosen_on_instance_0s_host(
        test_hosts: TestHosts, tmp_path: Path, backend: str) -> None:
    """4 hosts: instance 1 fails once; every instance runs twice on its planned host; a new free port per attempt."""
    mark = f"poprun-mark-{uuid.uuid4().hex[:8]}"
    done = poprun(test_hosts, tmp_path, "--backend", backend, "--host", ",".join(test_hosts.names), "--num-instances",
                  "4", "--num-replicas", "4", "--max-restarts", "1", "--restart-backoff", "0.1", sys.executable,
                  "-c", FLAKY.format(mark=mark))

    assert 0 == done.returncode, done.stderr
    runs = sorted(line.split()[1:] for line in done.stdout.splitlines() if line.startswith("run "))
    assert {(i, host) for n, i, host, _ in runs if n == "1"} == {(str(i), h) for i, h in enumerate(test_hosts.names)}
    run = the_run(tmp_path)
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    ports = [e["master_port"] for e in events if e["event"] == "attempt-started"]
    assert 2 == len(set(ports)) and all(e["chosen"] for e in events if e["event"] == "attempt-started")
    assert {p for n, _, _, p in runs if n == "1"} == {str(ports[1])}
    report = json.loads((run / "report.json").read_text())
    assert [(3, 1), (0, None)] == [(a["status"], a["root_cause"]) for a in report["attempts"]]
    assert wait_for(lambda: not marked_anywhere(test_hosts, mark), within_s=5), marked_anywhere(test_hosts, mark)


def test_a_busy_port_on_instance_0s_host_is_refused_before_anything_starts(test_hosts: TestHosts,
                                                                         tmp_path: Path) -> None:
    """MASTER_PORT set by the user and listening on h1 (not here): PR440, status 125, nothing ran."""
    port = 24000 + os.getpid() % 1000
    holder = subprocess.Popen(["ip", "netns", "exec", test_hosts.namespaces["h1"], sys.executable, "-c",
                               (f"import socket, time; s = socket.socket(); s.bind(('0.0.0.0', {port})); s.listen(); "
                               "print('up', flush=True); time.sleep(60)")], stdout=subprocess.PIPE, text=True)
    try:
        assert "up\n" == holder.stdout.readline()
        done = poprun(test_hosts, tmp_path, "--backend", "ssh", "--host", "h1,h2", "--num-instances", "2",
                      "--num-replicas", "2", f"--mpi-local-args=-x MASTER_PORT={port}", "sh", "-c", "echo ran")
    finally:
        holder.kill()
        holder.communicate()

    assert (125, "") == (done.returncode, done.stdout), done.stderr
    assert f"error[PR440]: port {port} is already in use on h1" in done.stderr


def test_a_stall_on_a_remote_host_reports_its_stack_and_leaves_nothing(test_hosts: TestHosts, tmp_path: Path) -> None:
    """Instance 2 hangs on h3: after the stall limit its stack (hang_here) is in the report; no process is left anywhere."""
    mark = f"poprun-mark-{uuid.uuid4().hex[:8]}"
    done = poprun(test_hosts, tmp_path, "--backend", "ssh", "--host", ",".join(test_hosts.names), "--num-instances",
                  "4", "--num-replicas", "4", "--stall-timeout", "3", sys.executable, "-c", HANG.format(mark=mark))

    assert 124 == done.returncode, done.stderr
    report = json.loads((the_run(tmp_path) / "report.json").read_text())
    assert "hang_here (" in report["stacks"]["2"], report["stacks"]  # py-spy's frame: function (file:line)
    assert "hang_here (" not in report["stacks"]["0"]
    assert wait_for(lambda: not marked_anywhere(test_hosts, mark), within_s=5), marked_anywhere(test_hosts, mark)
