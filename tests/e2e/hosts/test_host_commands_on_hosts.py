"""Host commands, the port plan and stacks on real ssh hosts: one shared connection, the script on its input."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from poprun.apply.ports import LOWEST, check_port, choose_port
from poprun.apply.stacks import FAULTHANDLER, collect_stacks
from poprun.backends.base import LaunchError
from poprun.backends.conformance import MemorySink, probe_plan
from poprun.backends.registry import default_registry
from poprun.backends.ssh.backend import SshBackend
from tests.e2e.hosts.test_host_faults import command_lines
from tests.e2e.hosts.test_ssh_backend import wait_for
from tests.e2e.stacks_helpers import hang_plan, wait_ready
from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]
BASE_PYTHON = os.path.realpath(sys.executable)  # no py-spy beside it


def environ(hosts: TestHosts) -> dict[str, str]:
    return dict(os.environ) | hosts.env()


def accepted(hosts: TestHosts, name: str) -> int:
    """Return how many ssh connections host ``name``'s sshd has accepted so far."""
    return (hosts.state / f"sshd_{name}.log").read_text(errors="replace").count("Accepted publickey")


def test_a_script_runs_on_the_host_from_its_input(test_hosts: TestHosts):
    """On h1: its hostname, the script's quotes and $() as written, and sh's argv without the script."""
    script = """hostname; printf '%s\\n' "it's $(echo ok)"; tr '\\0' ' ' < /proc/$$/cmdline; echo; exit 3"""

    status, out = SshBackend().run_on_host("h1", script, environ=environ(test_hosts), timeout_s=15)

    assert (3, b"h1\nit's ok\nsh -s \n") == (status, out)


def test_a_command_before_the_launch_opens_the_launchs_connection_and_nothing_outlives_it(test_hosts: TestHosts,
                                                                                          tmp_path: Path):
    """
    A command before the launch (the port plan), the launch on h2, a command during it: one login in all.

    The first command's connection is kept for the launch (guarded by a watchdog of its own, see
    test_sigkill_during_a_command_before_the_launch_leaves_no_connection_or_directory), the launch takes it
    over, and the second command goes through it; once the launch ends nothing of it is left.
    """
    # GIVEN
    backend, env = SshBackend(grace_s=1), environ(test_hosts)
    before = accepted(test_hosts, "h2")
    plan = probe_plan("import time; print('up', flush=True); time.sleep(60)", tmp_path, backend="ssh", instances=2,
                      hosts=("h2",), environ=env)

    def masters() -> list[bytes]:  # this session's: other work's hosts may be called h2 too
        config = b"\0" + str(test_hosts.ssh_config).encode() + b"\0"
        return [line for line in command_lines().values()
                if b"ControlMaster=yes" in line and config in line and line.endswith(b"\0h2\0")]

    # WHEN
    first = backend.run_on_host("h2", "echo before", environ=env, timeout_s=15)
    kept = masters()
    sink = MemorySink()
    launch = backend.launch(plan, env_source=env, sink=sink)
    try:
        wait_ready(sink, 2, word="up")
        during = backend.run_on_host("h2", "echo during", environ=env, timeout_s=15)
    finally:
        launch.terminate(0)
        launch.wait()

    # THEN: one connection, opened for the first command and used by the launch and the second; gone with the launch
    assert ((0, b"before\n"), (0, b"during\n"), 1) == (first, during, len(kept))
    assert 1 == accepted(test_hosts, "h2") - before
    assert wait_for(lambda: not masters(), within_s=5), masters()


def test_a_connection_kept_for_a_launch_that_never_comes_is_closed_with_the_registry(test_hosts: TestHosts) -> None:
    """
    A library caller runs a command on h3 through a registry's ssh backend and never launches: the kept
    connection lives until the registry is closed (as a command closes its own at its end), then nothing is left.
    """
    # GIVEN
    registry = default_registry(environ={"POPRUN_NO_PLUGINS": "1"})
    backend = registry.get("ssh")

    # WHEN
    done = backend.run_on_host("h3", "echo once", environ=environ(test_hosts), timeout_s=15)  # type: ignore[attr-defined]
    directory = backend._kept.directory  # type: ignore[attr-defined] # the kept client's sockets
    needle = f"{directory}/".encode()

    def kept() -> list[bytes]:
        return [line for line in command_lines().values() if needle in line]

    at_first = kept()
    registry.close()

    # THEN: kept until the registry closed, then nothing: no connection, no directory, no watchdog
    assert ((0, b"once\n"), True, True) == (done, bool(at_first), registry.get("ssh") is not backend)
    assert wait_for(lambda: not kept(), within_s=5), kept()
    assert wait_for(lambda: not Path(directory).exists(), within_s=2), directory


def test_sigkill_during_a_command_before_the_launch_leaves_no_connection_or_directory(test_hosts: TestHosts,
                                                                                      short_tmp: Path) -> None:
    """
    A process running a command on h1 before a launch (as the port plan does) is SIGKILLed while it runs:
    the connection kept for the launch and its directory go with it (the client's own watchdog). The
    script itself runs to its end on h1 (poprun's are bounded: the port plan reads /proc, the stacks'
    have a timeout); this one is killed there at the end.
    """
    # GIVEN a command on h1 that runs until it is killed, through the backend, in a process of its own
    code = ("import os, sys; from poprun.backends.ssh.backend import SshBackend; "
            "SshBackend().run_on_host('h1', 'sleep 59.25', environ=dict(os.environ), timeout_s=90)")
    needle = f"{short_tmp}/poprun-ssh-".encode()
    proc = subprocess.Popen([sys.executable, "-c", code], env=environ(test_hosts) | {"TMPDIR": str(short_tmp)},
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: test_hosts.processes("h1", "sleep 59.25"), within_s=20), "the command did not start"
        assert [line for line in command_lines().values() if needle in line and b"ControlMaster=yes" in line]

        # WHEN
        proc.kill()
        proc.communicate()

        # THEN nothing of it is left here: no ssh process, no directory; nor on h1
        assert wait_for(lambda: not [line for line in command_lines().values() if needle in line], within_s=5)
        assert [] == sorted(path.name for path in short_tmp.iterdir())
    finally:
        test_hosts.ssh("h1", "pkill -f 'sleep 59.25'", timeout=10)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        for pid, line in command_lines().items():
            if needle in line:
                os.kill(pid, signal.SIGKILL)


def test_a_host_nobody_knows_is_a_one_line_launch_error(test_hosts: TestHosts):
    """ssh's own diagnosis, as the preflight gives it (PR405), in one line."""
    with pytest.raises(LaunchError) as caught:
        SshBackend().run_on_host("ghost.invalid", "true", environ=environ(test_hosts), timeout_s=10)

    assert caught.value.message.startswith("PR405: host name 'ghost.invalid' is unknown")
    assert "\n" not in caught.value.message


def test_mpirun_reaches_its_hosts_as_the_ssh_backend_does(test_hosts: TestHosts):
    """The registry's mpirun backend runs a command on h3 through ssh."""
    backend = default_registry(environ={"POPRUN_NO_PLUGINS": "1"}).get("mpirun")

    assert (0, b"h3\n") == backend.run_on_host("h3", "hostname", environ=environ(test_hosts), timeout_s=15)


def test_a_port_held_on_the_host_is_named_and_never_chosen(test_hosts: TestHosts):
    """A listener in h4's network (not here): check_port names it (PR440, its process); choose_port skips it."""
    # GIVEN a listener on h4 on a port free there
    env = environ(test_hosts)
    port = choose_port(SshBackend(), "h4", environ=env).port
    code = ("import socket, sys; s = socket.socket(); s.bind(('0.0.0.0', int(sys.argv[1]))); s.listen(); "
            "print('ok', flush=True); sys.stdin.read()")
    holder = subprocess.Popen(["ip", "netns", "exec", test_hosts.namespaces["h4"], BASE_PYTHON, "-c", code, str(port)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None
        assert b"ok\n" == holder.stdout.readline()

        class Offered:
            def choice(self, seq):
                self.offered = set(seq)
                return seq[0]

        rng = Offered()

        # WHEN
        found = check_port(SshBackend(), "h4", port, environ=env)
        choose_port(SshBackend(), "h4", environ=env, rng=rng)
        here = check_port(SshBackend(), "localhost", port, environ=env)
    finally:
        holder.kill()
        holder.communicate()

    # THEN
    assert found is not None
    assert f"MASTER_PORT {port}: held by pid {holder.pid} (" in found.detail
    assert found.detail.endswith("), socket LISTEN")
    assert {port, port - 1} & rng.offered == set()
    assert LOWEST <= min(rng.offered)
    assert here is None  # only h4's network has it


def launch_hanging(hosts: TestHosts, workdir: Path, run_id: str, **kwargs: object):
    backend = SshBackend(grace_s=1)
    plan = hang_plan(workdir, backend="ssh", hosts=("h1",), run_id=run_id, instances=1, environ=environ(hosts),
                     **kwargs)  # type: ignore[arg-type]
    sink = MemorySink()
    launch = backend.launch(plan, env_source=environ(hosts), sink=sink)
    wait_ready(sink, 1)
    return backend, launch, sink


def test_py_spy_reads_a_remote_instance_hung_in_its_function(test_hosts: TestHosts, tmp_path: Path):
    """On h1, through the launch's connection: py-spy (beside the instance's Python) shows hang_here."""
    run_id = f"test-{uuid.uuid4().hex[:12]}"
    backend, launch, _ = launch_hanging(test_hosts, tmp_path, run_id)
    try:
        found = collect_stacks(backend, {0: "h1"}, run_id, environ=environ(test_hosts), timeout_s=30)
    finally:
        launch.terminate(0)
        launch.wait()

    assert "hang_here (<string>:6)" in found[0], found


def test_faulthandler_writes_a_remote_instances_stack_to_its_stderr(test_hosts: TestHosts, tmp_path: Path):
    """No py-spy on h1 for this Python, PYTHONFAULTHANDLER set: its stderr (here) holds hang_here; no core file."""
    run_id = f"test-{uuid.uuid4().hex[:12]}"
    backend, launch, sink = launch_hanging(test_hosts, tmp_path, run_id, python=BASE_PYTHON,
                                           extra=(("PYTHONFAULTHANDLER", "1"),))
    try:
        found = collect_stacks(backend, {0: "h1"}, run_id, environ=environ(test_hosts), timeout_s=30)
        launch.wait()
    finally:
        launch.terminate(0)
        launch.wait()

    assert FAULTHANDLER in found[0], found
    assert "in hang_here" in sink.data("stderr").decode(), sink.written
    assert [] == [p.name for p in tmp_path.iterdir() if p.name.startswith("core")]


def test_a_host_that_does_not_answer_gives_a_line(test_hosts: TestHosts):
    """collect_stacks never raises for a host: an unknown one gets a line."""
    found = collect_stacks(SshBackend(), {0: "ghost.invalid"}, "r1", environ=environ(test_hosts), timeout_s=10)

    assert found[0].startswith("ghost.invalid did not answer: PR405: host name 'ghost.invalid' is unknown")


def test_the_port_plan_and_the_launch_share_one_login_per_host(test_hosts: TestHosts, tmp_path: Path) -> None:
    """
    GIVEN a launch over h1..h4 whose MASTER_PORT poprun chooses on h1 (the port plan)
    WHEN it runs
    THEN each host logged in once (the port plan's connection to h1 is the launch's), and the record's
    connect phase counts the connections opened ahead of the launch
    """
    # GIVEN
    before = {name: accepted(test_hosts, name) for name in test_hosts.names}
    runs = tmp_path / "runs"

    # WHEN
    done = subprocess.run([sys.executable, "-m", "poprun.cli.main", "--host", ",".join(test_hosts.names),
                           "--num-instances", "4", "--num-replicas", "4", "sh", "-c", "echo $MASTER_PORT"],
                          cwd=tmp_path, env=environ(test_hosts) | {"POPRUN_RUNS_DIR": str(runs)},
                          capture_output=True, text=True, timeout=60, check=False, stdin=subprocess.DEVNULL)

    # THEN
    assert 0 == done.returncode, done.stderr
    assert dict.fromkeys(test_hosts.names, 1) == {name: accepted(test_hosts, name) - before[name]
                                                  for name in test_hosts.names}
    assert 1 == len(set(done.stdout.split())), done.stdout  # one MASTER_PORT, chosen for all
    report = json.loads(next(runs.glob("*/report.json")).read_text())
    assert report["launch_phases"]["connect"] > 0


def test_prepare_opens_every_hosts_connection_and_the_port_plan_reuses_instance_0s(test_hosts: TestHosts,
                                                                                  tmp_path: Path) -> None:
    """
    GIVEN a plan over h1..h4
    WHEN the apply step's prepare runs, then the port plan's command on h1
    THEN every host's connection is open after prepare alone (h1's among the others, not alone before them),
    and the command on h1 logs in no more
    """
    # GIVEN
    backend, env = SshBackend(grace_s=1), environ(test_hosts)
    plan = probe_plan("true", tmp_path, backend="ssh", instances=4, hosts=test_hosts.names, environ=env)

    def masters() -> set[str]:  # this session's: other work's hosts may be called h1 too
        config = b"\0" + str(test_hosts.ssh_config).encode() + b"\0"
        return {name for name in test_hosts.names for line in command_lines().values()
                if b"ControlMaster=yes" in line and config in line and line.endswith(b"\0" + name.encode() + b"\0")}

    try:
        # WHEN
        backend.prepare(plan, environ=env)
        opened = masters()
        logins = accepted(test_hosts, "h1")
        done = backend.run_on_host("h1", "echo port plan", environ=env, timeout_s=15)

        # THEN
        assert (set(test_hosts.names), (0, b"port plan\n")) == (opened, done)
        assert logins == accepted(test_hosts, "h1")
    finally:
        backend.close()
    assert wait_for(lambda: not masters(), within_s=20), masters()
