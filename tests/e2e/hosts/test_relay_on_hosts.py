"""
The ssh backend's relay start (POPRUN_SSH_RELAY=on) on real hosts: each leaf's session goes through its relay's connection.

With 4 hosts the groups are of 2: h1 relays for h2, h3 for h4. Every guarantee of a direct start
is checked again through the relays: each instance on its planned host with its exact values,
a failure or a kill of poprun tears down every host, a graceful stop reaches the leaves, and a
leaf that cannot be reached is named.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.e2e.hosts.test_ssh_backend import SLEEPER, marked_anywhere, poprun, wait_for
from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PY = sys.executable
RELAYED = {"POPRUN_SSH_RELAY": "on"}
SEEN = ("import json, os, socket; import popdist; c = popdist.current(); "
        "print(json.dumps({'host': socket.gethostname(), 'index': c.instance_index, 'local': c.num_local_replicas, "
        "'from': os.environ['SSH_CONNECTION'].split()[0], 'value': os.environ['SET_ME']}))")
NASTY = "it's \"quoted\" $(echo no) `echo no` $HOME ; | & \\ \n second line \u00e9\U0001f600"


def test_every_instance_runs_on_its_host_and_each_leaf_is_reached_from_its_relay(test_hosts: TestHosts,
                                                                                   tmp_path: Path) -> None:
    done = poprun(test_hosts, "-v", "--host", ",".join(test_hosts.names), "--num-instances", "8", "--num-replicas", "8",
                  "--mpi-local-args", f"-x SET_ME={shlex.quote(NASTY)}", PY, "-c", SEEN, cwd=tmp_path, env=RELAYED)

    assert 0 == done.returncode, done.stderr
    seen = sorted((json.loads(line) for line in done.stdout.splitlines()), key=lambda v: v["index"])
    bridge = test_hosts.subnet.rsplit(".", 1)[0] + ".1"
    relay_of = {"h1": bridge, "h2": test_hosts.addresses["h1"], "h3": bridge, "h4": test_hosts.addresses["h3"]}
    assert [{"host": test_hosts.names[i // 2], "index": i, "local": 1, "value": NASTY,
             "from": relay_of[test_hosts.names[i // 2]]} for i in range(8)] == seen
    assert "4 hosts through 2 relays" in done.stderr


def test_a_failing_leaf_instance_tears_down_every_host(test_hosts: TestHosts, tmp_path: Path) -> None:
    mark = f"poprun-mark-{uuid.uuid4().hex[:8]}"
    program = f'if [ "$POPDIST_INSTANCE_INDEX" = 3 ]; then sleep 0.5; exit 3; fi; {SLEEPER.format(mark=mark)}'
    done = poprun(test_hosts, "--host", ",".join(test_hosts.names), "--num-instances", "4", "--num-replicas", "4",
                  "sh", "-c", program, mark, cwd=tmp_path, env=RELAYED)

    assert 3 == done.returncode, done.stderr
    assert "instance 3 on h4 exited with status 3" in done.stderr
    assert wait_for(lambda: not marked_anywhere(test_hosts, mark), within_s=3), marked_anywhere(test_hosts, mark)


def test_a_sigkilled_poprun_leaves_nothing_on_relays_or_leaves(test_hosts: TestHosts, tmp_path: Path) -> None:
    mark = f"poprun-mark-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen([PY, "-m", "poprun.cli.main", "--host", ",".join(test_hosts.names), "--num-instances", "4",
                             "--num-replicas", "4", "sh", "-c", SLEEPER.format(mark=mark), mark], cwd=tmp_path,
                            env=os.environ | test_hosts.env() | RELAYED, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: len(marked_anywhere(test_hosts, mark)) == 4, within_s=30), "the instances never ran"
    finally:
        proc.kill()
        proc.wait()

    assert wait_for(lambda: not marked_anywhere(test_hosts, mark), within_s=3), marked_anywhere(test_hosts, mark)


def test_an_interrupt_stops_leaf_instances_gracefully(test_hosts: TestHosts, tmp_path: Path) -> None:
    mark = f"poprun-mark-{uuid.uuid4().hex[:8]}"
    program = 'trap "echo stopped $POPDIST_INSTANCE_INDEX; exit 0" TERM; echo ready; while :; do sleep 0.05; done'
    proc = subprocess.Popen([PY, "-m", "poprun.cli.main", "--host", ",".join(test_hosts.names), "--num-instances", "4",
                             "--num-replicas", "4", "sh", "-c", program, mark], cwd=tmp_path,
                            env=os.environ | test_hosts.env() | RELAYED, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    assert ["ready"] * 4 == [proc.stdout.readline().strip() for _ in range(4)]

    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)

    assert 130 == proc.returncode, err
    assert {f"stopped {i}" for i in range(4)} <= set(out.splitlines())
    assert wait_for(lambda: not marked_anywhere(test_hosts, mark), within_s=2)


def test_a_leaf_that_cannot_be_reached_from_its_relay_is_named(test_hosts: TestHosts, tmp_path: Path) -> None:
    """ghost (an address nobody has) is h3's leaf: PR406 names ghost, the others never start."""
    unused = test_hosts.subnet.rsplit(".", 1)[0] + ".99"
    config = tmp_path / "ssh_config"
    config.write_text(f"Host ghost\n  HostName {unused}\n  ConnectTimeout 1\n{test_hosts.ssh_config.read_text()}")
    mark = f"poprun-mark-{uuid.uuid4().hex[:8]}"
    done = poprun(test_hosts, "--host", "h1,h2,h3,ghost", "--num-instances", "4", "--num-replicas", "4",
                  "sh", "-c", SLEEPER.format(mark=mark), mark, cwd=tmp_path,
                  env=RELAYED | {"POPRUN_SSH_CONFIG": str(config)})

    assert 125 == done.returncode, done.stderr
    assert "error[PR406]: host 'ghost' cannot be reached" in done.stderr
    assert "(from its relay h3; POPRUN_SSH_RELAY=off connects to every host from here)" in done.stderr
    assert not marked_anywhere(test_hosts, mark)
