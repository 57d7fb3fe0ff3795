"""The emulated ssh hosts themselves: names, reachability, process listing and a clean ``down``."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.testhosts import TestHosts, down, up

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]


def living_command_lines() -> list[str]:
    """Return the command lines of every living process (zombies are dead)."""
    lines = []
    for entry in os.scandir("/proc"):
        try:
            if entry.name.isdigit() and Path(entry.path, "stat").read_bytes().rsplit(b")", 1)[1].split()[0] != b"Z":
                lines.append(Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except (OSError, IndexError):
            continue
    return lines


def test_every_host_answers_with_its_own_name(test_hosts: TestHosts) -> None:
    """`ssh hN hostname` prints hN, and the session comes from the bridge to hN's own address."""
    with ThreadPoolExecutor() as pool:
        answers = dict(zip(test_hosts.names, pool.map(lambda name: test_hosts.ssh(name, "hostname; echo $SSH_CONNECTION"),
                                                      test_hosts.names), strict=True))

    for name, done in answers.items():
        assert 0 == done.returncode, done.stderr
        hostname, connection = done.stdout.splitlines()
        assert name == hostname
        assert test_hosts.addresses[name] == connection.split()[2]


def test_hosts_reach_each_other_with_the_same_ssh_config(test_hosts: TestHosts) -> None:
    """h1 reaches h2 by its alias, through the same ssh_config and known_hosts."""
    done = test_hosts.ssh("h1", f"ssh -F {test_hosts.ssh_config} h2 hostname")

    assert (0, "h2") == (done.returncode, done.stdout.strip()), done.stderr


def test_env_points_clients_at_the_hosts(test_hosts: TestHosts) -> None:
    """env() names the ssh_config for poprun and mpirun, and keeps OpenMPI's TCP on the hosts' subnet."""
    env = test_hosts.env()

    assert str(test_hosts.ssh_config) == env["POPRUN_SSH_CONFIG"]
    assert f"-F {test_hosts.ssh_config}" == env["OMPI_MCA_plm_rsh_args"]
    assert test_hosts.subnet == env["OMPI_MCA_oob_tcp_if_include"] == env["OMPI_MCA_btl_tcp_if_include"]
    prefix = test_hosts.subnet.removesuffix("0/24")
    assert all(address.startswith(prefix) for address in test_hosts.addresses.values())


def test_processes_sees_a_process_only_on_its_host(test_hosts: TestHosts) -> None:
    """
    GIVEN a sleep left running in the background on h2
    WHEN the processes of h1 and h2 are listed
    THEN only h2 has it
    """
    # GIVEN
    started = test_hosts.ssh("h2", "nohup sleep 271.828 >/dev/null 2>&1 </dev/null &")
    assert 0 == started.returncode, started.stderr
    try:
        # WHEN (nohup execs sleep a moment after ssh returned: on a busy machine, later)
        deadline = time.monotonic() + 10
        while not test_hosts.processes("h2", r"^sleep 271\.828") and time.monotonic() < deadline:
            time.sleep(0.05)
        on_h1 = test_hosts.processes("h1", r"^sleep 271\.828")
        on_h2 = test_hosts.processes("h2", r"^sleep 271\.828")

        # THEN
        assert [] == on_h1
        assert 1 == len(on_h2)
        assert on_h2[0].endswith("sleep 271.828")
    finally:
        for line in test_hosts.processes("h2", r"^sleep 271\.828"):
            os.kill(int(line.split()[0]), signal.SIGKILL)


def test_down_leaves_nothing_behind(tmp_path: Path, test_hosts: TestHosts) -> None:
    """
    GIVEN a second, separate set of one host, beside the session's
    WHEN it is taken down (twice: down is idempotent)
    THEN no namespace, link, sshd or file of it is left, and the session's hosts still answer
    """
    # GIVEN
    state = tmp_path / "second"
    second = up(1, state)
    assert second.subnet != test_hosts.subnet
    assert second.bridge != test_hosts.bridge

    # WHEN
    down(state)
    down(state)

    # THEN
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    assert second.namespaces["h1"] not in namespaces
    assert second.bridge not in links
    assert second.bridge.replace("ptb", "pt") not in links  # the veths
    assert [] == [line for line in living_command_lines() if str(state) in line]
    assert not state.exists()
    assert "h1" == test_hosts.ssh("h1", "hostname").stdout.strip()


def test_hosts_of_a_killed_process_are_taken_down(tmp_path: Path) -> None:
    """
    GIVEN two hosts brought up by a process (with up()'s guard)
    WHEN that process is SIGKILLed, so that it never calls down()
    THEN the guard takes them down: no namespace, sshd or state directory is left
    """
    # GIVEN
    state = tmp_path / "killed"
    script = ("import sys, time; from pathlib import Path; from tests.testhosts import up; "
              "hosts = up(2, Path(sys.argv[1])); print(hosts.namespaces['h1'], flush=True); time.sleep(60)")
    with subprocess.Popen([sys.executable, "-c", script, str(state)], stdout=subprocess.PIPE, text=True,
                          cwd=Path(__file__).parents[3]) as owner:
        assert owner.stdout is not None
        namespace = owner.stdout.readline().strip()
        assert namespace.startswith("poprun-")

        # WHEN
        owner.kill()
    deadline = time.monotonic() + 20
    while state.exists() and time.monotonic() < deadline:
        time.sleep(0.05)

    # THEN
    namespaces = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    assert namespace not in namespaces
    while [line for line in living_command_lines() if str(state) in line] and time.monotonic() < deadline:
        time.sleep(0.05)  # the guard removes the state, then exits
    assert [] == [line for line in living_command_lines() if str(state) in line]
    assert not state.exists()
