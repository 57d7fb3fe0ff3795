"""The ssh backend on real hosts: placement and popdist values, quoting, preflight, teardown."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PY = sys.executable
# A shell (its $0 is the mark) with a marked grandchild: every process of the instance carries the mark.
SLEEPER = "sh -c 'sleep 60; :' {mark}-child & wait"
PROBE = ("import json, os, socket; import popdist; c = popdist.current(); "
         "print(json.dumps({'host': socket.gethostname(), 'cwd': os.getcwd(), 'index': c.instance_index, "
         "'instances': c.num_instances, 'offset': c.replica_index_offset, 'local': c.num_local_replicas, "
         "'total': c.num_total_replicas, 'local_index': c.local_instance_index}))")


def poprun(hosts: TestHosts, *args: str, cwd: Path, env: dict[str, str] | None = None,
           timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run the real CLI with the test hosts' ssh configuration."""
    return subprocess.run([PY, "-m", "poprun.cli.main", *args], cwd=cwd, capture_output=True, text=True,
                          env=os.environ | hosts.env() | (env or {}), timeout=timeout, check=False)


def wait_for(condition: object, *, within_s: float) -> bool:
    """Return whether ``condition()`` became true within ``within_s`` seconds."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if condition():  # type: ignore[operator]
            return True
        time.sleep(0.05)
    return bool(condition())  # type: ignore[operator]


def marked_anywhere(hosts: TestHosts, mark: str) -> dict[str, list[str]]:
    """Return the processes whose command line holds ``mark``, by host, where there are any."""
    return {name: found for name in hosts.names if (found := hosts.processes(name, mark))}


def test_four_hosts_two_instances_each_see_their_planned_values(test_hosts: TestHosts, tmp_path: Path) -> None:
    """4 hosts x 2 instances: each instance runs on its planned host, in the same directory, with its values."""
    done = poprun(test_hosts, "--host", ",".join(test_hosts.names), "--num-instances", "8", "--num-replicas", "16",
                  PY, "-c", PROBE, cwd=tmp_path)

    assert 0 == done.returncode, done.stderr
    seen = sorted((json.loads(line) for line in done.stdout.splitlines()), key=lambda v: v["index"])
    assert [{"host": test_hosts.names[i // 2], "cwd": str(tmp_path), "index": i, "instances": 8, "offset": 2 * i,
             "local": 2, "total": 16, "local_index": i % 2} for i in range(8)] == seen


def test_values_arrive_exactly_whatever_their_characters(test_hosts: TestHosts, tmp_path: Path) -> None:
    """Set and forwarded values with quotes, spaces, $(...), backticks, newlines and Unicode arrive unchanged."""
    nasty = "it's \"quoted\" $(echo no) `echo no` $HOME ; | & * \\ \n second line \u00e9\u6f22\U0001f600"
    code = "import os, json; print(json.dumps([os.environ['SET_ME'], os.environ['FORWARD_ME']]))"
    done = poprun(test_hosts, "--host", "h1", "--mpi-global-args", "-x FORWARD_ME", "--mpi-local-args",
                  f"-x SET_ME={shlex.quote(nasty)}", "--num-replicas", "2", PY, "-c", code, cwd=tmp_path,
                  env={"FORWARD_ME": nasty})

    assert (0, [nasty, nasty]) == (done.returncode, json.loads(done.stdout)), done.stderr


def test_failing_remote_instance_tears_down_every_host(test_hosts: TestHosts, tmp_path: Path) -> None:
    """Instance 1 (on h2) exits 3: poprun exits 3, names it, and nothing of the launch is left on any host."""
    mark = f"poprun-mark-{uuid.uuid4().hex[:8]}"
    program = f'if [ "$POPDIST_INSTANCE_INDEX" = 1 ]; then sleep 0.5; exit 3; fi; {SLEEPER.format(mark=mark)}'
    started = time.monotonic()
    done = poprun(test_hosts, "--host", ",".join(test_hosts.names), "--num-instances", "4", "--num-replicas", "4",
                  "sh", "-c", program, mark, cwd=tmp_path)

    assert 3 == done.returncode, done.stderr
    assert "instance 1 on h2 exited with status 3" in done.stderr
    assert time.monotonic() - started < 10
    assert wait_for(lambda: not marked_anywhere(test_hosts, mark), within_s=2), marked_anywhere(test_hosts, mark)


def test_sigkilled_poprun_leaves_nothing_on_any_host(test_hosts: TestHosts, tmp_path: Path) -> None:
    """kill -9 of poprun while 4 remote instances run: within 3 s no process of the launch is left on any host."""
    mark = f"poprun-mark-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen([PY, "-m", "poprun.cli.main", "--host", ",".join(test_hosts.names), "--num-instances", "4",
                             "--num-replicas", "4", "sh", "-c", SLEEPER.format(mark=mark), mark], cwd=tmp_path,
                            env=os.environ | test_hosts.env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: all(len(p) >= 2 for p in marked_anywhere(test_hosts, mark).values())
                        and len(marked_anywhere(test_hosts, mark)) == 4, within_s=20), "the instances never ran"
    finally:
        proc.kill()
        proc.wait()

    assert wait_for(lambda: not marked_anywhere(test_hosts, mark), within_s=3), marked_anywhere(test_hosts, mark)


def test_interrupt_stops_remote_instances_gracefully(test_hosts: TestHosts, tmp_path: Path) -> None:
    """SIGINT to poprun: each remote instance gets SIGTERM (its trap runs and prints), poprun exits 130."""
    mark = f"poprun-mark-{uuid.uuid4().hex[:8]}"
    program = 'trap "echo stopped $POPDIST_INSTANCE_INDEX; exit 0" TERM; echo ready; while :; do sleep 0.05; done'
    proc = subprocess.Popen([PY, "-m", "poprun.cli.main", "--host", "h1,h2", "--num-instances", "2",
                             "--num-replicas", "2", "sh", "-c", program, mark], cwd=tmp_path,
                            env=os.environ | test_hosts.env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    assert proc.stdout is not None
    assert ["ready", "ready"] == [proc.stdout.readline().strip() for _ in range(2)]

    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=20)

    assert 130 == proc.returncode, err
    assert {"stopped 0", "stopped 1"} <= set(out.splitlines())
    assert wait_for(lambda: not marked_anywhere(test_hosts, mark), within_s=2)


def test_distribute_ssh_key_makes_a_key_and_every_host_accepts_it(test_hosts: TestHosts, tmp_path: Path) -> None:
    """--distribute-ssh-key with type ecdsa in a new folder: the key is made, copied, and then logs into each host."""
    keys = tmp_path / "keys"
    done = poprun(test_hosts, "--host", "h1,h2,h3", "--num-instances", "3", "--num-replicas", "3",
                  "--distribute-ssh-key=yes", f"--distribute-ssh-key-path={keys}", "--distribute-ssh-key-type=ecdsa",
                  "true", cwd=tmp_path)

    assert 0 == done.returncode, done.stderr
    assert (keys / "id_ecdsa").is_file()
    for name in ("h1", "h2", "h3"):
        login = subprocess.run(["ssh", "-F", str(test_hosts.ssh_config), "-i", str(keys / "id_ecdsa"), "-o",
                                "IdentityFile=none", "-o", "IdentitiesOnly=yes", name, "hostname"],
                               capture_output=True, text=True, timeout=30, check=False)
        assert (0, name) == (login.returncode, login.stdout.strip()), login.stderr
