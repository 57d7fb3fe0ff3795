"""
``--notify``: the real CLI runs real notifiers; exactly one run-ended line per run, whatever ends it, and never a slower exit.

Each test runs ``poprun`` as a user would, in ``tmp_path``, with a marked environment (what
carries the marker is killed at the end, and looked for to prove nothing was left) and its own
runs folder. Times are measured with generous bounds: a loaded machine only makes them longer
within the bound, never a verdict depend on luck.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import Marked
from tests.e2e.test_runs import PY, runs_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

APPEND = "cat >> notes.jsonl"


def poprun(env: dict[str, str], cwd: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``poprun ARGS`` in ``cwd`` to its end."""
    return subprocess.run([PY, "-m", "poprun.cli.main", *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, check=False)


def notes(cwd: Path) -> list[dict[str, object]]:
    """Return the lines the notifier appended, as JSON."""
    path = cwd / "notes.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def kinds_told(runs: Path) -> list[str]:
    """Return the events of the run's record that --notify-on all chooses."""
    chosen = ("run-ended", "attempt-ended", "limit-reached", "straggler", "replan")
    lines = next(runs.glob("*/events.jsonl")).read_text().splitlines()
    return [e for e in (json.loads(line)["event"] for line in lines) if e in chosen]


def kinds(cwd: Path) -> list[object]:
    return [n["event"] for n in notes(cwd)]


def await_true(check: object, within_s: float = 60) -> bool:
    deadline = time.monotonic() + within_s
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.fixture
def env(marked: Marked, tmp_path: Path) -> dict[str, str]:
    return runs_env(marked, tmp_path)


def test_a_run_that_succeeds_is_notified_once(env, tmp_path):
    """A success: one run-ended line with status 0, the line --events writes, and nothing else by default."""
    # GIVEN a run that also streams its events
    result = poprun(env, tmp_path, "--notify", APPEND, "--events", str(tmp_path / "events.jsonl"), "true")

    # THEN one line came, the run-ended line of the event stream (its time aside)
    assert (0, ["run-ended"]) == (result.returncode, kinds(tmp_path)), result.stderr
    streamed = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()][-1]
    told = notes(tmp_path)[0]
    assert {k: v for k, v in streamed.items() if k != "time"} == {k: v for k, v in told.items() if k != "time"}
    assert abs(float(streamed["time"]) - float(told["time"])) < 5


def test_a_run_that_fails_is_notified_once_with_its_status(env, tmp_path):
    """A failure: one run-ended line with the root cause's status, and poprun's status is the run's."""
    result = poprun(env, tmp_path, "--notify", APPEND, "--num-instances", "2", "--num-replicas", "2",
                    "sh", "-c", '[ "$POPDIST_INSTANCE_INDEX" = 1 ] && exit 3; sleep 30')

    assert 3 == result.returncode, result.stderr
    assert [("run-ended", 3, 1)] == [(n["event"], n["status"], n["root_cause"]) for n in notes(tmp_path)]


def test_a_run_that_restarts_is_notified_once_at_its_end(env, tmp_path):
    """Restarts: each attempt's end is told when chosen, the run's end exactly once, after them."""
    result = poprun(env, tmp_path, "--notify", APPEND, "--notify-on", "run-ended,attempt-ended",
                    "--max-restarts", "2", "--restart-backoff", "0.05", "--min-uptime", "0",
                    "sh", "-c", '[ "$POPRUN_RESTART_COUNT" = 2 ] || exit 5')

    assert 0 == result.returncode, result.stderr
    told = notes(tmp_path)
    assert "run-ended" == told[-1]["event"]
    assert 1 == kinds(tmp_path).count("run-ended")
    assert [(0, True), (1, True)] == [(n["attempt"], n["restart"]) for n in told[:2]]
    assert all(n["event"] == "attempt-ended" for n in told[:-1])


def test_a_run_stopped_by_sigterm_is_notified_once(env, tmp_path):
    """A stop by SIGTERM: one run-ended line with 143, once the instances ended."""
    # GIVEN a run whose instances have started
    proc = subprocess.Popen([PY, "-m", "poprun.cli.main", "--notify", APPEND, "--num-instances", "2",
                             "--num-replicas", "2", "sh", "-c", "touch started.$POPDIST_INSTANCE_INDEX; exec sleep 60"],
                            env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert await_true(lambda: (tmp_path / "started.0").exists() and (tmp_path / "started.1").exists())

    # WHEN it is stopped
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)

    # THEN
    assert 143 == proc.returncode, err
    assert [("run-ended", 143)] == [(n["event"], n["status"]) for n in notes(tmp_path)]


def test_a_launch_that_fails_before_starting_is_notified_once(env, tmp_path):
    """A program not found: nothing started, yet the run ended, once."""
    result = poprun(env, tmp_path, "--notify", APPEND, "./no-such-program")

    assert 127 == result.returncode, result.stderr
    assert [("run-ended", 127)] == [(n["event"], n["status"]) for n in notes(tmp_path)]


def test_a_detached_run_is_notified_once_by_its_supervisor(env, tmp_path):
    """--detach: poprun returns at once; the supervisor notifies the run's end, once."""
    result = poprun(env, tmp_path, "--detach", "--notify", APPEND, "sh", "-c", "sleep 1")

    assert 0 == result.returncode, result.stderr
    assert [] == kinds(tmp_path)  # the run goes on: nothing ended yet
    assert await_true(lambda: kinds(tmp_path) == ["run-ended"])
    time.sleep(0.5)  # a second line would have come by now: the supervisor has ended
    assert [("run-ended", 0)] == [(n["event"], n["status"]) for n in notes(tmp_path)]


def test_a_notifier_that_sleeps_forever_delays_the_exit_by_its_deadline_only(env, tmp_path, marked):
    """``sleep infinity`` as notifier: poprun exits within the deadline and a few seconds; nothing is left."""
    started = time.monotonic()
    result = poprun(env, tmp_path, "--notify", "sleep infinity", "--notify-timeout", "2", "true")
    took = time.monotonic() - started

    assert 0 == result.returncode, result.stderr
    assert took < 2 + 8, f"poprun took {took:.1f} s"
    assert "warning[PR467]" in result.stderr
    assert "still running when poprun ended (at most 2 s after the run): it was killed" in result.stderr
    assert {} == marked.survivors(within_s=5)


@pytest.mark.parametrize("escape", ["sleep 300 &", "setsid sleep 300 &", "nohup sleep 300 &",
                                    "sh -c 'sleep 300 &'"])
def test_a_notifier_whose_child_holds_its_output_does_not_delay_the_exit(env, tmp_path, marked, escape):
    """A notifier that leaves a child holding its standard output: done when it exits, the child killed."""
    started = time.monotonic()
    result = poprun(env, tmp_path, "--notify", f"{escape}\ncat >> notes.jsonl", "--notify-timeout", "20", "true")
    took = time.monotonic() - started

    assert (0, ["run-ended"]) == (result.returncode, kinds(tmp_path)), result.stderr
    assert took < 10, f"poprun took {took:.1f} s"  # far below the deadline: the child's pipe is not waited for
    assert "PR467" not in result.stderr
    assert {} == marked.survivors(within_s=5)


def test_a_failing_notifier_is_one_warning_with_its_output_and_changes_nothing(env, tmp_path):
    """A notifier that fails each time: the run's status stays, one PR467 per kind, its last output, in the report."""
    # GIVEN a run with three attempts, each end notified to a command that fails
    result = poprun(env, tmp_path, "--notify", "echo 'webhook said 503' >&2; exit 4", "--notify-on", "all",
                    "--max-restarts", "2", "--restart-backoff", "0.05", "--min-uptime", "0",
                    "sh", "-c", '[ "$POPRUN_RESTART_COUNT" = 2 ] || exit 5')

    # THEN the status is the run's, and the warning is told once, counting every failure
    assert 0 == result.returncode, result.stderr
    assert 1 == result.stderr.count("warning[PR467]"), result.stderr

    told = re.search(r"failed with status 4 \((\d+) times, for attempt-ended and run-ended\); its last output: webhook said 503", result.stderr)
    assert told is not None, result.stderr
    assert int(told.group(1)) == len(kinds_told(tmp_path / "runs"))  # every chosen event of the run: each failed
    report = json.loads(next((tmp_path / "runs").glob("*/report.json")).read_text())
    assert ["PR467"] == [w["code"] for w in report["warnings"]]


def test_a_missing_notifier_is_a_warning(env, tmp_path):
    """A command that does not exist: status 127 of its shell, told as not found."""
    result = poprun(env, tmp_path, "--notify", "no-such-notifier --to ops", "true")

    assert 0 == result.returncode
    assert "the notify command was not found: status 127 (for run-ended)" in result.stderr
    assert "no-such-notifier: not found" in result.stderr


def test_the_command_is_in_no_argv_and_runs_in_a_group_of_its_own(env, tmp_path):
    """ps never shows the command (it may hold a token); its shell leads no group of poprun's."""
    # GIVEN a notifier with a secret in its text, given in POPRUN_NOTIFY (--notify's fallback: not in poprun's argv
    # either), that waits until the test has looked at the process table
    secret = f"tok-{os.getpid()}-{time.monotonic_ns()}"
    command = (f"echo {secret} >/dev/null; ps -o pgid= -p $$ > group; ps -o pgid= -p $PPID > parent; "
               "while [ ! -e looked ]; do sleep 0.05; done; cat >> notes.jsonl")
    proc = subprocess.Popen([PY, "-m", "poprun.cli.main", "true"], env=env | {"POPRUN_NOTIFY": command}, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert await_true(lambda: (tmp_path / "parent").exists() and (tmp_path / "parent").read_text().strip())

        # WHEN every process's argv is read
        argvs = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    argvs.append((entry / "cmdline").read_bytes())
                except OSError:
                    continue
    finally:
        (tmp_path / "looked").touch()
    _, err = proc.communicate(timeout=60)

    # THEN no argv holds the command, and its shell's group is not poprun's
    assert [] == [a for a in argvs if secret.encode() in a]
    assert (tmp_path / "group").read_text().split() != (tmp_path / "parent").read_text().split()
    assert ["run-ended"] == kinds(tmp_path), err


def test_a_command_with_quotes_substitutions_and_newlines_runs_as_written(env, tmp_path):
    """Quotes, $(), a newline and a glob in the command are the shell's, as the user wrote them."""
    command = "printf '%s\\n' \"it's $(echo sub)\" '*' > out\necho \"$POPRUN_NOTIFY_EVENT ${POPRUN_RUN_ID:+has-id}\" >> out"

    result = poprun(env, tmp_path, "--notify", command, "true")

    assert 0 == result.returncode, result.stderr
    assert "it's sub\n*\nrun-ended has-id\n" == (tmp_path / "out").read_text()


def test_a_notifier_that_prints_megabytes_and_ignores_its_input_is_harmless(env, tmp_path):
    """50 MB of output and an unread standard input: read and dropped, the notification a success."""
    started = time.monotonic()
    result = poprun(env, tmp_path, "--notify", "head -c 50000000 /dev/zero; exit 0", "true")

    assert 0 == result.returncode, result.stderr
    assert "PR467" not in result.stderr
    assert time.monotonic() - started < 30


def test_a_notifier_that_writes_without_end_costs_poprun_no_core(env, tmp_path):
    """``yes`` for its 3 s deadline: read at a bounded rate, so poprun and it use a fraction of a core, not two."""
    import resource

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = poprun(env, tmp_path, "--notify", "yes", "--notify-timeout", "3", "true")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)

    assert 0 == result.returncode, result.stderr
    assert "was still running when poprun ended (at most 3 s after the run)" in result.stderr  # its whole deadline
    used = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert used < 1.5, f"{used:.2f} s of CPU in 3 s"  # before: a core (or two) for the whole deadline


def test_an_event_not_chosen_is_not_notified(env, tmp_path):
    """--notify-on attempt-ended: no run-ended line."""
    result = poprun(env, tmp_path, "--notify", APPEND, "--notify-on", "attempt-ended", "true")

    assert 0 == result.returncode, result.stderr
    assert kinds(tmp_path) in ([], ["attempt-ended"])


def test_a_stop_signal_while_poprun_waits_for_its_notifier_ends_the_wait(env, tmp_path, marked):
    """The run is over, its notifier hangs with a long deadline: a SIGTERM then ends poprun at once, the run's status kept."""
    # GIVEN a run that ended while its notifier hangs (it says so by a file), with a deadline of 10 minutes
    proc = subprocess.Popen([PY, "-m", "poprun.cli.main", "--notify", "touch waiting; exec sleep 600",
                             "--notify-timeout", "600", "sh", "-c", "exit 3"], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert await_true((tmp_path / "waiting").exists)

    # WHEN poprun is told to stop
    started = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)

    # THEN it ends within seconds, with the run's status, the notifier killed and said so
    assert time.monotonic() - started < 10
    assert 3 == proc.returncode, err
    assert "the notify command was still running when poprun ended" in err
    assert {} == marked.survivors(within_s=5)


def test_a_notification_running_across_an_attempt_is_not_taken_for_what_the_attempt_left(env, tmp_path):
    """A notification still running when the next attempt ends: that attempt's clean-up spares it; every line comes."""
    # GIVEN notifications that take longer than each quick attempt (whose end kills what it left behind)
    result = poprun(env, tmp_path, "--notify", "sleep 0.5; cat >> notes.jsonl", "--notify-on", "run-ended,attempt-ended",
                    "--max-restarts", "3", "--restart-backoff", "0.01", "--min-uptime", "0",
                    "sh", "-c", '[ "$POPRUN_RESTART_COUNT" = 3 ] || exit 5')

    # THEN each one ran to its end
    assert 0 == result.returncode, result.stderr
    assert "PR467" not in result.stderr
    assert kinds(tmp_path) == kinds_told(tmp_path / "runs")
