"""
A stop signal's handler runs in the main thread between any two bytecodes, locks held or not.

poprun's handlers stop the run from the main thread: they tell "stopping" (an event through the
relay, into the run record and the console) and terminate the launch. The main thread writes
events itself too (launch-running, attempt-ended ...), so a handler may run while that thread
is half-way through writing one, holding the record's and the sink's locks: a real signal,
sent from inside that write, must neither deadlock nor mix the lines.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from poprun.apply.relay import Relay
from poprun.backends.conformance import MemorySink, probe_plan
from poprun.core import events
from poprun.runs.record import RunRecord

pytestmark = pytest.mark.timeout(20)  # a deadlock fails here (pytest-timeout's SIGALRM interrupts the lock)


class Sink(MemorySink):
    """Keeps every event, in order, and says whether one came while another was being told."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[events.Event] = []
        self.inside = False
        self.nested = False

    def event(self, event: events.Event) -> None:
        self.nested = self.nested or self.inside
        self.inside = True
        try:
            self.events.append(event)
        finally:
            self.inside = False


@pytest.fixture
def record(tmp_path: Path) -> Iterator[RunRecord]:
    made = RunRecord.create({"POPRUN_RUNS_DIR": str(tmp_path / "runs")})
    yield made
    made.close()


def written(record: RunRecord) -> list[str]:
    lines = Path(record.path, "events.jsonl").read_text().splitlines()
    return [json.loads(line)["event"] for line in lines]


def test_a_stop_signal_inside_the_records_write_is_told_after_it(tmp_path: Path, record: RunRecord) -> None:
    """SIGUSR1 (standing for SIGHUP) arrives while the main thread writes launch-running: stopping follows it, whole."""
    # GIVEN a relay whose record's write of an event is where the signal arrives, once
    sink = Sink()
    relay = Relay(probe_plan("pass", tmp_path, backend="local"), sink, record, {})
    write_all, sent = record._write_all, []

    def interrupted(fd: int, data: bytes) -> None:
        if not sent:
            sent.append(True)
            os.kill(os.getpid(), signal.SIGUSR1)  # the handler runs at the next bytecode, the lock held
        write_all(fd, data)

    record._write_all = interrupted  # type: ignore[method-assign]
    previous = signal.signal(signal.SIGUSR1, lambda _n, _f: relay.stopping("received SIGHUP"))
    try:
        # WHEN
        relay.event(events.LaunchRunning())
    finally:
        signal.signal(signal.SIGUSR1, previous)

    # THEN
    assert ["launch-running", "stopping"] == written(record)
    assert [events.LaunchRunning(), events.Stopping(reason="received SIGHUP")] == sink.events
    assert not sink.nested


def test_a_stop_signal_inside_the_sinks_event_is_told_after_it(tmp_path: Path) -> None:
    """The handler comes while the sink (the console) is told an event: the sink is never entered twice at once."""
    sink = Sink()
    relay = Relay(probe_plan("pass", tmp_path, backend="local"), sink, None, {})
    told = sink.event

    def interrupted(event: events.Event) -> None:
        if isinstance(event, events.LaunchRunning):
            os.kill(os.getpid(), signal.SIGUSR1)
        told(event)

    sink.event = interrupted  # type: ignore[method-assign]
    previous = signal.signal(signal.SIGUSR1, lambda _n, _f: relay.stopping("received SIGTERM"))
    try:
        relay.event(events.LaunchRunning())
    finally:
        signal.signal(signal.SIGUSR1, previous)

    assert [events.LaunchRunning(), events.Stopping(reason="received SIGTERM")] == sink.events
    assert not sink.nested
