"""The health check on this machine through the local backend: real shells, hostile checks, stops and SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from poprun.apply import health
from poprun.apply.health import check_hosts, health_problems
from poprun.backends.local import LocalBackend
from poprun.core import events
from poprun.process.hostscript import run_here
from poprun.render.diagnostics import render_diagnostic
from tests.e2e.helpers import plan_of
from tests.golden.harness import assert_golden

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]
GOLDEN = Path(__file__).parent / "health_golden"


def plan(command: str, timeout_s: float = 30):
    """Return a one-instance plan for this machine with ``command`` as its health check."""
    return plan_of("--health-check", command, "--health-check-timeout", f"{timeout_s:g}", "--num-replicas", "1", "true")


def left(word: str) -> list[str]:
    """Return the command lines of this machine's processes that hold ``word`` (a check's leftovers)."""
    found = []
    for pid in [p for p in os.listdir("/proc") if p.isdigit() and int(p) != os.getpid()]:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        line = cmdline.replace(b"\0", b" ").decode(errors="replace")
        if word in line:
            found.append(line)
    return found


def settled(word: str, within_s: float = 5.0) -> list[str]:
    """Return :func:`left` once it is empty, or what is still left after ``within_s``."""
    deadline = time.monotonic() + within_s
    while (found := left(word)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


def test_a_passing_and_a_failing_check_say_status_and_last_lines():
    """A check's status and its output's last lines (stdout and stderr together) come back, one event per host."""
    told: list[events.HealthChecked] = []

    checks = check_hosts(LocalBackend(), plan("echo out; echo err >&2; exit 3"), ["localhost"], environ=os.environ,
                         emit=told.append)

    check = checks.of("localhost")
    assert check is not None
    assert ("failed", 3, ("out", "err")) == (check.outcome, check.status, check.tail)
    assert [events.HealthChecked(host="localhost", ok=False, outcome="failed", status=3, ms=check.ms,
                                 tail=("out", "err"))] == told
    assert {"localhost": "its health check failed with status 3"} == checks.lost()
    assert check_hosts(LocalBackend(), plan("true"), ["localhost"], environ=os.environ).ok


def test_without_a_check_nothing_runs():
    """A plan without a health check returns no checks, at once."""
    checks = check_hosts(LocalBackend(), plan_of("--num-replicas", "1", "true"), ["localhost"], environ=os.environ)

    assert ((), True) == (checks.checks, checks.ok)


def test_a_hostile_command_runs_exactly_as_sh_c_would():
    """Quotes, $(), backticks, newlines, ';', a here-document and exit: the same output and status as sh -c."""
    command = ("printf '%s\\n' \"it's\" 'a \"b\"' $(echo sub) `echo tick`; x=1\ncat <<'EOF'\n$x ) } ; fi\nEOF\n"
               'echo "$0" >/dev/null; exit 7')
    expected = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=False)

    check = check_hosts(LocalBackend(), plan(command), ["localhost"], environ=os.environ).checks[0]

    assert (expected.returncode, tuple(expected.stdout.splitlines())) == (check.status, check.tail)


def test_the_command_is_in_no_process_argv():
    """While the check runs, no process on this machine has its text in its command line: it travels on stdin."""
    word = f"poprun-secret-{os.getpid()}"
    command = f": '{word}'; sleep 2"
    found: list[str] = []
    runner = threading.Thread(target=lambda: check_hosts(LocalBackend(), plan(command), ["localhost"],
                                                         environ=os.environ))
    runner.start()
    while runner.is_alive():
        found += left(word)
        time.sleep(0.05)

    assert [] == found


def test_a_check_that_reads_stdin_gets_end_of_file():
    """A check reading its standard input ends at once: it reads /dev/null."""
    check = check_hosts(LocalBackend(), plan("cat; echo got-eof", 30), ["localhost"], environ=os.environ).checks[0]

    assert ("passed", ("got-eof",)) == (check.outcome, check.tail)
    assert check.ms < 10_000


def test_a_hanging_check_is_killed_at_its_deadline_with_nothing_left():
    """A check that hangs times out at its deadline, with its last lines, and no process of it survives."""
    begun = time.monotonic()

    checks = check_hosts(LocalBackend(), plan("echo waiting; exec sleep 3171", 1), ["localhost"], environ=os.environ)

    check = checks.checks[0]
    assert ("timed out", None, ("waiting",)) == (check.outcome, check.status, check.tail)
    assert time.monotonic() - begun < 8
    assert [] == settled("sleep 3171")
    assert {"localhost": "its health check timed out after 1 s"} == checks.lost()


def test_a_check_that_ignores_sigterm_is_killed_a_second_later_and_timed_out():
    """A check that traps SIGTERM outlives the deadline by a second at most: SIGKILL, timed out, nothing left."""
    check = check_hosts(LocalBackend(), plan("trap '' TERM; echo stubborn; sleep 3170; sleep 3170", 1), ["localhost"],
                        environ=os.environ).checks[0]

    assert ("timed out", None, "stubborn") == (check.outcome, check.status, check.tail[0])
    assert check.ms < 15_000  # the deadline (1 s) and the second before SIGKILL, not the sleeps (2 x 3170 s)
    assert [] == settled("sleep 3170")


def test_megabytes_of_output_stay_on_the_host():
    """A check that prints 50 MB sends back only the last few kilobytes, its last line among them."""
    script = health.host_script("yes 0123456789 | head -c 50000000; echo; echo last-line", 30, begin="b", end="e", mark="m")

    status, out = run_here(script, environ=os.environ, timeout_s=60)

    assert 0 == status
    assert len(out) < health.TAIL_BYTES + 200
    assert (0, "last-line") == (health._parse(out, "b", "e")[0], health._parse(out, "b", "e")[1].split()[-1].decode())


def test_a_daemon_that_keeps_the_output_open_is_killed():
    """A check that leaves a daemon holding its output (setsid, double fork) ends at its own exit; the daemons die."""
    command = "setsid sleep 3172 & (setsid sh -c 'exec sleep 3173' &); echo started"
    begun = time.monotonic()

    check = check_hosts(LocalBackend(), plan(command, 60), ["localhost"], environ=os.environ).checks[0]

    assert ("passed", ("started",)) == (check.outcome, check.tail)
    assert time.monotonic() - begun < 10
    assert [] == settled("sleep 317")


def test_another_host_is_unreachable_not_a_hang():
    """The local backend cannot reach another host: unreachable, with the backend's one line, and PR446."""
    checks = check_hosts(LocalBackend(), plan("true"), ["localhost", "elsewhere.invalid"], environ=os.environ)

    assert ["passed", "unreachable"] == [c.outcome for c in checks.checks]
    assert "'elsewhere.invalid' is not this machine" in checks.checks[1].reason
    assert ["PR446"] == [d.code for d in health_problems(checks)]


def test_a_stop_ends_every_running_check_promptly():
    """Setting stop while checks hang ends them within seconds, marked stopped, with nothing left."""
    stop = threading.Event()
    threading.Timer(1.0, stop.set).start()
    begun = time.monotonic()

    checks = check_hosts(LocalBackend(), plan("exec sleep 3174", 120), ["localhost", "127.0.0.1"],
                         environ=os.environ, stop=stop)

    assert (True, ["stopped", "stopped"]) == (checks.stopped, [c.outcome for c in checks.checks])
    assert time.monotonic() - begun < 8
    assert [] == settled("sleep 3174")
    assert {} == checks.lost()


def test_poprun_killed_during_a_check_leaves_nothing():
    """SIGKILL of the process running the checks: the checks and their daemons end within seconds."""
    code = ("import os\nfrom poprun.apply.health import check_hosts\nfrom poprun.backends.local import LocalBackend\n"
            "from tests.e2e.helpers import plan_of\n"
            "p = plan_of('--health-check', os.environ['CHECK'], '--health-check-timeout', '300', '--num-replicas', '1',"
            " 'true')\n"
            "check_hosts(LocalBackend(), p, ['localhost'], environ=os.environ)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=Path(__file__).parents[2],
                            env={**os.environ, "CHECK": "setsid sleep 3176 & exec sleep 3175"})
    deadline = time.monotonic() + 30
    while len(left("sleep 317")) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert 2 == len(left("sleep 317"))

    proc.send_signal(signal.SIGKILL)
    proc.wait()

    assert [] == settled("sleep 317", 10)


def test_secrets_in_the_output_are_masked():
    """A check that prints a secret-looking NAME=VALUE or a URL's password: masked in its tail and event."""
    check = check_hosts(LocalBackend(), plan("echo API_TOKEN=hunter2; echo https://u:pw@example.com/x; exit 1"),
                        ["localhost"], environ=os.environ).checks[0]

    assert "hunter2" not in json.dumps(check.tail)
    assert ":pw@" not in json.dumps(check.tail)


@pytest.mark.parametrize(("case", "command", "timeout_s", "host"), [
    ("PR445_host_whose_check_fails_with_its_last_lines", ("echo 'scratch: 97% used'; printf 'ecc\\terrors\\033[0m\\n'; "
     "echo 'see dmesg' >&2; exit 3"), 30, "localhost"),
    ("PR445_host_whose_check_hangs_past_its_deadline", "echo 'probing /dev/ipu0'; exec sleep 3177", 1, "localhost"),
    ("PR446_local_backend_asked_to_check_another_host", "true", 30, "pod9"),
])
def test_the_diagnostics_match_their_golden_text(case, command, timeout_s, host):
    """PR445 and PR446 as a launch shows them: the host, the status or deadline, the last lines, escaped."""
    checks = check_hosts(LocalBackend(), plan(command, timeout_s), [host], environ=os.environ)

    (problem,) = health_problems(checks, spares_left=("pod5",) if "hangs" in case else ())

    assert_golden(GOLDEN / case, render_diagnostic(problem) + "\n")


def test_a_cancelled_scope_ends_its_scripts_and_those_started_after():
    """run_script in a Scope: cancel() from another thread ends it promptly (CancelledError); a later one ends at once."""
    from poprun.process.hostscript import CancelledError, Scope, run_script, scope

    cancel, raised = Scope(), []

    def hang() -> None:
        with scope(cancel):
            try:
                run_script(["/bin/sh", "-s"], "exec sleep 3178", env=os.environ, timeout_s=60)
            except CancelledError:
                raised.append(time.monotonic())

    runner = threading.Thread(target=hang)
    runner.start()
    deadline = time.monotonic() + 10
    while not left("sleep 3178") and time.monotonic() < deadline:
        time.sleep(0.05)
    begun = time.monotonic()
    cancel.cancel()
    runner.join(10)
    hang()

    assert 2 == len(raised)
    assert raised[0] - begun < 6  # SIGTERM, at most a second of grace, SIGKILL: far less than the 60 s bound
    assert [] == settled("sleep 3178")
