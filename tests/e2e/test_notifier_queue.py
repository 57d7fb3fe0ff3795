"""
The notifier's queue and deadline, driven directly (:class:`poprun.apply.notify.Notifier`) with real ``/bin/sh`` commands.

What the relay calls never waits, however slow the command; a full queue drops its oldest lines
and says how many; the end waits one deadline at most.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from poprun.apply.notify import QUEUE, Notifier
from poprun.core.events import AttemptEnded, LaunchRunning, RunEnded
from poprun.planner.plan import Observe

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def notifier(command: str, *, kinds: tuple[str, ...] = ("run-ended", "attempt-ended"), timeout_ms: int = 10000,
             env: dict[str, str] | None = None) -> Notifier:
    import os

    observe = Observe(notify=command, notify_on=kinds, notify_timeout_ms=timeout_ms)
    return Notifier(observe, env if env is not None else dict(os.environ), "20261128-000000-abcdef")


def test_telling_events_never_waits_for_a_slow_command():
    """A thousand events to a command that sleeps: each call returns at once (the queue takes them, or drops)."""
    slow = notifier("sleep 30", timeout_ms=200)

    started = time.monotonic()
    for number in range(1000):
        slow.event(AttemptEnded(attempt=number, status=1))
    took = time.monotonic() - started
    slow.close()

    assert took < 1.0, f"1000 events took {took:.2f} s"


def test_a_full_queue_drops_the_oldest_and_counts_them(tmp_path: Path):
    """150 events at once: the first runs, 100 wait, the oldest others are dropped and counted in one warning."""
    # GIVEN a command that records each event's attempt, slowly at first
    gate = tmp_path / "open"
    command = f"while [ ! -e {gate} ]; do sleep 0.02; done; cat >> {tmp_path / 'got.jsonl'}"
    n = notifier(command, timeout_ms=30000)

    # WHEN 150 events come while the first waits
    for number in range(150):
        n.event(AttemptEnded(attempt=number, status=1))
    gate.touch()
    warnings = n.close()

    # THEN the newest 100 (and the first, already running) were told, in order
    got = [json.loads(line)["attempt"] for line in (tmp_path / "got.jsonl").read_text().splitlines()]
    dropped = 150 - len(got)
    assert got[-QUEUE:] == list(range(150 - QUEUE, 150))
    assert got == sorted(got)
    assert [("PR467", f"the queue of {QUEUE} notifications was full: the oldest waiting was dropped ({dropped} times)")
            ] == [(w.code, w.detail) for w in warnings]


def test_the_end_waits_one_deadline_at_most_then_kills_and_drops():
    """Three events to a command that hangs: close returns after about one deadline, the rest said not sent."""
    n = notifier("sleep 300", timeout_ms=1000)
    for number in range(3):
        n.event(AttemptEnded(attempt=number, status=1))

    started = time.monotonic()
    warnings = n.close()
    took = time.monotonic() - started

    assert took < 1 + 5, f"close took {took:.1f} s"
    details = sorted(w.detail for w in warnings)
    assert any(re.match(r"\d notifications? still waiting when poprun ended", d) for d in details), details
    assert any("was still running when poprun ended (at most 1 s after the run): it was killed" in d
               or "did not end within 1 s" in d for d in details), details


def test_a_command_that_hangs_is_killed_at_its_deadline_and_the_next_runs(tmp_path: Path):
    """The first event's command hangs past its deadline: killed, told once, and the next event still runs."""
    command = f'[ "$POPRUN_NOTIFY_EVENT" = attempt-ended ] && exec sleep 300; cat >> {tmp_path / "got.jsonl"}'
    n = notifier(command, timeout_ms=500)

    n.event(AttemptEnded(attempt=0, status=1))
    n.event(RunEnded(status=0))
    warnings = _close_when_sent(n, 1)

    assert ["run-ended"] == [json.loads(line)["event"] for line in (tmp_path / "got.jsonl").read_text().splitlines()]
    assert ["the notify command did not end within 0.5 s: it was killed (for attempt-ended)"] == [
        w.detail for w in warnings]


def _close_when_sent(n: Notifier, count: int) -> tuple[object, ...]:
    deadline = time.monotonic() + 30
    while n.sent < count and time.monotonic() < deadline:
        time.sleep(0.02)
    return n.close()


def test_kinds_not_chosen_are_not_queued(tmp_path: Path):
    """Only the chosen kinds reach the command; others cost a comparison."""
    n = notifier(f"cat >> {tmp_path / 'got.jsonl'}", kinds=("run-ended",))

    n.event(LaunchRunning())
    n.event(AttemptEnded(attempt=0, status=0))
    n.event(RunEnded(status=0))
    assert () == n.close()

    assert ["run-ended"] == [json.loads(line)["event"] for line in (tmp_path / "got.jsonl").read_text().splitlines()]


def test_the_command_never_inherits_itself(tmp_path: Path):
    """POPRUN_NOTIFY_COMMAND is taken out before the command runs: what it starts does not see it."""
    n = notifier(f"env > {tmp_path / 'env'}")

    n.event(RunEnded(status=0))
    assert () == n.close()

    names = [line.split("=", 1)[0] for line in (tmp_path / "env").read_text().splitlines()]
    assert "POPRUN_NOTIFY_COMMAND" not in names
    assert {"POPRUN_NOTIFY_EVENT", "POPRUN_RUN_ID"} <= set(names)
