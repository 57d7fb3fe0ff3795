"""The health check on real ssh hosts: through the backend's shared connection, hostile checks, stops and SIGKILL."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from poprun.apply.health import check_hosts, health_problems
from poprun.backends.conformance import MemorySink
from poprun.backends.ssh.backend import SshBackend
from poprun.core import events
from tests.e2e.helpers import plan_of
from tests.e2e.hosts.test_host_commands_on_hosts import accepted
from tests.e2e.hosts.test_host_faults import command_lines, link_down  # noqa: F401 - link_down is a fixture
from tests.e2e.hosts.test_ssh_backend import wait_for
from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]


@pytest.fixture
def env(test_hosts: TestHosts, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Send this process's planning and the ssh backend to the test hosts; return the launching environment."""
    for name, value in test_hosts.env().items():
        monkeypatch.setenv(name, value)
    return dict(os.environ)


def plan(command: str, timeout_s: float = 30, *, hosts: str = "h1,h2,h3", spares: str = "h4"):
    """Return a plan for ``hosts`` with ``spares`` and ``command`` as its health check, made by the solver."""
    return plan_of("--host", hosts, "--spare-host", spares, "--health-check", command,
                   "--health-check-timeout", f"{timeout_s:g}", "--num-instances", "3", "--num-replicas", "3", "true")


def leftovers(hosts: TestHosts, names: tuple[str, ...], pattern: str, within_s: float = 8.0) -> list[str]:
    """Return the processes matching ``pattern`` on ``names`` once none is left, or those left after ``within_s``."""
    def found() -> list[str]:
        return [line for name in names for line in hosts.processes(name, pattern)]

    wait_for(lambda: not found(), within_s=within_s)
    return found()


def test_every_host_and_spare_is_checked_over_the_connection_the_launch_then_reuses(test_hosts: TestHosts, env):
    """h1-h3 and spare h4 checked in parallel (h3 fails with its lines); the launch after opens no new connection."""
    # GIVEN
    backend, told = SshBackend(grace_s=1), []
    the_plan = plan('echo "on $(hostname)"; [ "$(hostname)" != h3 ] || { echo "disk full" >&2; exit 4; }')
    before = {name: accepted(test_hosts, name) for name in ("h1", "h2", "h3", "h4")}

    # WHEN
    checks = check_hosts(backend, the_plan, ["h1", "h2", "h3", *the_plan.membership.spares], environ=env,
                         emit=told.append)
    after_checks = {name: accepted(test_hosts, name) for name in before}
    launch = backend.launch(the_plan, env_source=env, sink=MemorySink())
    result = launch.wait()

    # THEN
    assert [("h1", "passed", 0, ("on h1",)), ("h2", "passed", 0, ("on h2",)), ("h3", "failed", 4, ("on h3", "disk full")),
            ("h4", "passed", 0, ("on h4",))] == [(c.host, c.outcome, c.status, c.tail) for c in checks.checks]
    assert ["h1", "h2", "h3", "h4"] == sorted(e.host for e in told if isinstance(e, events.HealthChecked))
    assert {"h3": "its health check failed with status 4"} == checks.lost()
    assert ["PR445"] == [d.code for d in health_problems(checks)]
    assert {name: count + 1 for name, count in before.items()} == after_checks  # one key exchange per host
    assert ((0, 0, 0), after_checks) == (result.statuses, {name: accepted(test_hosts, name) for name in before})


def test_a_hanging_check_and_its_daemon_are_killed_on_the_host(test_hosts: TestHosts, env):
    """A check that leaves a daemon (setsid) and hangs: timed out at its deadline; nothing of it left on h1."""
    begun = time.monotonic()

    checks = check_hosts(SshBackend(), plan("setsid sleep 3181 & echo hanging; exec sleep 3182", 2), ["h1"],
                         environ=env)

    assert ("timed out", ("hanging",)) == (checks.checks[0].outcome, checks.checks[0].tail)
    assert time.monotonic() - begun < 20
    assert [] == leftovers(test_hosts, ("h1",), "sleep 318")


def test_the_command_is_on_no_command_line_here_or_on_the_host(test_hosts: TestHosts, env):
    """While a check with quotes and $() runs on h2, neither machine shows its text in any process's argv."""
    word = f"poprun-health-{os.getpid()}"
    command = f"x='{word}'; echo \"$(printf %s \"$x\" | wc -c)\"; sleep 2"
    seen: list[bytes] = []
    result: list[object] = []
    runner = threading.Thread(target=lambda: result.append(check_hosts(SshBackend(), plan(command), ["h2"],
                                                                       environ=env)))
    runner.start()
    while runner.is_alive():
        seen += [line for line in command_lines().values() if word.encode() in line]
        time.sleep(0.05)

    assert [] == seen
    assert (str(len(word)),) == result[0].checks[0].tail  # type: ignore[attr-defined]


def test_a_host_that_does_not_answer_is_unreachable_not_a_hang(test_hosts: TestHosts, env, link_down):  # noqa: F811
    """h4's link is down: its check is unreachable (PR446) within the connect timeout; the others pass."""
    link_down.append("h4")
    test_hosts.set_link("h4", up=False)
    begun = time.monotonic()

    checks = check_hosts(SshBackend(), plan("true", 60), ["h1", "h4"], environ=env | {"POPRUN_HOST_TIMEOUT": "5"})

    assert ["passed", "unreachable"] == [c.outcome for c in checks.checks]
    assert time.monotonic() - begun < 40
    assert ["PR446"] == [d.code for d in health_problems(checks)]


def test_a_stop_ends_the_checks_on_every_host(test_hosts: TestHosts, env):
    """Setting stop while checks hang on h1 and h2: they end within seconds, nothing left on either host."""
    stop = threading.Event()
    threading.Timer(2.0, stop.set).start()
    begun = time.monotonic()

    checks = check_hosts(SshBackend(), plan("setsid sleep 3183 & exec sleep 3184", 120), ["h1", "h2"],
                         environ=env, stop=stop)

    assert (True, ["stopped", "stopped"]) == (checks.stopped, [c.outcome for c in checks.checks])
    assert time.monotonic() - begun < 12
    assert [] == leftovers(test_hosts, ("h1", "h2"), "sleep 318")


def test_poprun_killed_during_a_check_leaves_nothing_on_the_host(test_hosts: TestHosts, env, short_tmp: Path):
    """SIGKILL of the process running a check on h3: its connection goes (watchdog), and with it the check there."""
    code = ("import os\nfrom poprun.apply.health import check_hosts\nfrom poprun.backends.ssh.backend import SshBackend\n"
            "from tests.e2e.helpers import plan_of\n"
            "p = plan_of('--host', 'h3', '--health-check', os.environ['CHECK'], '--health-check-timeout', '300',"
            " '--num-replicas', '1', 'true')\n"
            "check_hosts(SshBackend(), p, ['h3'], environ=dict(os.environ))\n")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=Path(__file__).parents[3],
                            env=env | {"CHECK": "setsid sleep 3185 & exec sleep 3186", "TMPDIR": str(short_tmp)})
    try:
        assert wait_for(lambda: len(test_hosts.processes("h3", "sleep 318")) == 2, within_s=30)

        proc.kill()
        proc.wait()

        assert [] == leftovers(test_hosts, ("h3",), "sleep 318", 10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_mpirun_backend_checks_its_hosts_as_the_ssh_backend_reaches_them(test_hosts: TestHosts, env):
    """The registry's mpirun backend, asked for four hosts at once, checks each over one ssh connection."""
    from poprun.backends.registry import default_registry

    registry = default_registry(environ={"POPRUN_NO_PLUGINS": "1"})
    before = {name: accepted(test_hosts, name) for name in ("h1", "h2", "h3", "h4")}
    try:
        checks = check_hosts(registry.get("mpirun"), plan("hostname"), ["h1", "h2", "h3", "h4"], environ=env)
    finally:
        registry.close()

    assert [(h, "passed", (h,)) for h in ("h1", "h2", "h3", "h4")] == [(c.host, c.outcome, c.tail) for c in checks.checks]
    assert {name: count + 1 for name, count in before.items()} == {name: accepted(test_hosts, name) for name in before}
