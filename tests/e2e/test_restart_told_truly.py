"""
A restart is told (stderr, ``attempt-ended``, ``report.json``) and counted only once it really starts.

Each case forces its outcome, never racing a clock: a restart that must not happen waits on a
back-off of a minute, or on a ``--pre-restart`` command that never ends, while what ends the run
is made to happen first. Each test runs the real CLI and reads what the run left.
"""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.e2e.test_recovery_adversarial import TWO, environment, poprun, started
from tests.e2e.test_recovery_cli import events, report

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

INSTANCE = ("--restart-scope", "instance", "--min-uptime", "0")


def restarts_told(done_stderr: str, cwd: Path) -> tuple[list[str], list[int], list[str], list[int]]:
    """Return what says a restart happened: stderr's 'restart K of N', attempt-ended's, the report's, the starts."""
    said = re.findall(r"restart \d+ of \d+", done_stderr)
    ended = [e["attempt"] for e in events(cwd) if e["event"] == "attempt-ended" and e["restart"]]
    reported = [a["next"] for a in report(cwd)["attempts"] if a["next"].startswith("restart ")]
    began = [e["restart"] for e in events(cwd) if e["event"] == "instance-started" and e["restart"]]
    return said, ended, reported, began


def test_a_restart_cancelled_by_another_instances_failure_is_not_told(tmp_path: Path) -> None:
    """Instance 0's third restart waits on its check; instance 1 fails meanwhile: two restarts, told as two."""
    # GIVEN instance 0 fails on every run; its third check lets instance 1 fail, then never ends
    check = '[ "$POPRUN_RESTART_COUNT" = 3 ] && { touch fail-now; exec sleep 60; }; exit 0'
    program = ('[ "$POPDIST_INSTANCE_INDEX" = 0 ] && exit 3; '
               'while [ ! -e fail-now ]; do sleep 0.02; done; exit 4')

    # WHEN
    done = poprun(*TWO, *INSTANCE, "--max-restarts", "3", "--restart-backoff", "0.05", "--pre-restart", check,
                  "sh", "-c", program, cwd=tmp_path)

    # THEN instance 1 is the root cause; restarts 1 and 2 ran and are told, restart 3 is not
    assert 4 == done.returncode, done.stderr
    said, ended, reported, began = restarts_told(done.stderr, tmp_path)
    assert ["restart 1 of 3", "restart 2 of 3"] == sorted(set(said)), done.stderr
    assert "restart 3 of 3" not in done.stderr
    assert ([0, 1], [1, 2]) == (ended, began)
    assert ["restart 1 of 3 in 0.05 s", "restart 2 of 3 in 0.1 s"] == reported
    attempts = report(tmp_path)["attempts"]
    assert [(0, 3, "restart 1 of 3 in 0.05 s"), (0, 3, "restart 2 of 3 in 0.1 s"),
            (0, 3, "not restarted: the run ended first (instance 1 exited with 4 on localhost)"),
            (1, 4, "not restarted: all 3 restarts of the run are taken: 2 made, 1 waiting to start (--max-restarts)")] \
        == [(a["root_cause"], a["status"], a["next"]) for a in attempts]
    cancelled = [e for e in events(tmp_path) if e["event"] == "attempt-ended" and e["attempt"] == 2]
    why = "not restarted: the run ended first (instance 1 exited with 4 on localhost)"
    assert [(False, f"instance 0 exited with 3 on localhost; {why}")] == [(e["restart"], e["reason"]) for e in cancelled]


def test_a_restart_cancelled_during_its_back_off_is_not_told(tmp_path: Path) -> None:
    """Instance 0's only restart waits a minute; instance 1 fails once it does: no restart is told anywhere."""
    program = ('[ "$POPDIST_INSTANCE_INDEX" = 0 ] && exit 3; '  # instance 1 fails once 0's end is told as restarting
               "until grep -qs '\"restarting\":true' runs/*/events.jsonl; do sleep 0.02; done; exit 4")

    done = poprun(*TWO, *INSTANCE, "--max-restarts", "1", "--restart-backoff", "60", "sh", "-c", program,
                  cwd=tmp_path)

    assert 4 == done.returncode, done.stderr
    assert ([], [], [], []) == restarts_told(done.stderr, tmp_path), done.stderr
    assert "poprun: 2 attempts" in done.stderr
    data = report(tmp_path)
    assert "not restarted: the run ended first (instance 1 exited with 4 on localhost)" == data["attempts"][0]["next"]
    assert data["gave_up"].startswith("not restarted: all 1 restarts of the run are taken: 0 made, 1 waiting")


@pytest.mark.parametrize("scope", ["all", "instance"])
def test_a_restart_whose_check_fails_is_not_told_and_is_one_attempt(tmp_path: Path, scope: str) -> None:
    """The pre-restart check fails: the failure is one attempt, not restarted because of the check, and no restart is told."""
    done = poprun(*TWO, "--restart-scope", scope, "--min-uptime", "0", "--max-restarts", "2", "--restart-backoff",
                  "0.05", "--pre-restart", "exit 7", "sh", "-c", '[ "$POPDIST_INSTANCE_INDEX" = 0 ] && exit 3; sleep 30',
                  cwd=tmp_path)

    assert 3 == done.returncode, done.stderr
    assert ([], [], [], []) == restarts_told(done.stderr, tmp_path), done.stderr
    assert "poprun: 1 attempt " in done.stderr
    attempts = report(tmp_path)["attempts"]
    assert [(0, 3, "not restarted: the pre-restart command failed with status 7")] == \
        [(a["root_cause"], a["status"], a["next"]) for a in attempts]
    assert [(0, False)] == [(e["attempt"], e["restart"]) for e in events(tmp_path) if e["event"] == "attempt-ended"]


@pytest.mark.parametrize("scope", ["all", "instance"])
@pytest.mark.parametrize("during", ["back-off", "pre-restart"])
def test_a_stop_before_the_restart_starts_tells_no_restart(tmp_path: Path, scope: str, during: str) -> None:
    """SIGTERM while waiting to restart (its back-off, or its check): 143, no restart told, the attempt says why."""
    # GIVEN instance 0 fails once, the others run on (scope instance) or are stopped (scope all)
    backoff, check = ("60", "exit 0") if during == "back-off" else ("0.05", "touch checking; exec sleep 60")
    proc = started(*TWO, "--restart-scope", scope, "--min-uptime", "0", "--max-restarts", "2", "--restart-backoff",
                   backoff, "--pre-restart", check, "sh", "-c",
                   '[ "$POPDIST_INSTANCE_INDEX" = 0 ] && { touch failed; exit 3; }; exec sleep 60', cwd=tmp_path)
    try:
        _await(lambda: '"launch-running"' in _events_text(tmp_path), "the launch did not run")  # a stop stops it
        if during == "pre-restart":
            _await((tmp_path / "checking").exists, "the check did not start")
        else:  # instance 0 ended, to start again alone (scope instance), or every instance (scope all)
            needle = '"restarting":true' if scope == "instance" else '"launch-ended"'
            _await(lambda: needle in _events_text(tmp_path), "instance 0 did not fail")

        # WHEN
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()

    # THEN
    assert 143 == proc.returncode, err
    assert "poprun: stopped by SIGTERM before restart 1" in err
    assert ([], [], [], []) == restarts_told(err, tmp_path), err
    assert ["not restarted: poprun was stopped (SIGTERM)"] == [a["next"] for a in report(tmp_path)["attempts"]]


def _events_text(cwd: Path) -> str:
    return "".join(p.read_text() for p in (cwd / "runs").glob("*/events.jsonl"))


def _await(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


def test_restarts_that_ran_are_told_as_they_start(tmp_path: Path) -> None:
    """--max-restarts 2 with scope all, every attempt failing: 2 restarts told, 3 attempts run, the budget's end said."""
    done = poprun("--num-instances", "1", "--num-replicas", "1", "--max-restarts", "2", "--restart-backoff", "0.05",
                  "--min-uptime", "0", "sh", "-c", "echo run >> runs.txt; exit 3", cwd=tmp_path)

    assert 3 == done.returncode, done.stderr
    assert 3 == len((tmp_path / "runs.txt").read_text().splitlines())
    said, ended, reported, _ = restarts_told(done.stderr, tmp_path)
    assert (["restart 1 of 2", "restart 2 of 2"], [0, 1]) == (sorted(set(said)), ended)
    assert ["restart 1 of 2 in 0.05 s", "restart 2 of 2 in 0.1 s"] == reported
    assert "not restarted: all 2 restarts of the run are used (--max-restarts)" == report(tmp_path)["gave_up"]
    kinds = [e["event"] for e in events(tmp_path)]
    assert 3 == kinds.count("attempt-started") == kinds.count("attempt-ended")
    assert [(0, 0), (1, 1), (2, 2)] == list(enumerate(
        e["attempt"] for e in events(tmp_path) if e["event"] == "attempt-started"))


def test_a_restart_due_after_the_signal_before_the_limit_does_not_begin(tmp_path: Path) -> None:
    """Scope instance: --signal comes 2 s in, during instance 0's 6 s back-off: its restart never begins (the limit is near)."""
    done = poprun(*TWO, *INSTANCE, "--max-restarts", "2", "--restart-backoff", "6", "--timeout", "20",
                  "--signal", "USR1@18", "sh", "-c",
                  'trap "" USR1; [ "$POPDIST_INSTANCE_INDEX" = 0 ] && exit 3; sleep 30', cwd=tmp_path)

    assert 3 == done.returncode, done.stderr
    assert ([], [], [], []) == restarts_told(done.stderr, tmp_path), done.stderr
    assert ["not restarted: SIGUSR1 was sent 18 s before the time limit (--signal)"] == \
        [a["next"] for a in report(tmp_path)["attempts"]]


@pytest.mark.parametrize("scope", ["all", "instance"])
def test_with_a_crash_loop_guard_what_is_told_is_what_ran(tmp_path: Path, scope: str) -> None:
    """Both instances fail at once, each run: however the failures interleave, the restarts told are those that ran."""
    done = poprun(*TWO, "--restart-scope", scope, "--max-restarts", "5", "--crash-loop", "3", "--min-uptime", "30",
                  "--restart-backoff", "0.05", "sh", "-c", "exit 3",
                  cwd=tmp_path)

    assert 3 == done.returncode, done.stderr
    assert "crash loop: 3 failures in a row" in done.stderr
    said, ended, reported, began = restarts_told(done.stderr, tmp_path)
    attempts = [e for e in events(tmp_path) if e["event"] == "attempt-started"]
    made = len(began) if scope == "instance" else len(attempts) - 1  # scope all: each attempt but the first
    assert made == len(set(said)) == len(ended) == len(reported), (said, ended, reported, began, attempts)
    assert report(tmp_path)["gave_up"].startswith("not restarted: crash loop")


def test_a_restart_whose_master_port_was_taken_meanwhile_is_not_told(tmp_path: Path) -> None:
    """MASTER_PORT set by the user and taken during attempt 0: no restart (PR440 said), attempt 0's status stays."""
    # GIVEN a free port, set as MASTER_PORT
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = environment(tmp_path, {"MASTER_PORT": str(port)})
    program = '[ "$POPDIST_INSTANCE_INDEX" = 0 ] && touch started; while [ ! -e held ]; do sleep 0.02; done; exit 3'
    proc = subprocess.Popen([sys.executable, "-m", "poprun.cli.main", *TWO, "--max-restarts", "1",
                             "--restart-backoff", "0.05", "--min-uptime", "0", "sh", "-c", program],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    with socket.socket() as holder:
        try:
            _await((tmp_path / "started").exists, "attempt 0 did not start")
            # WHEN something else takes the port before the restart
            holder.bind(("0.0.0.0", port))  # noqa: S104 - as a server would
            holder.listen()
            (tmp_path / "held").touch()
            _, err = proc.communicate(timeout=60)
        finally:
            proc.kill()

    # THEN
    assert 3 == proc.returncode, err
    assert f"error[PR440]: port {port} is already in use on localhost" in err
    assert ([], [], [], []) == restarts_told(err, tmp_path), err
    assert [f"not restarted: port {port} is already in use on localhost (PR440)"] == \
        [a["next"] for a in report(tmp_path)["attempts"]]
