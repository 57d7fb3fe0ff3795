"""The views of run records (``poprun ps``, ``report``, ``logs``) over core records and plain data, as whole strings."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from poprun.core.outcome import ApplyResult
from poprun.core.runinfo import RunInfo
from poprun.render.runs import (
    Tagger,
    render_duration,
    render_ps,
    render_report,
    render_report_header,
    render_truncation,
    render_verified,
)

STARTED = 1767225600.0  # 2026-01-01 00:00:00 UTC


@pytest.fixture(autouse=True)
def _utc() -> Iterator[None]:
    """Times in UTC for the test, the machine's zone again after it."""
    before = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    yield
    if before is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = before
    time.tzset()


def test_ps_draws_a_table_of_the_runs_with_host_lists_and_masked_programs() -> None:
    """Columns padded to the widest cell; hosts compressed; a secret in argv masked; unknowns as '-'."""
    runs = [RunInfo(id="20260101-000000-aaaaaa", path="/r/a", state="ended", status=3, started=STARTED,
                    ended=STARTED + 75, instances=4, hosts=("pod1", "pod2"), argv=("train", "API_TOKEN=x")),
            RunInfo(id="20260101-000100-bbbbbb", path="/r/b", state="damaged", problem="plan.json: bad")]

    expected = (
        "RUN                     STATE    STARTED              DURATION    INSTANCES  HOSTS     PROGRAM\n"
        "20260101-000000-aaaaaa  ended 3  2026-01-01 00:00:00  1 min 15 s  4          pod[1-2]  train API_TOKEN=****\n"
        "20260101-000100-bbbbbb  damaged  -                    -           -          -         plan.json: bad\n")
    assert expected == render_ps(runs, now=STARTED + 100)


@pytest.mark.parametrize(("seconds", "text"), [(None, "-"), (2.25, "2.2 s"), (184, "3 min 4 s"), (3720, "1 h 2 min")])
def test_durations_read_in_the_largest_units(seconds: float | None, text: str) -> None:
    """Below a minute in tenths of seconds, then minutes and seconds, then hours and minutes."""
    assert text == render_duration(seconds)


def test_tags_mark_each_line_of_a_stream_once_even_across_pieces() -> None:
    """A line split over two pieces is tagged once, as mpirun's --tag-output."""
    tagger = Tagger(tag=True)

    pieces = [tagger.piece(1, "stdout", b"a\nb"), tagger.piece(1, "stdout", b"c\n"), tagger.piece(0, "stderr", b"e\n")]

    assert [b"[1,1]<stdout>:a\n[1,1]<stdout>:b", b"c\n", b"[1,0]<stderr>:e\n"] == pieces
    assert b"x\n" == Tagger(tag=False).piece(0, "stdout", b"x\n")


def test_truncation_notes_name_the_instances_the_record_cut() -> None:
    """One line per cut instance; only the instance asked for when one is."""
    report = {"truncated": {"0": {"kept": 10, "dropped": 5}, "1": {"kept": 10, "dropped": 7}}}

    expected = ("poprun: instance 1's output was cut at 10 bytes (POPRUN_RUN_LOG_LIMIT): 7 bytes are not in the "
                "record\n")
    assert expected == render_truncation(report, 1)
    assert "" == render_truncation(None, None)


def test_verified_is_one_line_when_every_instance_is_as_planned_and_names_what_differs() -> None:
    """The variables that differ are named, never their values; unread instances are counted."""
    actual = {"instances": {"0": {"verified": True, "argv_as_planned": True, "env_as_planned": True,
                                  "cpus_as_planned": True},
                            "1": {"verified": True, "argv_as_planned": True, "env_as_planned": False,
                                  "cpus_as_planned": True, "env_differs": ["A"], "host": "h"},
                            "2": {"verified": False}}}

    expected = ("verified: 1 of 3 instances as planned (argv, environment, CPUs); 1 not read back (on other hosts, "
                "or ended before they could be)\n  instance 1 on h: environment not as planned (A)\n")
    assert expected == render_verified(actual)
    assert "" == render_verified(None)


def test_the_report_of_a_run_that_ended_well_has_its_head_and_phases() -> None:
    """The head says how it ended and ran; the phases follow the outcome, in the order of a launch."""
    info = RunInfo(id="r1", path="/r/r1", state="ended", status=0, started=STARTED, ended=STARTED + 2,
                   instances=1, hosts=("localhost",), argv=("true",), backend="local")
    data = {"status": 0, "phases": {"run": 1.5, "plan": 0.25}}

    head = render_report_header(info, data, now=STARTED + 10)
    body = render_report(data, ApplyResult(statuses=(0,)))

    assert ("run r1: ended with status 0\nstarted 2026-01-01 00:00:00, ran 2.0 s\n"
            "1 instance on localhost (local backend): true\n") == head
    assert body.endswith("phases: plan 0.250 s, run 1.500 s\n")
