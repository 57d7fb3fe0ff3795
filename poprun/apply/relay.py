"""
Apply's relay: the sink a backend writes to, passing output and events on (and into the run record).

Layer: ``poprun.apply``; imports :mod:`poprun.apply.limits` and :mod:`poprun.apply.watch` (types), :mod:`poprun.apply.mpicheck`
and ``poprun.runs.verify`` (lazily), ``poprun.backends.base`` (types), ``poprun.core``,
``poprun.planner.plan`` and ``poprun.runs.record``; never the attempts or :func:`~poprun.apply.apply`.
It decides nothing and never waits: what must wait before a teardown is the launch's gate
(:class:`poprun.apply.limits.Gate`).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Mapping

from poprun.backends.base import InstanceSink
from poprun.core.events import (
    Event,
    InstanceEnded,
    InstanceOutputTruncated,
    InstanceStarted,
    MpiWithoutLauncher,
    Stopping,
)
from poprun.core.record import evolve
from poprun.planner.plan import LaunchPlan

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from poprun.apply.limits import Limits
    from poprun.apply.recovery import LimitWatch
    from poprun.apply.watch import Watch
    from poprun.backends.base import EventSink, Stream
    from poprun.core.diagnostic import Diagnostic
    from poprun.runs.record import RunRecord

__all__ = ["Clock", "Relay"]


class Relay(InstanceSink):
    """
    The sink the backend writes to: output and events pass on (and into the run record); the first failure is told as stopping.

    The caller's sink and the record hear from one thread at a time (the backend's, and this
    step's own, in the main thread). A stop signal's handler runs in the main thread between any
    two bytecodes, and tells of stopping: when it comes while that thread is telling an event
    (the record's and the sink's locks held), its event waits in :attr:`_pending` and is told
    as soon as the interrupted one is, never inside it (which would deadlock on the record's lock
    or mix the lines). With a run record, each instance's lines are kept there too
    (:meth:`instance_lines`, which the backend's output router calls);
    with time limits, each instance's output also tells the limit watch that it is alive, and
    once a limit is reached each instance's standard error is kept (faulthandler's stacks).
    Every event is also handed to each of :attr:`listeners` (the notifier, the metrics file), as
    to the record: they only take note, and never wait.
    """

    def __init__(self, plan: LaunchPlan, sink: EventSink, record: RunRecord | None,
                 environ: Mapping[str, str]) -> None:
        self.plan, self._sink, self._record, self._environ = plan, sink, record, environ
        self._lock = threading.RLock()  # reentrant: a stop signal's handler may tell of stopping (see above)
        self._calls = threading.RLock()  # held while an event is told; reentrant for the handler's deferral
        self._telling = False  # an event is being told (by the thread that holds _calls)
        self._pending: list[Event] = []  # events a signal handler told meanwhile, in the same thread
        self._stopping = False
        self.failed: Exception | None = None  # the first exception of the sink at a backend's event: raised by apply()
        self._pids: dict[int, int] = {}  # instance -> pid, as started
        self.started: Callable[[], None] | None = None  # told when an instance starts (the run's state)
        self._running: set[int] = set()  # instances running now (none: the stall clock stops)
        self._waiting: set[int] = set()  # instances waiting to start again alone (--restart-scope instance)
        self.limits: Limits | None = None  # the run's time limits, while they are watched
        self.health: Watch | None = None  # the instances' heartbeats and stragglers, when the run listens for progress
        self.notes: list[Diagnostic] = []  # warnings told as the run went on (PR425), for the report
        self.restarted: Callable[[int], None] | None = None  # told first when an instance starts again alone
        r = plan.recovery
        self._keeps = bool(record is not None or r.stall_timeout_ms or r.timeout_ms or r.heartbeat_timeout_ms)
        self._stalls = bool(plan.recovery.stall_timeout_ms)  # any output is a sign of life (instance_output)
        # Who hears every event as the record does (the notifier, the metrics file): each returns at once
        self.listeners: list[Callable[[Event], None]] = []

    def observe(self) -> None:
        """Read back what each instance started as, into the record (once every instance has started)."""
        if self._record is None:
            return
        from poprun.runs.verify import observe

        for index, pid in sorted(self._pids.items()):
            self._record.observed[index] = observe(self.plan.instances[index], pid, self._environ)

    def next_attempt(self) -> None:
        """Begin a new attempt: its first failure is told as stopping again; its instances (a re-plan's may be fewer) are its own."""
        with self._lock:
            self._stopping = False
            self._pids.clear()

    def write(self, stream: Stream, data: bytes) -> None:
        """Pass ``data`` on to the caller's sink."""
        with self._calls:
            self._sink.write(stream, data)

    def event(self, event: Event) -> None:
        """Pass ``event`` on (and into the record); tell stopping at a failure. Returns at once: it never waits."""
        if isinstance(event, MpiWithoutLauncher):  # told once, and only when it is news (see poprun.apply.mpicheck)
            from poprun.apply.mpicheck import mpi_warning

            told = mpi_warning(self.plan, event)
            if told is None or self.notes:
                return
            self.notes.append(told)
        if isinstance(event, InstanceStarted) and event.restart and self.restarted is not None:
            self.restarted(event.index)  # its restart is made now: told before it is seen to start
        if isinstance(event, InstanceStarted) and 0 <= event.index < len(self.plan.instances):
            instance = self.plan.instances[event.index]
            event = event if event.host else evolve(event, host=instance.host)
            self._pids[event.index] = event.pid
            if self.started is not None:
                self.started()
        if self._watch() is not None and isinstance(event, InstanceStarted | InstanceEnded):
            self._alive(event)
        if self.health is not None and isinstance(event, InstanceStarted):
            self.health.started(event.index)  # its heartbeat clock waits for its first report
        elif self.health is not None and isinstance(event, InstanceEnded):
            self.health.ended(event.index)  # an instance that ended is never hung
        with self._calls:
            if self._telling:  # a signal handler interrupted this thread's telling: after it
                self._pending.append(event)
            else:
                self._telling = True
                try:
                    self._tell(event)
                finally:
                    try:
                        while self._pending:
                            self._tell(self._pending.pop(0))
                    finally:
                        self._telling = False
        if isinstance(event, InstanceEnded) and not event.restarting:
            if event.lost:
                self.stopping(f"host {event.via or self.plan.instances[event.index].host} stopped answering")
            elif event.status != 0 and not event.stopped:
                self.stopping(f"instance {event.index} failed")

    def _tell(self, event: Event) -> None:
        """Write ``event`` into the record and pass it on to the caller's sink; with :attr:`_calls` held."""
        if self._record is not None:
            self._record.event(event)
        for listener in self.listeners:
            with contextlib.suppress(Exception):  # what observes the run never stops it (nor the events' sink)
                listener(event)
        if isinstance(event, InstanceStarted | InstanceEnded):  # the backend's: it must not stop half-way
            try:
                self._sink.event(event)
            except Exception as exc:  # noqa: BLE001 - apply() stops the launch, then raises it
                self.failed = self.failed or exc
        else:
            self._sink.event(event)

    def _watch(self) -> LimitWatch | None:
        return self.limits.watch if self.limits is not None else None

    def _alive(self, event: InstanceStarted | InstanceEnded) -> None:
        """Stop the stall clock while no instance runs (one waits to start again alone), start it when one does."""
        watch = self._watch()
        assert watch is not None
        with self._lock:
            if isinstance(event, InstanceStarted):
                self._running.add(event.index)
                self._waiting.discard(event.index)
                watch.resume()
            else:
                self._running.discard(event.index)
                if event.restarting:
                    self._waiting.add(event.index)
                if self._waiting and not self._running:
                    watch.pause()

    @property
    def is_stopping(self) -> bool:
        """Whether every instance is being stopped (a failure that is not restarted, a stop, a limit)."""
        return self._stopping

    def stopping(self, why: str) -> None:
        """Tell that every instance is being stopped, and why: once, for the first reason."""
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
        self.event(Stopping(reason=why))

    def instance_output(self, index: int) -> None:  # noqa: ARG002 - any instance's output is a sign of life
        """Tell the limit watch that an instance wrote output, whole lines or not (a progress bar's carriage returns)."""
        if self._stalls and (watch := self._watch()) is not None:
            watch.output()

    def instance_lines(self, index: int, stream: Stream, data: bytes) -> None:
        """Keep ``data`` of instance ``index`` in the run record, and tell the limit watch (with a record or limits)."""
        if not self._keeps:
            return
        if (watch := self._watch()) is not None:
            watch.output()
        captured = self.limits.captured if self.limits is not None else None
        if captured is not None and stream == "stderr" and len(captured.setdefault(index, bytearray())) < _CAPTURE:
            captured[index] += data[:_CAPTURE - len(captured[index])]
        if self._record is None:
            return
        self._record.instance_lines(index, stream, data)
        while self._record.on_truncated:
            cut, kept = self._record.on_truncated.pop(0)
            self.event(InstanceOutputTruncated(index=cut, kept=kept))


_CAPTURE = 256 << 10  # bytes of an instance's stderr kept once a limit is reached (faulthandler's stacks)




class Clock:
    """The phases of a run, timed into its record: each :meth:`lap` ends one."""

    def __init__(self, record: RunRecord | None) -> None:
        self._phases = record.phases if record is not None else {}
        self._last = time.monotonic()

    def lap(self, phase: str) -> None:
        """End ``phase`` now: add the time since the last lap to it."""
        now = time.monotonic()
        self._phases[phase] = round(self._phases.get(phase, 0.0) + now - self._last, 6)  # attempts add up
        self._last = now


