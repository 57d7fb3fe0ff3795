"""
What a ``--pre-restart`` command starts is held as the launch's instances are, on every path, with either scope.

Each test runs the real CLI with a health check that starts helpers the usual ways of escaping a
process group (``setsid``, ``nohup``, a double fork), each with a marker in its argv, in a
``marked`` environment: then it ends the run one way or another and reads the process table.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.conftest import Marked
from tests.e2e.test_recovery_adversarial import await_pid, gone, pids_with
from tests.e2e.test_runs import PY, runs_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

# instance 0 fails on its first run; started again (alone, or with every instance) it leaves a file and sleeps
PROGRAM = ('[ "$POPDIST_INSTANCE_INDEX" = 0 ] && [ "$POPRUN_RESTART_COUNT" = 0 ] && exit 3; '
           '[ "$POPDIST_INSTANCE_INDEX" = 0 ] && touch restarted; exec sleep 30')


def helpers(seconds: str) -> str:
    """Return shell text that starts three helpers out of its process group, each ``sleep SECONDS``, then returns."""
    quiet = ">/dev/null 2>&1 </dev/null"
    return (f"setsid sleep {seconds} {quiet} & nohup sleep {seconds} {quiet} & "
            f"sh -c 'sleep {seconds} {quiet} &' {quiet}; ")


def start(env: dict[str, str], cwd: Path, scope: str, check: str) -> subprocess.Popen[str]:
    """Start poprun with two instances, one restart of ``scope`` and the pre-restart command ``check``."""
    return subprocess.Popen([PY, "-m", "poprun.cli.main", "--num-instances", "2", "--num-replicas", "2",
                             "--max-restarts", "1", "--restart-scope", scope, "--restart-backoff", "0.05",
                             "--min-uptime", "0", "--pre-restart", check, "sh", "-c", PROGRAM],
                            cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def await_file(path: Path, within_s: float = 30) -> bool:
    deadline = time.monotonic() + within_s
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def marker(tag: int) -> str:
    """Return seconds for ``sleep`` that only this test's processes have in their argv."""
    return f"6{tag}.{os.getpid()}{time.monotonic_ns() % 1000000}"


@pytest.fixture
def cleanup() -> list[str]:
    """Collect argv markers; kill what still has one at the end (a failed test leaves nothing behind)."""
    needles: list[str] = []
    yield needles
    for needle in needles:
        for pid in pids_with(needle):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("cgroup", ["1", "0"])
@pytest.mark.parametrize("scope", ["all", "instance"])
def test_the_pre_restart_commands_helpers_end_with_it_while_the_run_goes_on(
        tmp_path: Path, marked: Marked, scope: str, cgroup: str, cleanup: list[str]) -> None:
    """The check starts helpers and succeeds: they are gone once it ended, while the restarted run goes on (no cgroup too)."""
    # GIVEN
    seconds = marker(1)
    cleanup.append(f"sleep\0{seconds}\0")
    proc = start(runs_env(marked, tmp_path) | {"POPRUN_CGROUP": cgroup}, tmp_path, scope, helpers(seconds) + "exit 0")
    try:
        # WHEN instance 0 runs again, the check having ended
        assert await_file(tmp_path / "restarted"), "instance 0 did not start again"

        # THEN nothing of the check is left, while poprun still runs
        assert gone(f"sleep\0{seconds}\0", within_s=5), f"left running: {pids_with(f'sleep{chr(0)}{seconds}')}"
        assert proc.poll() is None
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
    assert 143 == proc.returncode
    assert {} == marked.survivors(within_s=5.0)


@pytest.mark.parametrize("scope", ["all", "instance"])
@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_poprun_ended_while_the_check_runs_leaves_nothing_of_it(tmp_path: Path, marked: Marked, scope: str,
                                                               how: str, cleanup: list[str]) -> None:
    """poprun killed (or stopped) while the check, having started helpers, still runs: nothing of either is left."""
    # GIVEN a check that hangs once its helpers run
    seconds, hang = marker(2), marker(3)
    cleanup.extend([f"sleep\0{seconds}\0", f"sleep\0{hang}\0"])
    proc = start(runs_env(marked, tmp_path), tmp_path, scope, helpers(seconds) + f"exec sleep {hang}")
    try:
        assert await_pid(f"sleep\0{hang}\0", within_s=30), "the pre-restart command did not start"
        assert len(await_pid(f"sleep\0{seconds}\0")) >= 1
        assert await_file(next((tmp_path / "runs").iterdir()) / "events.jsonl")
        deadline = time.monotonic() + 30  # the launch has returned: a stop stops it (it does not unwind its start)
        while '"launch-running"' not in next((tmp_path / "runs").iterdir()).joinpath("events.jsonl").read_text():
            assert time.monotonic() < deadline
            time.sleep(0.02)

        # WHEN
        proc.send_signal(getattr(signal, how))
        proc.communicate(timeout=30)
    finally:
        proc.kill()

    # THEN
    assert (-signal.SIGKILL if how == "SIGKILL" else 143) == proc.returncode
    assert gone(f"sleep\0{seconds}\0", within_s=5), f"left running: {pids_with(f'sleep{chr(0)}{seconds}')}"
    assert gone(f"sleep\0{hang}\0", within_s=5)
    assert {} == marked.survivors(within_s=5.0)


@pytest.mark.parametrize("cgroup", ["1", "0"])
@pytest.mark.parametrize("scope", ["all", "instance"])
def test_a_failing_check_leaves_none_of_its_helpers(tmp_path: Path, marked: Marked, scope: str, cgroup: str,
                                                   cleanup: list[str]) -> None:
    """The check starts helpers and fails: the run ends with the failure's status, and nothing of the check is left."""
    seconds = marker(4)
    cleanup.append(f"sleep\0{seconds}\0")

    proc = start(runs_env(marked, tmp_path) | {"POPRUN_CGROUP": cgroup}, tmp_path, scope, helpers(seconds) + "exit 1")
    _, err = proc.communicate(timeout=60)

    assert 3 == proc.returncode, err
    assert "not restarted: the pre-restart command failed with status 1" in err
    assert gone(f"sleep\0{seconds}\0", within_s=3)
    assert {} == marked.survivors(within_s=5.0)


@pytest.mark.parametrize("scope", ["all", "instance"])
def test_a_check_killed_by_a_signal_is_said_so(tmp_path: Path, marked: Marked, scope: str) -> None:
    """The check dies of SIGKILL: the run ends with the failure's status, and the report says how the check ended."""
    proc = start(runs_env(marked, tmp_path), tmp_path, scope, "kill -KILL $$")
    _, err = proc.communicate(timeout=60)

    assert 3 == proc.returncode, err
    assert "not restarted: the pre-restart command was killed by SIGKILL" in err


def test_a_check_that_reads_its_input_gets_none_and_ends(tmp_path: Path, marked: Marked) -> None:
    """poprun's stdin is a pipe that stays open: a check that reads its input reads nothing (not the instances')."""
    env = runs_env(marked, tmp_path)
    read_end, write_end = os.pipe()  # this test holds the write end open throughout
    proc = subprocess.Popen([PY, "-m", "poprun.cli.main", "--num-instances", "2", "--num-replicas", "2",
                             "--max-restarts", "1", "--restart-backoff", "0.05", "--min-uptime", "0", "--pre-restart",
                             'read -r line; echo "check read [$line]" >&2', "sh", "-c",
                             '[ "$POPRUN_RESTART_COUNT" = 0 ] && exit 3; echo done'],
                            cwd=tmp_path, env=env, stdin=read_end, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    os.close(read_end)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
        os.close(write_end)

    assert 0 == proc.returncode, err
    assert "check read []" in err
    assert ["done", "done"] == out.split()


def test_a_check_that_hangs_is_ended_at_its_deadline_with_what_it_started(monkeypatch: pytest.MonkeyPatch,
                                                                          cleanup: list[str]) -> None:
    """A check that never ends is killed at its deadline, a helper it started with setsid too, and says why."""
    from poprun.apply import recovery

    seconds = marker(5)
    cleanup.append(f"sleep\0{seconds}\0")
    monkeypatch.setattr(recovery, "PRE_RESTART_TIMEOUT_S", 1.0)

    failed = recovery.run_pre_restart(helpers(seconds) + "exec sleep 60", dict(os.environ), {},
                                      cancelled=threading.Event())

    assert "the pre-restart command did not end within 1 s" == failed
    assert gone(f"sleep\0{seconds}\0", within_s=5)
