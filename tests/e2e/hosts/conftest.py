"""
The ``test_hosts`` fixture: four emulated ssh hosts (``h1..h4``) for the whole session.

Skips where the machine cannot host them (not root, a tool missing), except under
``POPRUN_CI=1``: CI installs what they need, so there a skip would hide a broken install and fails instead.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.helpers import session_hosts
from tests.e2e.hosts.test_ssh_backend import wait_for
from tests.testhosts import TestHosts

PY = sys.executable


@pytest.fixture(scope="session")
def test_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestHosts]:
    """Bring up hosts h1..h4 once per session; tear them down at its end, whatever happened."""
    yield from session_hosts(tmp_path_factory.mktemp("testhosts"), 4, what="the test hosts")


@pytest.fixture(scope="module")
def fault_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestHosts]:
    """Bring up hosts h1..h3 for one module whose tests take hosts down (the session's hosts stay healthy)."""
    yield from session_hosts(tmp_path_factory.mktemp("faulthosts"), 3, what="the fault-test hosts")


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """Yield a new directory with a short path, for TMPDIR: poprun's ssh sockets are made there only if they fit."""
    path = Path(tempfile.mkdtemp(prefix="pt", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)  # the test's own directory, made just above


@pytest.fixture(autouse=True)
def no_kept_connections(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """
    Close the ssh connections a test's own process kept for a launch that never came (each test starts clean).

    Every ssh backend the test makes is closed at its end, as a command's registry closes its backends.
    """
    from poprun.backends.ssh.backend import SshBackend

    made: list[SshBackend] = []
    init = SshBackend.__init__

    def recorded(self: SshBackend, **options: float) -> None:
        init(self, **options)
        made.append(self)

    monkeypatch.setattr(SshBackend, "__init__", recorded)
    yield
    for backend in made:
        backend.close()


MUTE = ("import socket, sys\n"
        "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
        "s.bind((sys.argv[1], 22)); s.listen(100); held = []\n"
        "while True: held.append(s.accept()[0])\n")


@pytest.fixture
def mute_h4(test_hosts: TestHosts) -> Iterator[str]:
    """Replace h4's sshd with a listener that accepts connections and never answers; restore it after."""
    test_hosts.stop_sshd("h4")
    listener = subprocess.Popen(["ip", "netns", "exec", test_hosts.namespaces["h4"], PY, "-c", MUTE,
                                 test_hosts.addresses["h4"]], stdin=subprocess.DEVNULL)
    try:
        time.sleep(0.5)
        yield "h4"
    finally:
        settle(test_hosts)
        listener.kill()
        listener.wait()
        test_hosts.start_sshd("h4")


def settle(hosts: TestHosts) -> None:
    """
    Wait for the hosts' login shells to finish their start-up (~/.bashrc's `pyenv rehash` here): a session
    SIGKILLed by the hosts' teardown in the middle of it leaves pyenv's lock, which then stalls every ssh
    session on this machine for 60 s.
    """
    wait_for(lambda: not any(hosts.processes(name, "pyenv-rehash|bash -c") for name in hosts.names), within_s=15)
