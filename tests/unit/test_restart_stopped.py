"""A stop as a restart's launch starts (scope all): the attempts so far stay in the result, as after any stop."""

from __future__ import annotations

import signal
from pathlib import Path

from poprun.apply import Control, apply
from poprun.backends.conformance import MemorySink, probe_plan
from poprun.backends.registry import BackendRegistry
from poprun.backends.testing import Outcome, RecordingBackend
from poprun.cli.run import exit_status
from poprun.core import events
from poprun.core.record import evolve


class StopAtTheRestart(MemorySink):
    """Stops the run (as SIGTERM's handler would, in the main thread) as attempt 1's launch starts."""

    def __init__(self, control: Control) -> None:
        super().__init__()
        self.control, self.events, self.starts = control, [], 0

    def event(self, event: events.Event) -> None:
        self.events.append(event)
        if isinstance(event, events.LaunchStarting):
            self.starts += 1
            if self.starts == 2:
                self.control.stop(signal.SIGTERM)


def test_a_stop_as_the_restarts_launch_starts_keeps_the_attempts(tmp_path: Path) -> None:
    """SIGTERM as attempt 1 starts: 143, both attempts in the result, the second 'not restarted: poprun was stopped'."""
    # GIVEN a run that fails once and may restart once
    plan = probe_plan("pass", tmp_path, backend="local", instances=1)
    plan = evolve(plan, recovery=evolve(plan.recovery, max_restarts=1, backoff_ms=0, backoff_max_ms=0, min_uptime_ms=0))
    control = Control()
    sink = StopAtTheRestart(control)

    # WHEN
    result = apply(plan, sink=sink, control=control, env_source={},
                   registry=BackendRegistry({"local": lambda: RecordingBackend({0: Outcome(exit_code=3)})}))

    # THEN
    assert 143 == exit_status(result, failed_output=False)
    assert [(0, 3, "restart 1 of 1 in 0 s"), (1, 143, "not restarted: poprun was stopped (SIGTERM)")] == \
        [(a.number, a.status, a.next) for a in result.attempts]
    ended = [(e.attempt, e.restart) for e in sink.events if isinstance(e, events.AttemptEnded)]
    assert [(0, True), (1, False)] == ended
