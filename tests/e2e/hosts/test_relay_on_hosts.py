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
import re
import shlex
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.e2e.hosts.test_host_faults import link_down, running
from tests.e2e.hosts.test_ssh_backend import SLEEPER, marked_anywhere, poprun, wait_for
from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PY = sys.executable
RELAYED = {"POPRUN_SSH_RELAY": "on"}
HOST_TIMEOUT_S = 3  # POPRUN_HOST_TIMEOUT in the tests of a lost host
__all__ = ["link_down"]  # a fixture
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


@pytest.mark.parametrize("fault", ["sshd-killed", "link-down"])
def test_a_leaf_lost_mid_run_is_named_as_a_direct_host_is(test_hosts: TestHosts, tmp_path: Path,
                                                           link_down: list[str], short_tmp: Path, fault: str) -> None:
    """
    h4 (h3's leaf) is lost mid-run, its sshd killed or its link down: as for a direct host, PR411
    names h4, exit 125, its instance-ended event says lost, and nothing is left anywhere.
    """
    mark = f"poprun-mark-{uuid.uuid4().hex[:8]}"
    events = tmp_path / "events.jsonl"
    proc = subprocess.Popen([PY, "-m", "poprun.cli.main", "--events", str(events), "--host", ",".join(test_hosts.names),
                             "--num-instances", "4", "--num-replicas", "4", "sh", "-c", SLEEPER.format(mark=mark), mark],
                            cwd=tmp_path, env=os.environ | test_hosts.env() | RELAYED | {
                                "POPRUN_HOST_TIMEOUT": str(HOST_TIMEOUT_S), "TMPDIR": str(short_tmp)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: len(marked_anywhere(test_hosts, running(mark))) == 4, within_s=30), "never ran"
        if fault == "sshd-killed":
            test_hosts.stop_sshd("h4")
        else:
            link_down.append("h4")
            test_hosts.set_link("h4", up=False)
        cut = time.monotonic()
        _, err = proc.communicate(timeout=60)
        noticed = time.monotonic() - cut
    finally:
        proc.kill()
        proc.wait()
        if fault == "sshd-killed":
            test_hosts.start_sshd("h4")

    assert 125 == proc.returncode, err
    assert noticed < HOST_TIMEOUT_S + 10, noticed
    assert ("Root cause: error[PR411]: host h4 stopped answering (instance 3 ran there); every other instance was "
            "stopped") in err, err
    assert re.search(r"^  instance 3 on h4 \(PID \d+\): lost: host h4 stopped answering$", err, re.MULTILINE), err
    assert "status 255" not in err, err
    ended = [e for e in map(json.loads, events.read_text().splitlines()) if e["event"] == "instance-ended"]
    assert [(True, "")] == [(e["lost"], e.get("via", "")) for e in ended if e["index"] == 3], ended
    assert wait_for(lambda: not marked_anywhere(test_hosts, mark), within_s=HOST_TIMEOUT_S + 5), \
        marked_anywhere(test_hosts, mark)


def test_a_leaf_instance_that_exits_with_255_is_not_a_lost_host(test_hosts: TestHosts, tmp_path: Path) -> None:
    """Instance 3 on h4 (a leaf) exits with 255 itself: its status, exit 255, no host is lost."""
    program = 'if [ "$POPDIST_INSTANCE_INDEX" = 3 ]; then exit 255; fi; sleep 30'
    done = poprun(test_hosts, "--host", ",".join(test_hosts.names), "--num-instances", "4", "--num-replicas", "4",
                  "sh", "-c", program, cwd=tmp_path, env=RELAYED)

    assert 255 == done.returncode, done.stderr
    assert "instance 3 on h4 exited with status 255" in done.stderr
    assert "PR411" not in done.stderr


def test_a_relay_whose_link_goes_down_is_the_host_named(test_hosts: TestHosts, tmp_path: Path,
                                                        link_down: list[str]) -> None:
    """h3's link goes down mid-run: PR411 names h3, the relay, for its own instance and for its leaf's (h4, healthy)."""
    mark = f"poprun-mark-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen([PY, "-m", "poprun.cli.main", "--host", ",".join(test_hosts.names), "--num-instances", "4",
                             "--num-replicas", "4", "sh", "-c", SLEEPER.format(mark=mark), mark], cwd=tmp_path,
                            env=os.environ | test_hosts.env() | RELAYED | {"POPRUN_HOST_TIMEOUT": str(HOST_TIMEOUT_S)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: len(marked_anywhere(test_hosts, running(mark))) == 4, within_s=30), "never ran"
        link_down.append("h3")
        test_hosts.set_link("h3", up=False)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()

    assert 125 == proc.returncode, err
    assert "Root cause: error[PR411]: host h3 stopped answering" in err, err
    assert "host h4 stopped answering" not in err, err
    assert wait_for(lambda: not marked_anywhere(test_hosts, mark), within_s=HOST_TIMEOUT_S + 5), \
        marked_anywhere(test_hosts, mark)


def test_a_leaf_whose_ssh_server_is_gone_before_the_launch_is_named(test_hosts: TestHosts, tmp_path: Path) -> None:
    """h4's sshd is down before poprun starts: PR406 names h4 (from its relay h3), exit 125, nothing starts."""
    mark = f"poprun-mark-{uuid.uuid4().hex[:8]}"
    test_hosts.stop_sshd("h4")
    try:
        done = poprun(test_hosts, "--host", ",".join(test_hosts.names), "--num-instances", "4", "--num-replicas", "4",
                      "sh", "-c", SLEEPER.format(mark=mark), mark, cwd=tmp_path, env=RELAYED)
    finally:
        test_hosts.start_sshd("h4")

    assert 125 == done.returncode, done.stderr
    assert "error[PR406]: host 'h4' cannot be reached" in done.stderr, done.stderr
    assert "(from its relay h3; " in done.stderr, done.stderr
    assert not marked_anywhere(test_hosts, mark)


def test_an_instance_of_a_lost_leaf_is_not_started_again(test_hosts: TestHosts, tmp_path: Path,
                                                         short_tmp: Path) -> None:
    """--restart-scope instance: h4's sshd is killed mid-run; its instance is lost (PR411), never restarted there."""
    mark = f"poprun-mark-{uuid.uuid4().hex[:8]}"
    events = tmp_path / "events.jsonl"
    proc = subprocess.Popen([PY, "-m", "poprun.cli.main", "--events", str(events), "--max-restarts", "3",
                             "--restart-scope", "instance", "--host", ",".join(test_hosts.names), "--num-instances",
                             "4", "--num-replicas", "4", "sh", "-c", SLEEPER.format(mark=mark), mark], cwd=tmp_path,
                            env=os.environ | test_hosts.env() | RELAYED | {
                                "POPRUN_HOST_TIMEOUT": str(HOST_TIMEOUT_S), "TMPDIR": str(short_tmp)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: len(marked_anywhere(test_hosts, running(mark))) == 4, within_s=30), "never ran"
        test_hosts.stop_sshd("h4")
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.wait()
        test_hosts.start_sshd("h4")

    assert 125 == proc.returncode, err
    assert "Root cause: error[PR411]: host h4 stopped answering (instance 3 ran there)" in err, err
    seen = [e for e in map(json.loads, events.read_text().splitlines()) if e["event"] == "instance-ended"]
    assert not [e for e in seen if e.get("restarting")], seen
    assert wait_for(lambda: not marked_anywhere(test_hosts, mark), within_s=HOST_TIMEOUT_S + 5), \
        marked_anywhere(test_hosts, mark)
