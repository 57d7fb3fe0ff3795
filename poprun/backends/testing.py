"""
A test double: :class:`RecordingBackend` records the plans it is given and plays back scripted endings.

Layer: ``poprun.backends``; imports :mod:`poprun.backends.base`, ``poprun.planner.plan`` and one
constant of :mod:`poprun.process.output`;
never the spec, and no other backend (it stands in for them). It never starts a
process, so unit tests of ``apply`` stay fast and exact, the way httpx's ``MockTransport``
serves tests of a client. Each instance ends as scripted (exit code 0 unless told); one
scripted to run until stopped ends only when the launch is terminated or another instance
fails, as with a real backend, which awaits the launch's ``gate`` first.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping
from typing import ClassVar

from poprun.backends.base import (
    ApplyResult,
    Gate,
    InstanceFailure,
    LaunchError,
    OutputSink,
    TemporaryCache,
    environment,
)
from poprun.core.record import record
from poprun.planner.plan import Instance, LaunchPlan
from poprun.process.output import TAIL_LINES


@record
class Outcome:
    """
    How one scripted instance ends, and what it prints first.

    At most one of ``exit_code`` (non-zero), ``signal`` and ``until_stopped`` is used:
    ``signal`` N ends it as if killed by N; ``until_stopped`` keeps it running until the launch
    is stopped (SIGTERM, or SIGKILL with no grace). ``stdout``/``stderr`` are whole lines.
    """

    exit_code: int = 0
    signal: int | None = None
    until_stopped: bool = False
    stdout: bytes = b""
    stderr: bytes = b""


@record
class Recorded:
    """One call of :meth:`RecordingBackend.launch`: the plan, the launching environment and the temporary cache."""

    plan: LaunchPlan
    env_source: tuple[tuple[str, str], ...]  # sorted
    cache: TemporaryCache | None = None

    def environment(self, index: int) -> dict[str, str]:
        """Return the environment instance ``index`` would get, by the local backend's rule."""
        return environment(self.plan.instances[index], dict(self.env_source))


class RecordingLaunch:
    """A launch that replays :class:`Outcome` values; see :class:`~poprun.backends.base.Launch`."""

    def __init__(self, plan: LaunchPlan, outcomes: Mapping[int, Outcome], sink: OutputSink,
                 gate: Gate | None = None) -> None:
        self._plan, self._outcomes, self._sink, self._gate = plan, outcomes, sink, gate
        self.terminations: list[float] = []  # the grace of each terminate() call, in order
        self.gated = 0  # how many times the gate was awaited (once per launch with a failure)
        self.forwarded: list[int] = []  # the signal of each forward() call, in order

    def terminate(self, grace_s: float) -> None:
        """Record the call; instances scripted to run until stopped end when waited for."""
        self.terminations.append(grace_s)

    def forward(self, sig: int) -> None:
        """Record the call (no instance is a process to signal)."""
        self.forwarded.append(sig)

    def wait(self) -> ApplyResult:
        """
        Return the scripted result: instances end in index order, those run until stopped last.

        After a failure (an instance that ended on its own with a non-zero status) the gate is
        awaited before those run until stopped are ended, as a backend tears down.

        Raises:
            RuntimeError: when an instance runs until stopped and nothing stops it (a real
                backend would wait for ever).
        """
        ended = [i for i in self._plan.instances if not self._outcome(i).until_stopped]
        running = [i for i in self._plan.instances if self._outcome(i).until_stopped]
        failures = [f for f in (self._end(i) for i in ended) if f is not None]
        if running and not failures and not self.terminations:
            msg = f"instance {running[0].index} runs until stopped, and nothing stops it"
            raise RuntimeError(msg)
        if failures and self._gate is not None:
            self.gated += 1
            self._gate()
        kill = signal.SIGKILL if self.terminations and self.terminations[-1] <= 0 else signal.SIGTERM
        failures += [InstanceFailure(index=i.index, host=i.host, signal=kill, stopped=True, tail=self._tail(i))
                     for i in running]
        statuses = {f.index: f.status for f in failures}
        cause = next((f.index for f in failures if not f.stopped), None)
        return ApplyResult(statuses=tuple(statuses.get(i.index, 0) for i in self._plan.instances),
                           failures=tuple(failures), root_cause=cause)

    def _outcome(self, instance: Instance) -> Outcome:
        return self._outcomes.get(instance.index, Outcome())

    def _end(self, instance: Instance) -> InstanceFailure | None:
        """Forward the instance's scripted output; return its failure, or None."""
        outcome = self._outcome(instance)
        if outcome.stdout:
            self._sink.write("stdout", outcome.stdout)
        if outcome.stderr:
            self._sink.write("stderr", outcome.stderr)
        if outcome.signal is None and outcome.exit_code == 0:
            return None
        return InstanceFailure(index=instance.index, host=instance.host, tail=self._tail(instance),
                               exit_code=None if outcome.signal is not None else outcome.exit_code,
                               signal=outcome.signal)

    def _tail(self, instance: Instance) -> tuple[str, ...]:
        outcome = self._outcome(instance)
        lines = (outcome.stdout + outcome.stderr).decode(errors="replace").splitlines()
        return tuple(lines[-TAIL_LINES:])


class RecordingBackend:
    """
    Records every launch and plays back scripted endings; never starts a process.

    ``outcomes`` maps an instance index to its :class:`Outcome`, or to an exit code; other
    instances exit 0. With ``error``, every launch records the plan and then raises it.
    """

    name: ClassVar[str] = "recording"

    def __init__(self, outcomes: Mapping[int, Outcome | int] | None = None, *,
                 error: LaunchError | None = None) -> None:
        self.outcomes = {i: o if isinstance(o, Outcome) else Outcome(exit_code=o) for i, o in (outcomes or {}).items()}
        self.error = error
        self.launches: list[Recorded] = []
        self.running: list[RecordingLaunch] = []  # the launches returned, in order

    def launch(self, plan: LaunchPlan, *, env_source: Mapping[str, str], sink: OutputSink,
               cache: TemporaryCache | None = None, gate: Gate | None = None) -> RecordingLaunch:
        """
        Record ``plan``, ``env_source`` and ``cache``; return a launch that replays the outcomes (``gate``: see its wait).

        Raises:
            LaunchError: the scripted ``error``, after recording.
        """
        self.launches.append(Recorded(plan=plan, env_source=tuple(sorted(env_source.items())), cache=cache))
        if self.error is not None:
            raise self.error
        launch = RecordingLaunch(plan, self.outcomes, sink, gate)
        self.running.append(launch)
        return launch

    @property
    def plans(self) -> tuple[LaunchPlan, ...]:
        """The plans launched, in order."""
        return tuple(r.plan for r in self.launches)
