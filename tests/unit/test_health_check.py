"""
The membership policy's health check, run for real on this machine through the local backend (docs/membership.md).

Each check is a real ``sh`` on this machine, as on any host: hostile checks (hangs, megabytes,
daemons, quotes, stdin) end at their own exit or deadline, leave no process, and keep only the
last lines of their output.
"""

from __future__ import annotations

import os
import time
import uuid
from pathlib import Path

import pytest

from poprun.apply.health import KEPT, HealthChecks, check_hosts, host_script
from poprun.backends.local import LocalBackend
from poprun.core import events
from poprun.planner.context import Context
from poprun.planner.flags import parse_flags
from poprun.planner.plan import LaunchPlan
from poprun.planner.solve import solve

pytestmark = pytest.mark.timeout(60)


def plan_with(check: str, timeout: str = "5") -> LaunchPlan:
    command = parse_flags(["--num-instances", "2", "--num-replicas", "2", "--health-check", check,
                           "--health-check-timeout", timeout, "sh", "-c", "true"], environ={})
    return solve(command.spec, Context(environ={}, cwd="/")).plan


def checked(check: str, timeout: str = "5", *, stop: object = None) -> tuple[HealthChecks, list[events.Event]]:
    told: list[events.Event] = []
    result = check_hosts(LocalBackend(), plan_with(check, timeout), ["localhost"], environ=dict(os.environ),
                         emit=told.append, **({"stop": stop} if stop is not None else {}))
    return result, told


def running(needle: str) -> list[int]:
    """Return the pids of the processes whose command line holds ``needle``."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if needle.encode() in Path(entry.path, "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def test_a_passing_check_passes_and_is_told() -> None:
    result, told = checked("echo fine")
    (health,) = result.hosts
    assert (True, 0, ("fine",), {}) == (health.ok, health.status, health.tail, result.failed())
    assert [events.HealthChecked(host="localhost", ok=True, status=0, ms=health.ms, tail=("fine",))] == told


def test_a_failing_check_gives_its_status_and_last_lines_and_pr445() -> None:
    result, _ = checked("echo one; echo two >&2; exit 3")
    (health,) = result.hosts
    assert (False, 3, ("one", "two")) == (health.ok, health.status, health.tail)
    assert {"localhost": "its health check failed (status 3)"} == result.failed()
    diagnostic = result.diagnostics()["localhost"]
    assert ("PR445", "the check exited with 3 on localhost; its last lines: one | two") == (diagnostic.code,
                                                                                             diagnostic.detail)


def test_a_hanging_check_is_killed_at_its_deadline_with_everything_it_started() -> None:
    mark = f"hang-{uuid.uuid4().hex[:8]}"
    began = time.monotonic()
    result, _ = checked(f"sleep 60 & sh -c 'sleep 61; : {mark}' & sleep 62; : {mark}", timeout="1")
    took = time.monotonic() - began

    (health,) = result.hosts
    assert (False, True) == (health.ok, health.timed_out)
    assert took < 10, took
    assert [] == running(mark)
    assert "timed out after" in result.failed()["localhost"]


def test_megabytes_of_output_keep_only_the_last_bytes() -> None:
    result, _ = checked("i=0; while [ $i -lt 20 ]; do head -c 1000000 /dev/zero | tr '\\0' x; i=$((i+1)); done; "
                        "echo; echo the-end")
    (health,) = result.hosts
    assert health.ok, health
    assert "the-end" == health.tail[-1]
    assert sum(len(line) + 1 for line in health.tail) <= KEPT + 1


def test_a_daemon_that_keeps_the_output_open_neither_holds_the_check_nor_survives_it() -> None:
    mark = f"daemon-{uuid.uuid4().hex[:8]}"
    began = time.monotonic()
    result, _ = checked(f"setsid sh -c 'sleep 60; : {mark}' & (sh -c 'sleep 60; : {mark}' &); echo started")
    took = time.monotonic() - began

    assert (True, ("started",)) == (result.hosts[0].ok, result.hosts[0].tail)
    assert took < 4, took
    assert [] == running(mark)


def test_quotes_substitutions_and_newlines_run_as_sh_c_would() -> None:
    command = "printf '%s\\n' \"a'b\" \"$(echo sub)\" '$(not run)'\necho 'second line'; echo POPRUN_HEALTH_END_x"
    result, _ = checked(command)
    assert ("a'b", "sub", "$(not run)", "second line", "POPRUN_HEALTH_END_x") == result.hosts[0].tail


def test_a_check_that_reads_stdin_reads_nothing() -> None:
    began = time.monotonic()
    result, _ = checked("cat; echo eof")
    assert (True, ("eof",)) == (result.hosts[0].ok, result.hosts[0].tail)
    assert time.monotonic() - began < 4


def test_the_command_is_on_no_command_line() -> None:
    """While the check runs, no process shows its text (it travels on stdin, then in a private file)."""
    mark = f"secret-{uuid.uuid4().hex}"
    told: list[events.Event] = []
    plan = plan_with(f"sleep 1; : {mark}")
    import threading

    seen: list[list[int]] = []
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            seen.append(running(mark))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    result = check_hosts(LocalBackend(), plan, ["localhost"], environ=dict(os.environ), emit=told.append)
    done.set()
    watcher.join()
    assert result.hosts[0].ok
    assert [] == [pids for pids in seen if pids]


def test_the_script_ends_its_here_document_with_a_line_the_command_does_not_hold() -> None:
    token = "0123456789abcdef"  # noqa: S105 - a check's marker, no secret
    script = host_script(f"echo POPRUN_HEALTH_END_{token}", 5, token)
    assert f"\nPOPRUN_HEALTH_END_{token}_\n" in script


def test_a_stop_ends_the_wait_and_the_hosts_not_answered_are_not_checked() -> None:
    mark = f"stopped-{uuid.uuid4().hex[:8]}"
    began = time.monotonic()
    result, _ = checked(f"sh -c 'sleep 20; : {mark}'", timeout="30", stop=lambda: time.monotonic() - began > 0.5)
    assert time.monotonic() - began < 5
    assert "not checked: poprun was stopped" in result.failed()["localhost"]
    assert [] == running(mark)  # the stop ended the check and what it started, long before its deadline
