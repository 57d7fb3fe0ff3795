"""
Adversarial checks, second battery: the preflight's machine id (PR413), the control directory's
masters and stale sockets, and restarts through the ssh backend, on the namespace hosts.

Each test guards a failure found when it was written, or what held.
"""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest

from poprun.backends.ssh import client as ssh_client
from tests.e2e.hosts.test_adversarial_ssh import GREETER, greeting_user  # noqa: F401 - a fixture
from tests.e2e.hosts.test_scale_adversarial import cli, nothing_left_here
from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]


@pytest.mark.parametrize("relay", ["off", "on"])
def test_four_namespace_hosts_two_instances_each_are_never_one_machine(test_hosts: TestHosts, tmp_path: Path,
                                                                        short_tmp: Path, relay: str) -> None:
    """h1..h4 (two instances each, relayed or not) are four machines: no PR413, and no id line in any output."""
    done = cli(test_hosts, "--host", "h1,h2,h3,h4", "--num-instances", "8", "--num-replicas", "8", "sh", "-c",
               "echo ran", cwd=tmp_path, env={"POPRUN_SSH_RELAY": relay, "POPRUN_SSH_FANOUT": "2",
                                              "TMPDIR": str(short_tmp)})
    assert done.returncode == 0, done.stderr
    assert "PR413" not in done.stderr
    assert "poprun-preflight" not in done.stdout + done.stderr
    assert done.stdout.count("ran") == 8, done.stdout
    assert nothing_left_here(short_tmp) == ([], {})


def test_an_alias_and_the_address_of_one_host_are_pr413_and_nothing_starts(test_hosts: TestHosts,
                                                                            tmp_path: Path) -> None:
    """Guard: h1 and its address (one sshd, one namespace) are one machine: PR413, 125, nothing ran."""
    mark = tmp_path / f"ran-{uuid.uuid4().hex[:6]}"
    done = cli(test_hosts, "--host", f"h1,{test_hosts.addresses['h1']}", "--num-instances", "2",
               "--num-replicas", "2", "sh", "-c", f"touch {mark}", cwd=tmp_path)
    assert done.returncode == 125, done.stderr
    assert "PR413" in done.stderr
    assert not mark.exists()


@pytest.fixture
def id_greeter(greeting_user: Path) -> Path:  # noqa: F811 - the fixture imported above
    """The greeting user, whose shared ~/.bashrc prints a line that holds "poprun-preflight id" (one text, every host)."""
    home = Path("/home") / GREETER
    (home / ".bashrc").write_text('echo "note: poprun-preflight id shared home"\n')
    return greeting_user


def test_a_greeting_holding_the_id_mark_does_not_make_two_hosts_one_machine(test_hosts: TestHosts, tmp_path: Path,
                                                                            id_greeter: Path) -> None:
    """
    The user's ~/.bashrc (a shared home) prints one and the same line containing "poprun-preflight id x y"
    on every host. poprun's `_machine` reads the first id line of the answer, the greeting's, not its own
    check's (the last): h1 and h2 are refused as "one machine" (PR413, exit 125) and nothing runs.
    """
    done = cli(test_hosts, "--host", "h1,h2", "--num-instances", "2", "--num-replicas", "2", "sh", "-c",
               "echo ran", cwd=tmp_path, env={"POPRUN_SSH_CONFIG": str(id_greeter)})
    assert "PR413" not in done.stderr, done.stderr
    assert done.returncode == 0, done.stderr


def test_a_restart_of_all_through_ssh_leaves_nothing(test_hosts: TestHosts, tmp_path: Path, short_tmp: Path) -> None:
    """--max-restarts 1 (scope all), the instance on h2 fails both times: two attempts, status 3, nothing left."""
    done = cli(test_hosts, "--host", "h1,h2", "--num-instances", "2", "--num-replicas", "2", "--max-restarts", "1",
               "--restart-scope", "all", "--restart-backoff", "0", "sh", "-c",
               'echo "try $POPDIST_INSTANCE_INDEX"; [ "$POPDIST_INSTANCE_INDEX" = 1 ] && exit 3; sleep 1',
               cwd=tmp_path, env={"TMPDIR": str(short_tmp)})
    assert done.returncode == 3, done.stderr
    assert done.stdout.count("try 1") == 2, done.stdout + done.stderr
    assert "poprun-preflight" not in done.stdout + done.stderr
    assert nothing_left_here(short_tmp) == ([], {})


def test_clear_stale_leaves_symlinks_files_and_live_sockets(tmp_path: Path) -> None:
    """_clear_stale removes only dead sockets in its own directory: a symlink to a dead socket elsewhere,
    a plain file and a listening socket stay; the dead socket elsewhere is untouched."""
    import socket

    client = ssh_client.SshClient()
    try:
        directory = Path(client.directory)
        outside = tmp_path / "o.sock"
        dead = socket.socket(socket.AF_UNIX)
        dead.bind(str(outside))
        dead.close()  # a socket file nobody listens on
        (directory / "link").symlink_to(outside)
        (directory / "plain").write_text("x")
        live = socket.socket(socket.AF_UNIX)
        live.bind(str(directory / "live"))
        live.listen(1)
        gone = socket.socket(socket.AF_UNIX)
        gone.bind(str(directory / "gone"))
        gone.close()
        client._clear_stale()
        assert sorted(p.name for p in directory.iterdir()) == ["link", "live", "plain"]
        assert outside.exists()
        live.close()
    finally:
        client.close()


def test_close_of_one_client_kills_no_master_of_another(test_hosts: TestHosts) -> None:
    """Two clients in one process (two runs at once): closing one leaves the other's masters up."""
    env = test_hosts.env()
    first = ssh_client.SshClient(config=env["POPRUN_SSH_CONFIG"])
    second = ssh_client.SshClient(config=env["POPRUN_SSH_CONFIG"])
    try:
        assert first.connect([("h1", 0)], timeout_s=10) == {}
        assert second.connect([("h1", 0)], timeout_s=10) == {}
        first.close()
        assert second.usable("h1")
        assert second.connected("h1")
        first_dir = first.directory
        assert not Path(first_dir).exists()
        assert subprocess.run(second.argv("h1", "echo hi"), capture_output=True, text=True, timeout=10,
                              check=False, stdin=subprocess.DEVNULL).stdout == "hi\n"
    finally:
        first.close()
        second.close()
