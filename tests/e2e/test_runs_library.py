"""
``poprun.runs`` as a library over real runs: it finds, follows, attaches to, reports and stops them, returning values and printing nothing.

Every launch runs in a ``marked`` environment and keeps its runs in a folder of its own.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from poprun import runs
from tests.conftest import Marked
from tests.e2e.test_detach import TICKING, detach
from tests.e2e.test_runs import launch, runs_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]


def test_a_run_that_ended_is_found_read_and_followed_without_a_word_printed(
        tmp_path: Path, marked: Marked, capfd: pytest.CaptureFixture[str]) -> None:
    """locate, list_runs, follow and read_report return the run, its output and its report; nothing reaches fds 1 and 2."""
    # GIVEN a run of 2 instances that ended with status 3
    env = runs_env(marked, tmp_path)
    launch(env, 'echo "hello $POPDIST_INSTANCE_INDEX"; [ "$POPDIST_INSTANCE_INDEX" = 1 ] && exit 3; true', instances=2)
    capfd.readouterr()

    # WHEN
    run = runs.locate("last", env)
    listed = runs.list_runs(environ=env)
    pieces = list(runs.follow(run, until_over=True))
    one = list(runs.follow(run, instance=1))
    found = runs.read_report(run)

    # THEN
    assert [run.id] == [info.id for info in listed]
    assert ("ended", 3) == (listed[0].state, listed[0].status)
    assert [b"hello 0\n", b"hello 1\n"] == sorted(data for _, _, data in pieces)
    assert [(1, "stdout", b"hello 1\n")] == one
    assert found.result is not None
    assert (3, 1) == (found.data["status"], found.result.root_cause)
    assert 3 == runs.ended_with(run)
    assert ("", "") == capfd.readouterr()


def test_stop_returns_how_the_run_ended_and_a_second_stop_is_a_run_state_error(
        tmp_path: Path, marked: Marked, capfd: pytest.CaptureFixture[str]) -> None:
    """attach yields the running run's output; stop returns a StopResult with status 143; stopping again is PR603."""
    # GIVEN a detached run, ticking
    env = runs_env(marked, tmp_path)
    run = runs.locate(detach(env, TICKING).stdout.strip(), env)
    capfd.readouterr()

    # WHEN its first lines are read, then it is stopped
    first = [data for _, _, data in itertools.islice(runs.attach(run), 2)]
    stopped = runs.stop(run, timeout=20)
    with pytest.raises(runs.RunStateError) as again:
        runs.stop(run)

    # THEN
    assert all(data.startswith(b"tick ") for data in first)
    assert runs.StopResult(run=run, reported=True) == stopped
    assert 143 == stopped.status
    assert "PR603" == again.value.diagnostics[0].code
    assert ("", "") == capfd.readouterr()
    assert {} == marked.survivors(within_s=3.0)
