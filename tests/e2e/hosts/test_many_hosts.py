"""
Launching on 16 hosts at once (the ssh backend): every instance on its planned host, nothing left behind.

The largest host count that fits CI's time. Each host is a network namespace with its own
sshd and hostname (``tests/testhosts.py``), so an instance's ``hostname`` says where it really
ran. Leftovers are looked for everywhere a launch leaves things: processes on the hosts
(found by the run's id in their environment or the launch's mark in their command line),
poprun's ssh connections here (their sockets are in the test's own TMPDIR), and files in
that TMPDIR, in /tmp (the directory of instance 0's stdin, named by the instance) and in the
hosts' state.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.helpers import session_hosts
from tests.e2e.hosts.test_ssh_backend import wait_for
from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

HOSTS = 16
# Each instance prints where it ran: its hostname (each host has its own), its index, the run's id and what its
# stdin is (instance 0's is a FIFO in the directory the ssh backend makes for it in /tmp; the others' /dev/null).
PROGRAM = 'echo "$(hostname) $POPDIST_INSTANCE_INDEX $POPRUN_RUN_ID $(readlink /proc/$$/fd/0)"'


@pytest.fixture(scope="module")
def many_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestHosts]:
    """Bring up hosts h1..h16 for this module; take them down at its end, whatever happened."""
    yield from session_hosts(tmp_path_factory.mktemp("manyhosts"), HOSTS, what=f"the {HOSTS} hosts")


def launch(hosts: TestHosts, instances: int, *, cwd: Path, tmpdir: Path,
           env: dict[str, str] | None = None) -> tuple[subprocess.CompletedProcess[str], dict[int, str], str]:
    """
    Plan, then launch, ``poprun --host h1,...,h16 --num-instances N --num-replicas N sh -c PROGRAM MARK``.

    Returns what the launch did, the plan's host of each instance index, and the launch's mark
    (the program's ``$0``: in the command line of every process of an instance).
    """
    mark = f"many-hosts-{uuid.uuid4().hex[:10]}"
    args = ["--host", ",".join(hosts.names), "--num-instances", str(instances), "--num-replicas", str(instances),
            "sh", "-c", PROGRAM, mark]
    full_env = os.environ | hosts.env() | {"TMPDIR": str(tmpdir), "POPRUN_RUNS_DIR": str(cwd / "runs")} | (env or {})
    planned = subprocess.run([sys.executable, "-m", "poprun.cli.main", "plan", "--format", "json", *args], cwd=cwd,
                             env=full_env, capture_output=True, text=True, timeout=60, check=False)
    assert 0 == planned.returncode, planned.stderr
    plan = {instance["index"]: instance["host"] for instance in json.loads(planned.stdout)["instances"]}
    done = subprocess.run([sys.executable, "-m", "poprun.cli.main", *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=180, check=False, stdin=subprocess.DEVNULL)
    return done, plan, mark


def run_processes(hosts: TestHosts, run_id: str, mark: str) -> dict[str, list[str]]:
    """Return, by host, the living processes of the run: its id in their environment, or its mark in their command line."""
    from tests.testhosts import _netns_inode, _processes_in  # the hosts' own process listing

    needle = f"POPRUN_RUN_ID={run_id}\0".encode()
    found: dict[str, list[str]] = {}
    for name, netns in hosts.namespaces.items():
        for pid, (_, line) in _processes_in({_netns_inode(netns)}).items():
            try:
                environ = Path(f"/proc/{pid}/environ").read_bytes()
            except OSError:
                continue  # gone meanwhile
            if mark in line or (run_id and needle in environ):
                found.setdefault(name, []).append(f"{pid} {line}")
    return found


def processes_here(text: str) -> list[str]:
    """Return ``"PID COMMAND LINE"`` of every living process whose command line holds ``text`` (e.g. ssh's ControlPath)."""
    found = []
    for entry in os.scandir("/proc"):
        try:
            if entry.name.isdigit() and int(entry.name) != os.getpid():
                line = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                state = Path(entry.path, "stat").read_bytes().rsplit(b")", 1)[1].split()[0]
                if text in line and state != b"Z":
                    found.append(f"{entry.name} {line}")
        except (OSError, IndexError):
            continue
    return found


def names_in(folder: Path) -> list[str]:
    """Return the names in ``folder``, sorted."""
    return sorted(path.name for path in folder.iterdir())


def check_launch(hosts: TestHosts, instances: int, *, cwd: Path, tmpdir: Path, env: dict[str, str] | None = None) -> None:
    """Launch ``instances`` over the 16 hosts; assert each ran on its planned host and that nothing was left behind."""
    # GIVEN
    state_before = names_in(hosts.state)

    # WHEN
    done, plan, mark = launch(hosts, instances, cwd=cwd, tmpdir=tmpdir, env=env)

    # THEN every instance ran once, on the host the plan put it on
    assert 0 == done.returncode, done.stderr[-3000:]
    seen = [line.split() for line in done.stdout.splitlines() if line.strip()]
    assert sorted(plan) == sorted(int(index) for _, index, _, _ in seen), done.stdout
    assert plan == {int(index): host for host, index, _, _ in seen}
    assert set(hosts.names) == set(plan.values())
    run_ids = {run_id for _, _, run_id, _ in seen}
    assert 1 == len(run_ids) and re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{6}", next(iter(run_ids))), run_ids
    run_id = run_ids.pop()

    # THEN nothing of it is left: no process on any host, no ssh connection here, no file
    assert wait_for(lambda: not run_processes(hosts, run_id, mark), within_s=3), run_processes(hosts, run_id, mark)
    assert wait_for(lambda: not processes_here(str(tmpdir)), within_s=3), processes_here(str(tmpdir))
    assert [] == names_in(tmpdir)
    made = {Path(stdin).parent for _, _, _, stdin in seen if stdin != "/dev/null"}
    assert wait_for(lambda: not [path for path in made if path.exists()], within_s=3), made
    assert state_before == names_in(hosts.state)


@pytest.mark.parametrize("per_host", [1, 2], ids=["16-instances", "32-instances"])
def test_every_instance_runs_on_its_planned_host_of_16_and_nothing_is_left(
        many_hosts: TestHosts, tmp_path: Path, short_tmp: Path, per_host: int) -> None:
    """16 hosts, 1 or 2 instances each: exit 0, each instance on its planned host, nothing left anywhere."""
    check_launch(many_hosts, HOSTS * per_host, cwd=tmp_path, tmpdir=short_tmp)


def accepted_from(hosts: TestHosts) -> dict[str, list[str]]:
    """Return, by host, the client addresses of the ssh logins its sshd accepted so far (from its log)."""
    return {name: re.findall(r"Accepted \S+ for \S+ from (\S+)", (hosts.state / f"sshd_{name}.log").read_text())
            for name in hosts.names}


def test_the_relay_start_places_every_instance_and_leaves_nothing(
        many_hosts: TestHosts, tmp_path: Path, short_tmp: Path) -> None:
    """
    GIVEN the relay start forced (POPRUN_SSH_RELAY=on)
    WHEN 16 instances are launched over the 16 hosts
    THEN each runs on its planned host, nothing is left, and some host was started from another host, not from here
    """
    # GIVEN
    before = accepted_from(many_hosts)
    here = many_hosts.subnet.removesuffix("0/24") + "1"  # this machine's address on the hosts' bridge

    # WHEN, THEN
    check_launch(many_hosts, HOSTS, cwd=tmp_path, tmpdir=short_tmp, env={"POPRUN_SSH_RELAY": "on"})
    logins = {name: addresses[len(before[name]):] for name, addresses in accepted_from(many_hosts).items()}
    relayed = {name for name, addresses in logins.items() if any(address != here for address in addresses)}
    assert relayed, logins
