"""
--distribute-ssh-key with hosts that only know a password: poprun asks for it once, on its terminal.

Two extra sshd (in h3's and h4's namespaces, port 2222) accept a password for a throwaway user;
poprun makes a key, asks the password once for both hosts, copies the key with ssh-copy-id, and
the launch then logs in with the key alone.
"""

from __future__ import annotations

import os
import pty
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

SSHD_CONFIG = """\
Port 2222
ListenAddress {address}
HostKey {key}
PidFile {pid}
PubkeyAuthentication yes
PasswordAuthentication yes
KbdInteractiveAuthentication no
PermitRootLogin no
AllowUsers {user}
StrictModes no
UsePAM no
"""


@pytest.fixture
def password_hosts(test_hosts: TestHosts, tmp_path: Path) -> Iterator[tuple[Path, str, str]]:
    """Yield an ssh_config naming pw3 and pw4 (sshd that know only a new user's password), the user and the password."""
    user, password = f"pop{secrets.token_hex(3)}", secrets.token_urlsafe(12)
    home = Path(tempfile.mkdtemp(prefix="poprun-test-home-"))  # not under tmp_path: the user must reach it
    subprocess.run(["useradd", "-M", "-d", str(home), "-s", "/bin/sh", user], check=True)
    subprocess.run(["chown", user, str(home)], check=True)
    subprocess.run(["chpasswd"], input=f"{user}:{password}\n", text=True, check=True)
    known, config, pids = tmp_path / "known_hosts", tmp_path / "ssh_config", []
    try:
        for name in ("h3", "h4"):
            key, address = tmp_path / f"host_{name}", test_hosts.addresses[name]
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
            (tmp_path / f"sshd_{name}").write_text(SSHD_CONFIG.format(address=address, key=key, user=user,
                                                                      pid=tmp_path / f"sshd_{name}.pid"))
            subprocess.run(["ip", "netns", "exec", test_hosts.namespaces[name], "/usr/sbin/sshd", "-f",
                            str(tmp_path / f"sshd_{name}")], check=True)
            pids.append(tmp_path / f"sshd_{name}.pid")
            with known.open("a") as out:
                out.write(f"[{address}]:2222 {(tmp_path / f'host_{name}.pub').read_text()}")
        config.write_text("".join(f"Host pw{n}\n  HostName {test_hosts.addresses[f'h{n}']}\n" for n in (3, 4))
                          + f"Host *\n  Port 2222\n  User {user}\n  StrictHostKeyChecking yes\n"
                          f"  UserKnownHostsFile {known}\n  IdentityFile {tmp_path / 'keys' / 'id_ed25519'}\n"
                          "  IdentitiesOnly yes\n  LogLevel ERROR\n")
        _wait_for_pids(pids)
        yield config, user, password
    finally:
        for pid in pids:
            if pid.exists():
                subprocess.run(["kill", pid.read_text().strip()], check=False)
        subprocess.run(["userdel", user], check=False)
        shutil.rmtree(home, ignore_errors=True)


def _wait_for_pids(pids: list[Path]) -> None:
    deadline = time.monotonic() + 5
    while not all(p.exists() for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)


def test_password_is_asked_once_for_every_host_then_the_key_logs_in(password_hosts: tuple[Path, str, str],
                                                                      tmp_path: Path) -> None:
    """One prompt for pw3 and pw4; after it both instances run there as that user, logged in with the new key."""
    config, user, password = password_hosts
    local_home = tmp_path / "local-home"
    local_home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POPRUN_", "SSH_"))} | {
        "POPRUN_SSH_CONFIG": str(config), "HOME": str(local_home)}
    command = [sys.executable, "-m", "poprun.cli.main", "--host", "pw3,pw4", "--num-instances", "2",
               "--num-replicas", "2", "--distribute-ssh-key=yes", f"--distribute-ssh-key-path={tmp_path / 'keys'}",
               "--distribute-ssh-key-type=ed25519", "sh", "-c", 'echo "ran $POPDIST_INSTANCE_INDEX as $(id -un)"']

    status, transcript = _run_on_a_terminal(command, env=env, cwd="/tmp", answer=password)

    assert 0 == status, transcript
    assert 1 == transcript.count("poprun: password for pw3, pw4"), transcript
    assert [("0", user), ("1", user)] == sorted(re.findall(r"ran (\d) as (\w+)", transcript))  # among status lines
    assert (tmp_path / "keys" / "id_ed25519").is_file()


def _run_on_a_terminal(command: list[str], *, env: dict[str, str], cwd: str, answer: str) -> tuple[int, str]:
    """Run ``command`` on a pty; type ``answer`` at the first password prompt; return its status and all it wrote."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: run poprun on the terminal
        os.chdir(cwd)
        os.execve(command[0], command, env)  # noqa: S606 - the test's own command line
    seen, answered, deadline = b"", False, time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: poprun has ended
            break
        if not chunk:
            break
        seen += chunk
        if not answered and b"password for" in seen:
            os.write(fd, answer.encode() + b"\n")
            answered = True
    os.close(fd)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status), seen.decode(errors="replace").replace("\r\n", "\n")
