"""Recovery attacked on the test hosts (real sshd): a busy instance 0 host, whose sockets fill the port report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(150)]

SOCKETS = 12000  # /proc/net/tcp's lines are 150 bytes: more than a megabyte of them
HOLDER = f"""
import resource, socket, time
resource.setrlimit(resource.RLIMIT_NOFILE, ({SOCKETS + 100}, {SOCKETS + 100}))
held = []
for _ in range({SOCKETS}):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))  # an ephemeral port each, listening: as many lines in /proc/net/tcp
    s.listen(1)
    held.append(s)
print("up", flush=True)
time.sleep(120)
"""


def poprun(hosts: TestHosts, tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("POPDIST_", "MASTER_", "OMPI_", "POPRUN_"))}
    return subprocess.run([sys.executable, "-m", "poprun.cli.main", *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, check=False,
                          env=environ | hosts.env() | {"POPRUN_RUNS_DIR": str(tmp_path / "runs")})


def test_a_port_is_chosen_on_a_host_with_thousands_of_sockets(test_hosts: TestHosts, tmp_path: Path) -> None:
    """h1 holds 12000 bound sockets: the port is still read and chosen there, not the unchecked default."""
    holder = subprocess.Popen(["ip", "netns", "exec", test_hosts.namespaces["h1"], sys.executable, "-c", HOLDER],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        assert "up\n" == holder.stdout.readline()
        done = poprun(test_hosts, tmp_path, "--backend", "ssh", "--host", "h1,h2", "--num-instances", "2",
                      "--num-replicas", "2", "sh", "-c", 'echo "port=$MASTER_PORT"')
    finally:
        holder.kill()
        holder.communicate()

    assert 0 == done.returncode, done.stderr
    (run,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir()]
    started = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()
               if '"attempt-started"' in line]
    assert [True] == [e["chosen"] for e in started], started
    assert "port=29500" not in done.stdout
