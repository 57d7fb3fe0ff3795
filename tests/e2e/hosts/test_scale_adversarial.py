"""
Adversarial checks of the ssh backend's work for many hosts (docs/scale.md), on the namespace hosts.

The targets: the bounded connection window and its retries (fanout.py), the relay start (relay.py),
the connections opened ahead of the launch (SshBackend.prepare, the kept client, FRESH_S), and the
settings that steer them (POPRUN_SSH_FANOUT, POPRUN_SSH_RELAY, POPRUN_HOST_TIMEOUT). Tests marked
xfail(strict=True) record a failure found when they were written ("FINDING: ..."); the others guard
what held.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from poprun.backends.conformance import MemorySink, probe_plan
from poprun.backends.ssh.backend import SshBackend
from tests.e2e.hosts.conftest import settle
from tests.e2e.hosts.test_host_faults import command_lines
from tests.e2e.hosts.test_ssh_backend import PY, SLEEPER, marked_anywhere, wait_for
from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

RELAYED = {"POPRUN_SSH_RELAY": "on"}


def cli(hosts: TestHosts, *args: str, cwd: Path, env: dict[str, str] | None = None,
        timeout: float = 40) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "poprun.cli.main", *args], cwd=cwd, capture_output=True, text=True,
                          env=os.environ | hosts.env() | (env or {}), timeout=timeout, check=False,
                          stdin=subprocess.DEVNULL)


def start(hosts: TestHosts, *args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen([PY, "-m", "poprun.cli.main", *args], cwd=cwd, env=os.environ | hosts.env() | (env or {}),
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def ssh_here(tmp: Path) -> dict[int, bytes]:
    """Return the processes here whose command line names a control directory of a poprun run with TMPDIR=``tmp``."""
    needle = os.fsencode(tmp / "poprun-ssh-")
    return {pid: line for pid, line in command_lines().items() if needle in line}


def nothing_left_here(tmp: Path) -> tuple[list[str], dict[int, bytes]]:
    """Wait up to 3 s for a run with TMPDIR=``tmp`` to leave nothing; return what is left (files, ssh processes)."""
    wait_for(lambda: not ssh_here(tmp) and not any(tmp.iterdir()), within_s=3)
    left = (sorted(p.name for p in tmp.iterdir()), ssh_here(tmp))
    for pid in left[1]:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return left


# --- 1. Settings with junk values: one line, the documented status, never an internal error -------------------------


def test_a_junk_host_timeout_is_a_one_line_diagnostic_not_an_internal_error(test_hosts: TestHosts, tmp_path: Path,
                                                                            short_tmp: Path) -> None:
    """
    POPRUN_HOST_TIMEOUT=soon with remote hosts (MASTER_PORT left to poprun, the default): once an internal
    error (the apply step's prepare() raised the setting's LaunchError before its try), then a launch error
    (exit 125); now the setting is planned, so the plan refuses it: PR225 naming the variable, exit 2,
    nothing started. Harm it guards against: a typo in a setting looking like a poprun crash.
    """
    done = cli(test_hosts, "--host", "h1,h2", "--num-instances", "2", "--num-replicas", "2", "true", cwd=tmp_path,
               env={"POPRUN_HOST_TIMEOUT": "soon", "TMPDIR": str(short_tmp)})

    assert 2 == done.returncode, done.stderr
    assert "error[PR225]" in done.stderr and "POPRUN_HOST_TIMEOUT" in done.stderr, done.stderr
    assert "internal error" not in done.stderr, done.stderr
    assert ([], {}) == nothing_left_here(short_tmp)


@pytest.mark.parametrize("value", [
    "abc", "0", "1025", "-4", "4.5",
    "\u00b2",
    "9" * 5000,
])
def test_a_junk_fanout_is_one_line_naming_the_variable_and_leaves_nothing(test_hosts: TestHosts, tmp_path: Path,
                                                                          short_tmp: Path, value: str) -> None:
    """
    POPRUN_SSH_FANOUT=junk: PR225 at plan time, exit 2, naming the variable and its range; no traceback, no
    internal error; and no connection is left (none is opened: the plan refuses the setting first).
    """
    done = cli(test_hosts, "--host", "h1,h2", "--num-instances", "2", "--num-replicas", "2", "true", cwd=tmp_path,
               env={"POPRUN_SSH_FANOUT": value, "TMPDIR": str(short_tmp)})

    assert 2 == done.returncode, done.stderr[-500:]
    assert "error[PR225]" in done.stderr, done.stderr[-500:]
    assert "POPRUN_SSH_FANOUT" in done.stderr and "1 to 1024" in done.stderr, done.stderr[-500:]
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr, done.stderr[-500:]
    assert ([], {}) == nothing_left_here(short_tmp)


@pytest.mark.parametrize("value", ["maybe", "1", "yes", "on off"])
def test_a_junk_relay_mode_is_one_line_naming_the_variable(test_hosts: TestHosts, tmp_path: Path, short_tmp: Path,
                                                           value: str) -> None:
    """POPRUN_SSH_RELAY=junk: PR225 at plan time, exit 2, naming the variable and auto, on, off; nothing left here."""
    done = cli(test_hosts, "--host", "h1,h2,h3", "--num-instances", "3", "--num-replicas", "3", "true", cwd=tmp_path,
               env={"POPRUN_SSH_RELAY": value, "TMPDIR": str(short_tmp)})

    assert 2 == done.returncode, done.stderr[-500:]
    assert "error[PR225]" in done.stderr, done.stderr[-500:]
    assert "POPRUN_SSH_RELAY" in done.stderr and "auto, on, off" in done.stderr, done.stderr[-500:]
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr, done.stderr[-500:]
    assert ([], {}) == nothing_left_here(short_tmp)


# --- 2. Hosts that do not answer (a slow host: test_adversarial_ssh.py) ----------------------------------------------


def test_a_mute_instance_0_host_is_unreachable_within_the_budget_and_nothing_is_left(test_hosts: TestHosts,
                                                                                      tmp_path: Path, short_tmp: Path,
                                                                                      mute_h4: str) -> None:
    """
    Instance 0 on h4, which accepts TCP and never speaks SSH, one instance a host (no topology probe: prepare
    opens the connections, then the port plan reads h4): PR406 for h4 within two greetings' time-outs
    (docs/scale.md: 4.5 s each, one retry), not a wait per step (prepare, port plan, launch), and nothing left.
    """
    began = time.monotonic()
    done = cli(test_hosts, "--host", f"{mute_h4},h1", "--num-instances", "2", "--num-replicas", "2", "true",
               cwd=tmp_path, env={"TMPDIR": str(short_tmp)})
    took = time.monotonic() - began

    assert 125 == done.returncode, done.stderr
    assert "error[PR406]: host 'h4' cannot be reached" in done.stderr, done.stderr
    assert took < 2 * 4.5 + 0.4 + 2.5, took
    assert ([], {}) == nothing_left_here(short_tmp)


def test_sigkill_during_prepare_leaves_no_connection_or_directory(test_hosts: TestHosts, tmp_path: Path,
                                                                   short_tmp: Path, mute_h4: str) -> None:
    """
    One instance a host (no probe: prepare() opens h1's and h4's connections, h4 never answers); poprun is
    SIGKILLed while prepare waits: within 3 s no ssh process of it is left here and TMPDIR is empty.
    """
    proc = start(test_hosts, "--host", f"h1,{mute_h4}", "--num-instances", "2", "--num-replicas", "2", "true",
                 cwd=tmp_path, env={"TMPDIR": str(short_tmp)})
    try:
        assert wait_for(lambda: len(ssh_here(short_tmp)) >= 2, within_s=15), "prepare never opened connections"
        time.sleep(0.5)
    finally:
        proc.kill()
        proc.communicate()

    assert ([], {}) == nothing_left_here(short_tmp)


def test_ctrl_c_during_prepare_ends_at_once_with_130_and_leaves_nothing(test_hosts: TestHosts, tmp_path: Path,
                                                                        short_tmp: Path, mute_h4: str) -> None:
    """SIGINT while prepare() waits for h4 (mute): exit 130 within 1.5 s, no ssh process or directory left."""
    proc = start(test_hosts, "--host", f"h1,{mute_h4}", "--num-instances", "2", "--num-replicas", "2", "true",
                 cwd=tmp_path, env={"TMPDIR": str(short_tmp)})
    assert wait_for(lambda: len(ssh_here(short_tmp)) >= 2, within_s=15), "prepare never opened connections"
    time.sleep(0.5)
    proc.send_signal(signal.SIGINT)
    sent = time.monotonic()
    _, err = proc.communicate(timeout=30)
    took = time.monotonic() - sent

    assert (130, True) == (proc.returncode, took < 1.5), (took, err[-400:])
    assert ([], {}) == nothing_left_here(short_tmp)


# --- 4. The kept connections: FRESH_S, dead masters, a launch that never comes -------------------------------------


def _masters(directory: str) -> list[int]:
    needle = f"{directory}/".encode()
    return [pid for pid, line in command_lines().items() if needle in line and b"ControlMaster=yes" in line]


def test_masters_killed_between_prepare_and_launch_give_a_clean_launch(test_hosts: TestHosts, tmp_path: Path) -> None:
    """
    prepare() opens h1's and h2's connections; both masters are SIGKILLed (a host's sshd restarted, the OOM
    killer) and the launch follows within FRESH_S (10 s). usable() takes them as open without `ssh -O check`,
    so connect() opens nothing; the 8 sessions of each host (one slot) then each find a stale socket and try to
    become the master at once, outside the bounded window. The launch must still work, with nothing but the
    program's output: here ssh's "ControlSocket ... already exists, disabling multiplexing" (or the like)
    reaches the instances' stderr, i.e. the user's terminal and logs; at scale every session is its own
    key exchange, all at once, which is what the window exists to prevent.
    """
    backend, env = SshBackend(grace_s=1), dict(os.environ) | test_hosts.env()
    plan = probe_plan("print('ok')", tmp_path, backend="ssh", instances=16, hosts=("h1", "h2"), environ=env)
    backend.prepare(plan, environ=env)
    directory = backend._kept.directory  # type: ignore[union-attr] # the client prepare kept
    killed = _masters(directory)
    assert 2 == len(killed), killed
    for pid in killed:
        os.kill(pid, signal.SIGKILL)
    assert wait_for(lambda: not _masters(directory), within_s=2)

    sink = MemorySink()
    launch = backend.launch(plan, env_source=env, sink=sink)
    result = launch.wait()

    assert (0,) * 16 == result.statuses, sink.written[-5:]
    assert ["ok"] * 16 == sink.lines(), sink.written[-5:]
    # what the hosts' login shells print (16 at once: the test machine's pyenv rehash races itself) is theirs
    # to print; ssh's own complaints must not be there
    noise = [line for line in sink.data("stderr").decode(errors="replace").splitlines()
             if re.search(r"mux_client|ControlSocket|multiplexing|ssh:|Permission denied|Connection", line)]
    assert [] == noise, sink.data("stderr")[:800]


def test_masters_killed_between_prepare_and_launch_still_launch(test_hosts: TestHosts, tmp_path: Path) -> None:
    """
    The same with one instance a host: whatever the shortcut, a launch after its masters died within FRESH_S
    runs every instance (each session opens its own connection) and leaves no ssh process behind.
    """
    backend, env = SshBackend(grace_s=1), dict(os.environ) | test_hosts.env()
    plan = probe_plan("print('ok')", tmp_path, backend="ssh", instances=2, hosts=("h1", "h2"), environ=env)
    backend.prepare(plan, environ=env)
    directory = backend._kept.directory  # type: ignore[union-attr] # the client prepare kept
    for pid in _masters(directory):
        os.kill(pid, signal.SIGKILL)

    sink = MemorySink()
    result = backend.launch(plan, env_source=env, sink=sink).wait()

    assert ((0, 0), ["ok", "ok"]) == (result.statuses, sink.lines()), sink.written[-5:]
    needle = f"{directory}/".encode()
    assert wait_for(lambda: not any(needle in line for line in command_lines().values()), within_s=3)
    assert not Path(directory).exists()


def test_a_second_launch_in_the_process_on_other_hosts_and_settings_is_its_own(test_hosts: TestHosts,
                                                                               tmp_path: Path) -> None:
    """
    Library use: prepare() for h1,h2 (a launch that never comes), then a plan for h3,h4 with another host
    timeout: the stale kept client (other settings) is not used, each instance runs on its own host, and
    once the launch ends no connection of either client is left.
    """
    backend, env = SshBackend(grace_s=1), dict(os.environ) | test_hosts.env()
    first = probe_plan("print('x')", tmp_path, backend="ssh", instances=2, hosts=("h1", "h2"), environ=env)
    backend.prepare(first, environ=env)
    stale = backend._kept.directory  # type: ignore[union-attr] # the client prepare kept
    code = "import socket; print(socket.gethostname())"
    other = env | {"POPRUN_HOST_TIMEOUT": "20"}
    second = probe_plan(code, tmp_path, backend="ssh", instances=2, hosts=("h3", "h4"), environ=other)
    backend.prepare(second, environ=other)
    sink = MemorySink()
    result = backend.launch(second, env_source=other, sink=sink).wait()

    assert ((0, 0), ["h3", "h4"]) == (result.statuses, sorted(sink.lines())), sink.written[-5:]
    assert wait_for(lambda: not any(f"{stale}/".encode() in line for line in command_lines().values()), within_s=3)
    assert not Path(stale).exists()


# --- 5. The relay start ---------------------------------------------------------------------------------------------


def test_a_mute_leaf_behind_its_relay_is_named_within_the_budget(test_hosts: TestHosts, tmp_path: Path,
                                                                 mute_h4: str) -> None:
    """
    POPRUN_SSH_RELAY=on over h1..h4: h4 (mute: TCP accepted, no SSH) is h3's leaf. PR406 names h4 with its
    relay and the way out, within the preflight's budget, and nothing started on any host.
    """
    mark = f"poprun-mark-{uuid.uuid4().hex[:8]}"
    began = time.monotonic()
    done = cli(test_hosts, "--host", "h1,h2,h3,h4", "--num-instances", "4", "--num-replicas", "4",
               "sh", "-c", SLEEPER.format(mark=mark), mark, cwd=tmp_path, env=RELAYED)
    took = time.monotonic() - began

    assert 125 == done.returncode, done.stderr
    assert "error[PR406]: host 'h4' cannot be reached" in done.stderr, done.stderr
    assert "from its relay h3" in done.stderr, done.stderr
    assert took < 4.5 + 3 + 2.5, took
    assert not marked_anywhere(test_hosts, mark)


def test_values_through_a_relay_arrive_exact_and_are_on_no_command_line(test_hosts: TestHosts,
                                                                        tmp_path: Path) -> None:
    """
    A forwarded secret with quotes, $(), a newline, through relays (h1 for h2, h3 for h4): each instance reads
    it exactly, and while they run no process here, on a relay or on a leaf shows it in its argv.
    """
    secret = f"s3cr3t-{uuid.uuid4().hex} it's \"q\" $(echo no) `echo no`\nline2"
    program = "import os, time; print(repr(os.environ['TOKEN'])); print('ready', flush=True); time.sleep(2)"
    proc = start(test_hosts, "--host", "h1,h2,h3,h4", "--num-instances", "4", "--num-replicas", "4",
                 "--mpi-global-args=-x TOKEN", PY, "-c", program, cwd=tmp_path, env=RELAYED | {"TOKEN": secret})
    assert proc.stdout is not None
    lines = [proc.stdout.readline() for _ in range(8)]
    marker = secret.split(maxsplit=1)[0].encode()
    seen = {pid: line for pid, line in command_lines().items() if marker in line and pid != proc.pid}
    _, err = proc.communicate(timeout=30)
    expected = repr(secret) + "\n"

    assert {} == seen
    assert (0, 4, 4) == (proc.returncode, lines.count("ready\n"), lines.count(expected)), (lines, err[-400:])


def test_a_relay_whose_ssh_server_dies_mid_run_is_the_host_named(test_hosts: TestHosts, tmp_path: Path,
                                                                  short_tmp: Path) -> None:
    """
    POPRUN_SSH_RELAY=on over h1..h4; h1 (h2's relay) loses its sshd while every instance runs. The host to blame
    is h1: the report says "instance 1 on h2: lost: host h2 stopped answering", and about half the time its
    root cause is "error[PR411]: host h2 stopped answering", with no word of the relay: the operator is sent
    to a healthy host. (Nothing is left anywhere, which held.)
    """
    mark = f"poprun-mark-{uuid.uuid4().hex[:8]}"
    proc = start(test_hosts, "--host", "h1,h2,h3,h4", "--num-instances", "4", "--num-replicas", "4",
                 "sh", "-c", SLEEPER.format(mark=mark), mark, cwd=tmp_path, env=RELAYED | {"TMPDIR": str(short_tmp)})
    try:
        assert wait_for(lambda: len(marked_anywhere(test_hosts, f"^sh -c sleep 60; : {mark}-child")) == 4,
                        within_s=20), "the instances never ran"
        test_hosts.stop_sshd("h1")
        _, err = proc.communicate(timeout=40)
    finally:
        test_hosts.start_sshd("h1")
        settle(test_hosts)

    assert 125 == proc.returncode, err
    assert wait_for(lambda: not marked_anywhere(test_hosts, mark), within_s=5), marked_anywhere(test_hosts, mark)
    assert ([], {}) == nothing_left_here(short_tmp)
    blamed = [line for line in err.splitlines() if "host h2 stopped answering" in line]
    assert [] == blamed, err[-800:]
    assert "host h1, the relay it was reached through, stopped answering" in err, err[-800:]
    assert "Root cause: error[PR411]: host h1 stopped answering" in err, err[-800:]


# --- 6. One host twice ----------------------------------------------------------------------------------------------

LOCAL = ("import json, socket, popdist; c = popdist.current(); "
         "print(json.dumps([socket.gethostname(), c.instance_index, c.local_instance_index]))")


def test_a_host_given_twice_by_the_same_name_is_refused_or_run_once_per_slot(test_hosts: TestHosts,
                                                                              tmp_path: Path) -> None:
    """--host h1,h1,h2: either a diagnostic (no traceback) or every instance on h1 with a local index of its own."""
    done = cli(test_hosts, "--host", "h1,h1,h2", "--num-instances", "4", "--num-replicas", "4", PY, "-c", LOCAL,
               cwd=tmp_path)

    assert "Traceback" not in done.stderr and "internal error" not in done.stderr, done.stderr
    if done.returncode == 0:
        seen = [json.loads(line) for line in done.stdout.splitlines()]
        on_h1 = [local for host, _, local in seen if host == "h1"]
        assert len(on_h1) == len(set(on_h1)), seen


def test_a_host_given_twice_by_two_names_gets_no_clashing_local_indexes(test_hosts: TestHosts, tmp_path: Path) -> None:
    """
    --host h1,10.77.X.11 (h1 by its alias and by its address, as a host file built from two sources has it):
    both names reach one machine, whose instances then both get POPDIST local_instance_index 0 (and the same
    IPUs, the same per-host resources); poprun should see one machine (the topology probe reads its hostname)
    or refuse the list. Harm: two instances fight over one device, a failure far from its cause. The preflight
    asks each host which machine it is (boot and network): PR413 before anything starts.
    """
    address = test_hosts.addresses["h1"]
    done = cli(test_hosts, "--host", f"h1,{address}", "--num-instances", "2", "--num-replicas", "2", PY, "-c", LOCAL,
               cwd=tmp_path)

    assert 125 == done.returncode, done.stderr
    assert f"error[PR413]: hosts 'h1' and '{address}' are one machine" in done.stderr, done.stderr
    assert "" == done.stdout  # nothing ran


# --- 7. No ssh client here ------------------------------------------------------------------------------------------


def test_no_ssh_client_on_path_is_one_line_not_an_internal_error(test_hosts: TestHosts, tmp_path: Path,
                                                                 short_tmp: Path) -> None:
    """
    PATH without `ssh` (a minimal container, a module not loaded): the first connection (prepare's, before
    the port plan) cannot start. Expected: exit 125 with one line that says ssh cannot be started; never
    "internal error", and nothing left in TMPDIR.
    """
    empty = tmp_path / "bin"
    empty.mkdir()
    done = cli(test_hosts, "--host", "h1,h2", "--num-instances", "2", "--num-replicas", "2", "true", cwd=tmp_path,
               env={"PATH": str(empty), "TMPDIR": str(short_tmp)})

    assert 125 == done.returncode, done.stderr
    assert "ssh" in done.stderr and "internal error" not in done.stderr, done.stderr
    assert ([], {}) == nothing_left_here(short_tmp)


def test_a_relative_ssh_config_reaches_the_leaves_through_their_relays(test_hosts: TestHosts, tmp_path: Path) -> None:
    """
    POPRUN_SSH_CONFIG=ssh_config (relative to the directory poprun runs in, which is the same path on every
    host, seed 2.2.4): direct connections read it, but each leaf's `ssh -F ssh_config ...` runs on its relay
    in the login shell's directory ($HOME), where there is no such file: every leaf is PR406 "from its relay",
    while the same launch with POPRUN_SSH_RELAY=off works.
    """
    (tmp_path / "ssh_config").write_text(test_hosts.ssh_config.read_text())
    direct = cli(test_hosts, "--host", "h1,h2,h3,h4", "--num-instances", "4", "--num-replicas", "4", "true",
                 cwd=tmp_path, env={"POPRUN_SSH_CONFIG": "ssh_config", "POPRUN_SSH_RELAY": "off"})
    assert 0 == direct.returncode, direct.stderr

    done = cli(test_hosts, "--host", "h1,h2,h3,h4", "--num-instances", "4", "--num-replicas", "4", "true",
               cwd=tmp_path, env={"POPRUN_SSH_CONFIG": "ssh_config", "POPRUN_SSH_RELAY": "on"})

    assert 0 == done.returncode, done.stderr
