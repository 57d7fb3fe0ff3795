"""The ssh backend when a host fails mid-run, and what it must never do to a user's data and secrets."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.hosts.test_ssh_backend import PY, SLEEPER, marked_anywhere, poprun, wait_for
from tests.golden.harness import assert_golden
from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

GOLDEN = Path(__file__).parent / "golden"
HOST_TIMEOUT_S = 3  # POPRUN_HOST_TIMEOUT in these tests: a lost host is noticed in 3 s and a few more


def command_lines() -> dict[int, bytes]:
    """Return {pid: argv as it is in /proc} of every process on this machine (the hosts' too: one PID namespace)."""
    found = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                found[int(entry.name)] = Path(entry.path, "cmdline").read_bytes()
            except OSError:
                continue
    return found


def running(mark: str) -> str:
    """Return the pattern of SLEEPER's child with ``mark``: there only once the program runs (not in a shell's text)."""
    return f"^sh -c sleep 60; : {mark}-child"


def ssh_clients_left(tmp: Path) -> dict[int, bytes]:
    """Return the ssh clients of a poprun run with TMPDIR=``tmp`` still alive here (their ControlPath is there)."""
    needle = os.fsencode(tmp / "poprun-ssh-")
    return {pid: line for pid, line in command_lines().items() if needle in line}


@pytest.fixture
def link_down(test_hosts: TestHosts) -> Iterator[list[str]]:
    """Yield a list to put host names in whose links the test took down; bring them up again after."""
    names: list[str] = []
    try:
        yield names
    finally:
        for name in names:
            test_hosts.set_link(name, up=True)
        for name in names:  # the session's hosts must answer again for the tests after this one
            assert wait_for(lambda n=name: test_hosts.ssh(n, "true", timeout=10).returncode == 0, within_s=20)


@pytest.mark.parametrize("backend", ["ssh", "mpirun"])
def test_a_forwarded_secret_is_on_no_command_line_here_or_on_the_hosts(test_hosts: TestHosts, tmp_path: Path,
                                                                        backend: str) -> None:
    """-x TOKEN, and a set value given in a file: while the instances run, no process anywhere shows either."""
    secret, other = f"tok-{uuid.uuid4().hex}", f"val-{uuid.uuid4().hex}"
    program = 'printf "%s %s\\n" "$TOKEN" "$OTHER_SECRET"; echo ready; sleep 3'
    spec = tmp_path / "launch.toml"
    spec.write_text(f'[env]\nforward = ["TOKEN"]\nset = {{ OTHER_SECRET = "{other}" }}\n')
    proc = subprocess.Popen([PY, "-m", "poprun.cli.main", "apply", str(spec), "--backend", backend,
                             "--host", "h1,h2,h3", "--num-instances", "3", "--num-replicas", "3", "sh", "-c", program],
                            cwd=tmp_path, env=os.environ | test_hosts.env() | {"TOKEN": secret},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    lines = [proc.stdout.readline() for _ in range(6)]
    assert 3 == lines.count("ready\n"), lines
    secrets = (secret, other) if backend == "ssh" else (secret,)  # mpirun: set values by -x NAME=VALUE (its argv)
    seen = {pid: line for pid, line in command_lines().items()
            if any(s.encode() in line for s in secrets) and pid != proc.pid}
    _, err = proc.communicate(timeout=30)

    assert {} == seen
    assert (0, 3) == (proc.returncode, lines.count(f"{secret} {other}\n")), err


def test_a_fixed_cache_named_like_a_temporary_one_survives_on_every_host(test_hosts: TestHosts,
                                                                           tmp_path: Path) -> None:
    """--executable-cache-path DIR/poprun-cache-mine holding a file: after a launch on 4 hosts, it is all there."""
    cache = tmp_path / "poprun-cache-mine"
    cache.mkdir()
    (cache / "model.popef").write_text("compiled")
    done = poprun(test_hosts, "--host", ",".join(test_hosts.names), "--num-instances", "4", "--num-replicas", "4",
                  f"--executable-cache-path={cache}", "sh", "-c", 'test -d "$POPDIST_EXECUTABLE_CACHE_PATH"',
                  cwd=tmp_path)

    assert 0 == done.returncode, done.stderr
    assert "compiled" == (cache / "model.popef").read_text()
    for name in test_hosts.names:
        assert "compiled" == test_hosts.ssh(name, f"cat {cache}/model.popef").stdout


def test_a_host_whose_link_goes_down_is_named_and_everything_else_stops(test_hosts: TestHosts, tmp_path: Path,
                                                                          link_down: list[str], short_tmp: Path) -> None:
    """h2's link goes down mid-run: PR411 names h2, exit 125, and no process of the launch is left anywhere."""
    mark = f"poprun-mark-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen([PY, "-m", "poprun.cli.main", "--host", "h1,h2,h3", "--num-instances", "3",
                             "--num-replicas", "3", "sh", "-c", SLEEPER.format(mark=mark), mark], cwd=tmp_path,
                            env=os.environ | test_hosts.env() | {"POPRUN_HOST_TIMEOUT": str(HOST_TIMEOUT_S),
                                                                 "TMPDIR": str(short_tmp)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert wait_for(lambda: len(marked_anywhere(test_hosts, running(mark))) == 3, within_s=20), "the instances never ran"
    assert ssh_clients_left(short_tmp), "the check below would see nothing"
    link_down.append("h2")
    test_hosts.set_link("h2", up=False)
    cut = time.monotonic()
    _, err = proc.communicate(timeout=60)
    noticed = time.monotonic() - cut

    root = next(line for line in err.splitlines() if line.startswith("Root cause:"))
    assert_golden(GOLDEN / "PR411_host_link_down_mid_run", f"{root}\nexit {proc.returncode}\n")
    assert re.search(r"instance 1 on h2 \(PID \d+\): lost: host h2 stopped answering", err), err
    assert noticed < HOST_TIMEOUT_S + 10, noticed
    assert wait_for(lambda: not ssh_clients_left(short_tmp), within_s=2), ssh_clients_left(short_tmp)
    # h2's instance is killed there too: its wrapper heard no heartbeat for the host timeout
    assert wait_for(lambda: not marked_anywhere(test_hosts, mark), within_s=HOST_TIMEOUT_S + 5), \
        marked_anywhere(test_hosts, mark)


def test_interrupt_while_a_host_is_unreachable_ends_within_the_grace_period(test_hosts: TestHosts, tmp_path: Path,
                                                                             link_down: list[str]) -> None:
    """Ctrl-C right after h2's link went down: poprun ends within its 5 s grace and a few seconds, nothing left."""
    mark = f"poprun-mark-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen([PY, "-m", "poprun.cli.main", "--host", "h1,h2", "--num-instances", "2",
                             "--num-replicas", "2", "sh", "-c", SLEEPER.format(mark=mark), mark], cwd=tmp_path,
                            env=os.environ | test_hosts.env() | {"POPRUN_HOST_TIMEOUT": str(HOST_TIMEOUT_S)},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert wait_for(lambda: len(marked_anywhere(test_hosts, running(mark))) == 2, within_s=20), "the instances never ran"
    link_down.append("h2")
    test_hosts.set_link("h2", up=False)
    proc.send_signal(signal.SIGINT)
    interrupted = time.monotonic()
    proc.communicate(timeout=60)

    assert 130 == proc.returncode
    assert time.monotonic() - interrupted < 5 + 4
    assert wait_for(lambda: not marked_anywhere(test_hosts, mark), within_s=HOST_TIMEOUT_S + 5), \
        marked_anywhere(test_hosts, mark)


def test_a_host_whose_ssh_server_dies_is_named_at_once(test_hosts: TestHosts, tmp_path: Path, short_tmp: Path) -> None:
    """h3's sshd is killed mid-run: poprun names h3 (PR411) well within the host timeout, nothing is left anywhere."""
    mark = f"poprun-mark-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen([PY, "-m", "poprun.cli.main", "--host", "h1,h3", "--num-instances", "4",
                             "--num-replicas", "4", "sh", "-c", SLEEPER.format(mark=mark), mark], cwd=tmp_path,
                            env=os.environ | test_hosts.env() | {"TMPDIR": str(short_tmp)}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: sum(map(len, marked_anywhere(test_hosts, running(mark)).values())) == 4,
                        within_s=20), "the instances never ran"
        assert ssh_clients_left(short_tmp), "the check below would see nothing"
        test_hosts.stop_sshd("h3")
        cut = time.monotonic()
        _, err = proc.communicate(timeout=60)
        noticed = time.monotonic() - cut
    finally:
        test_hosts.start_sshd("h3")

    assert 125 == proc.returncode, err
    assert "Root cause: error[PR411]: host h3 stopped answering" in err
    assert noticed < 5 + 3, noticed  # at once: the connection closed, then the others' grace period
    assert wait_for(lambda: not ssh_clients_left(short_tmp), within_s=2), ssh_clients_left(short_tmp)
    assert wait_for(lambda: not marked_anywhere(test_hosts, mark), within_s=3), marked_anywhere(test_hosts, mark)


def test_piped_stdin_reaches_instance_0_on_another_host_and_no_other(test_hosts: TestHosts, tmp_path: Path) -> None:
    """printf ... | poprun: instance 0 on h1 reads every byte to its end; instance 1 on h2 reads nothing."""
    data = "".join(f"line {i} 'quoted' $(not run)\n" for i in range(2000)) + "no newline at the end"
    program = 'n=$(wc -c); echo "instance $POPDIST_INSTANCE_INDEX read $n bytes"'
    before = set(Path("/tmp").glob("poprun-stdin-*"))
    done = subprocess.run([PY, "-m", "poprun.cli.main", "--host", "h1,h2", "--num-instances", "2", "--num-replicas",
                           "2", "sh", "-c", program], cwd=tmp_path, env=os.environ | test_hosts.env(), input=data,
                          capture_output=True, text=True, timeout=60, check=False)

    assert 0 == done.returncode, done.stderr
    assert {f"instance 0 read {len(data.encode())} bytes", "instance 1 read 0 bytes"} == set(done.stdout.splitlines())

    def left() -> set[Path]:  # other work on the machine may hold a FIFO of its own a while
        return set(Path("/tmp").glob("poprun-stdin-*")) - before

    assert wait_for(lambda: not left(), within_s=15), f"the FIFO's directory is left on the host: {left()}"


def signal_on(hosts: TestHosts, name: str, pattern: str, sig: signal.Signals) -> list[str]:
    """Send ``sig`` to each process on host ``name`` whose command line matches ``pattern``; return them."""
    found = hosts.processes(name, pattern)
    for line in found:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(line.split()[0]), sig)
    return found


@pytest.mark.parametrize(("relay", "host"), [("direct", "h4"), ("relayed", "h4"), ("relayed", "h3")],
                         ids=["direct", "leaf", "relay"])
def test_a_frozen_host_is_named_and_keeps_nothing(test_hosts: TestHosts, tmp_path: Path, short_tmp: Path,
                                                  relay: str, host: str) -> None:
    """
    Every sshd of a host and its instance are SIGSTOPped mid-run (a hung host, not a dead one): PR411 names
    it within the host timeout and a few seconds, exit 125, and its wrapper kills the frozen instance there.
    Through relays (h3 relays for h4), a frozen leaf is named as a direct host is; a frozen relay for its leaf too.
    """
    mark = f"poprun-mark-{uuid.uuid4().hex[:8]}"
    program = f"^sh -c sh -c 'sleep 60; :' {mark}-child"
    proc = subprocess.Popen([PY, "-m", "poprun.cli.main", "--host", ",".join(test_hosts.names), "--num-instances", "4",
                             "--num-replicas", "4", "sh", "-c", SLEEPER.format(mark=mark), mark], cwd=tmp_path,
                            env=os.environ | test_hosts.env() | {"POPRUN_HOST_TIMEOUT": str(HOST_TIMEOUT_S),
                                                                 "TMPDIR": str(short_tmp),
                                                                 "POPRUN_SSH_RELAY": "on" if relay == "relayed" else "off"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: len(marked_anywhere(test_hosts, running(mark))) == 4, within_s=30), "never ran"
        assert signal_on(test_hosts, host, f"^sshd|{program}|{running(mark)}", signal.SIGSTOP)
        cut = time.monotonic()
        _, err = proc.communicate(timeout=60)
        noticed = time.monotonic() - cut
        assert 125 == proc.returncode, err
        assert f"Root cause: error[PR411]: host {host} stopped answering (" in err, err
        assert {"h4": 1, "h3": 2}[host] == len(re.findall(rf"lost: host {host}\b", err)), err
        assert noticed < HOST_TIMEOUT_S + 10, noticed
        assert wait_for(lambda: not ssh_clients_left(short_tmp), within_s=2), ssh_clients_left(short_tmp)
        assert wait_for(lambda: not marked_anywhere(test_hosts, mark), within_s=HOST_TIMEOUT_S + 5), \
            marked_anywhere(test_hosts, mark)
    finally:
        proc.kill()
        proc.wait()
        signal_on(test_hosts, host, "^sshd", signal.SIGCONT)
        signal_on(test_hosts, host, mark, signal.SIGKILL)  # what a failed check left


def holding(hosts: TestHosts, name: str, needle: str) -> list[str]:
    """Return the processes of host ``name`` with an open file whose path holds ``needle``."""
    found = []
    for line in hosts.processes(name, "."):
        pid = line.split()[0]
        with contextlib.suppress(OSError):
            if any(needle in str(fd.readlink()) for fd in Path(f"/proc/{pid}/fd").iterdir()):
                found.append(line)
    return found


def test_the_copy_of_stdin_on_a_lost_host_ends_too(test_hosts: TestHosts, tmp_path: Path,
                                                    link_down: list[str]) -> None:
    """poprun's stdin stays open, instance 0 on h1; h1's link goes down: nothing on h1 keeps its stdin FIFO (the copy ends)."""
    mark = f"poprun-mark-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen([PY, "-m", "poprun.cli.main", "--host", "h1,h2", "--num-instances", "2",
                             "--num-replicas", "2", "sh", "-c", SLEEPER.format(mark=mark), mark], cwd=tmp_path,
                            env=os.environ | test_hosts.env() | {"POPRUN_HOST_TIMEOUT": str(HOST_TIMEOUT_S)},
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert wait_for(lambda: len(marked_anywhere(test_hosts, running(mark))) == 2, within_s=20), "never ran"
        assert wait_for(lambda: holding(test_hosts, "h1", "/poprun-stdin-"), within_s=10), "no copy of stdin to see"
        link_down.append("h1")
        test_hosts.set_link("h1", up=False)
        assert proc.stdout is not None and proc.stderr is not None
        proc.wait(timeout=60)
        err = proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()
        for pipe in (proc.stdin, proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()

    assert 125 == proc.returncode, err
    assert "Root cause: error[PR411]: host h1 stopped answering" in err, err
    assert wait_for(lambda: not marked_anywhere(test_hosts, mark), within_s=HOST_TIMEOUT_S + 5)
    assert wait_for(lambda: not holding(test_hosts, "h1", "/poprun-stdin-"), within_s=HOST_TIMEOUT_S + 5), \
        holding(test_hosts, "h1", "/poprun-stdin-")
