"""
Applying a plan: the one library step between a finished plan and the backend that runs it.

Layer: ``poprun.apply``; imports ``poprun.backends`` and ``poprun.partitions`` (lazily),
``poprun.planner.plan`` and ``poprun.core``. It never prints and never exits: the CLI maps its
events to the status line and logs, and its result to an exit status
(:mod:`poprun.cli.run`); ``poprun.render.outcome`` shows the result.

:func:`apply` owns every decision made at apply time, in this order, undone in reverse on
every path:

1. the backend, found by name in the registry;
2. the partition step (:mod:`poprun.apply.partition`): the partition is acquired and its
   variables set in every instance; it is released at the end, whatever happened;
3. the temporary executable cache: made here (owner-only) and handed to the backend as a
   :class:`~poprun.backends.base.TemporaryCache`; removed at the end, by record;
4. the launch, and waiting for it, stopped on the caller's request (:class:`Control`).

Progress is reported as typed events (:mod:`poprun.core.events`) to the sink it is given,
which also receives the instances' output, from one thread at a time: the partition step, the launch starting (with the
variables this step added), every instance starting and ending, the launch running, stopping
(once, with the first reason) and ending.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator, Mapping

from popdist.env import EXECUTABLE_CACHE_PATH
from poprun.apply import partition
from poprun.backends.base import Backend, EventSink, Launch, LaunchError, Stream, TemporaryCache
from poprun.backends.registry import BackendRegistry, default_registry
from poprun.core.diagnostic import Diagnostic, DiagnosticError
from poprun.core.events import (
    Event,
    InstanceEnded,
    InstanceOutputTruncated,
    InstanceStarted,
    LaunchEnded,
    LaunchRunning,
    LaunchStarting,
    RunEnded,
    RunStarted,
    Stopping,
    Teardown,
)
from poprun.core.outcome import CANNOT_LAUNCH, ApplyError, ApplyResult, exit_status, signal_name
from poprun.core.record import evolve
from poprun.planner.plan import LaunchPlan
from poprun.runs.record import RUN_ID, RunRecord

__all__ = ["CACHE_PREFIX", "GRACE_S", "Control", "Stopped", "apply"]

GRACE_S = 5.0  # between SIGTERM and SIGKILL when the launch is stopped
CACHE_PREFIX = "poprun-cache-"  # a temporary cache's name begins so (a name only: it is removed by record)


class Stopped(BaseException):  # like KeyboardInterrupt: it unwinds the steps before the launch
    """A stop came before anything was launched (the partition step, the cache, the backend's start)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class Control:
    """
    How the caller of :func:`apply` stops the launch, or pauses it; one per apply.

    :meth:`stop` takes a signal number (SIGINT, SIGTERM, SIGHUP): called from a signal handler
    before the launch has started (the partition step, a backend's preflight waiting on a host
    that does not answer), it raises :class:`Stopped` there, which unwinds every step, the
    backend's start included (a backend undoes what it began); once the launch runs, it stops
    the instances (SIGTERM, SIGKILL after the grace period; a second stop kills at once).
    Called from another thread before the launch, it takes effect as soon as the launch exists.
    :meth:`output_closed` stops the launch as SIGPIPE would stop a tool, once. ``signals``
    lists every stop, SIGPIPE included.
    """

    def __init__(self, *, grace_s: float = GRACE_S) -> None:
        self.signals: list[int] = []
        self.grace_s = grace_s
        self._launch: Launch | None = None
        self._stops = 0  # stop signals received: the second kills
        self._tell: _Relay | None = None
        self._finished = False  # apply() has returned: a stop now changes nothing

    def stop(self, signum: int) -> None:
        """Stop the launch because of signal ``signum`` (see the class docstring)."""
        self.signals.append(signum)
        self._stops += 1
        if self._finished:
            return
        if self._launch is None:
            if threading.current_thread() is threading.main_thread():
                raise Stopped(signum)
            return  # apply() stops the launch once it exists
        self._stopping(f"received {signal_name(signum)}")
        self._launch.terminate(self._grace())

    def output_closed(self, stream: Stream) -> None:
        """``stream`` has no reader any more: stop the launch, as SIGPIPE stops a tool (from any thread), once."""
        if signal.SIGPIPE in self.signals:
            return
        self.signals.append(signal.SIGPIPE)
        if self._finished:
            return
        self._stopping(f"{stream} was closed")
        if self._launch is not None:
            self._launch.terminate(self.grace_s)

    def forward(self, sig: int) -> None:
        """Send ``sig`` (SIGTSTP, SIGCONT) to every instance, where the backend can (Ctrl-Z)."""
        forward = getattr(self._launch, "forward", None)
        if forward is not None:
            forward(sig)

    def _started(self, launch: Launch) -> None:
        """Remember ``launch``; stop it at once if a stop came while it was starting."""
        self._launch = launch
        if self.signals:
            if self.signals[-1] != signal.SIGPIPE:
                self._stopping(f"received {signal_name(self.signals[-1])}")
            launch.terminate(self._grace())

    def _stopping(self, why: str) -> None:
        if self._tell is not None:
            self._tell.stopping(why)

    def _grace(self) -> float:
        return self.grace_s if self._stops <= 1 else 0


class _Relay:
    """
    The sink the backend writes to: output and events pass on (and into the run record); the first failure is told as stopping.

    The caller's sink hears from one thread at a time (the backend's, and this step's own, in
    the main thread): a reentrant lock, since a signal handler in the main thread may tell of
    stopping while it writes. With a run record, each instance's lines are kept there too
    (:meth:`instance_lines`, which the backend's output router calls when its sink has it).
    """

    def __init__(self, plan: LaunchPlan, sink: EventSink, record: RunRecord | None,
                 environ: Mapping[str, str]) -> None:
        self.plan, self._sink, self._record, self._environ = plan, sink, record, environ
        self._lock = threading.Lock()
        self._calls = threading.RLock()
        self._stopping = False
        self.failed: Exception | None = None  # the first exception of the sink at a backend's event: raised by apply()
        self._pids: dict[int, int] = {}  # instance -> pid, as started
        if record is not None:
            self.instance_lines = self._instance_lines

    def observe(self) -> None:
        """Read back what each instance started as, into the record (once every instance has started)."""
        if self._record is None:
            return
        from poprun.runs.verify import observe

        for index, pid in sorted(self._pids.items()):
            self._record.observed[index] = observe(self.plan.instances[index], pid, self._environ)

    def write(self, stream: Stream, data: bytes) -> None:
        with self._calls:
            self._sink.write(stream, data)

    def event(self, event: Event) -> None:
        if isinstance(event, InstanceStarted) and 0 <= event.index < len(self.plan.instances):
            instance = self.plan.instances[event.index]
            event = event if event.host else evolve(event, host=instance.host)
            self._pids[event.index] = event.pid
        with self._calls:
            if self._record is not None:
                self._record.event(event)
            if isinstance(event, InstanceStarted | InstanceEnded):  # the backend's: it must not stop half-way
                try:
                    self._sink.event(event)
                except Exception as exc:  # noqa: BLE001 - apply() stops the launch, then raises it
                    self.failed = self.failed or exc
            else:
                self._sink.event(event)
        if isinstance(event, InstanceEnded):
            if event.lost:
                self.stopping(f"host {self.plan.instances[event.index].host} stopped answering")
            elif event.status != 0 and not event.stopped:
                self.stopping(f"instance {event.index} failed")

    def stopping(self, why: str) -> None:
        """Tell that every instance is being stopped, and why: once, for the first reason."""
        with self._lock:
            if self._stopping:
                return
            self._stopping = True
        self.event(Stopping(reason=why))

    def _instance_lines(self, index: int, stream: Stream, data: bytes) -> None:
        assert self._record is not None
        self._record.instance_lines(index, stream, data)
        while self._record.on_truncated:
            cut, kept = self._record.on_truncated.pop(0)
            self.event(InstanceOutputTruncated(index=cut, kept=kept))


def apply(plan: LaunchPlan, *, sink: EventSink, registry: BackendRegistry | None = None,
          env_source: Mapping[str, str] | None = None, control: Control | None = None,
          record: RunRecord | None = None) -> ApplyResult:
    """
    Run ``plan`` with its backend (see the module docstring); return how it ended.

    ``sink`` receives the instances' output and the events; ``env_source`` is the launching
    environment (default ``os.environ``): forwarded variables and the V-IPU settings are read
    from it. ``control`` is how the caller stops the launch. With ``record`` (a new
    :class:`~poprun.runs.record.RunRecord`), the run is kept there as it happens: its id is
    every instance's ``POPRUN_RUN_ID``, and the record is finished (``report.json``) before this
    returns. When poprun itself failed (nothing ran, or the backend failed while running), the
    result's ``error`` says why; ``signals`` what stopped it; ``warnings`` what to tell at the end.
    """
    control = control or Control()
    environ = os.environ if env_source is None else env_source
    relay = _Relay(plan, sink, record, environ)
    clock = _Clock(record)
    relay.event(RunStarted(run=record.id if record is not None else "", backend=plan.backend.name,
                           instances=len(plan.instances), hosts=plan.topology.hosts))
    try:
        backend = (registry or default_registry()).get(plan.backend.name)
    except (KeyError, DiagnosticError) as exc:  # UnknownBackendError is both
        message = str(exc.args[0]) if isinstance(exc, KeyError) else str(exc)
        return _finish(ApplyResult(statuses=(), error=ApplyError(status=CANNOT_LAUNCH, message=message)), relay,
                       record, clock)
    control._tell = relay  # noqa: SLF001 - the control and the step are one piece
    released: list[Diagnostic] = []  # what releasing the partition warns about, told at the very end
    try:
        with partition.acquired(plan, environ, released, emit=relay.event) as variables, \
                _executable_cache(plan) as cache:
            clock.lap("partition")
            added = dict(variables) | ({EXECUTABLE_CACHE_PATH: cache} if cache is not None else {})
            if record is not None:
                added[RUN_ID] = record.id
            applied = plan.with_variables(added)
            relay.plan = applied  # what the instances are compared with
            if record is not None:
                record.write_plan(applied)
            try:
                result = _launch(backend, applied, environ, relay=relay, control=control, clock=clock,
                                 cache=TemporaryCache(path=cache, remove_at_exit=plan.cache.remove_at_exit)
                                 if cache is not None else None,
                                 started=LaunchStarting(backend=plan.backend.name, instances=len(plan.instances),
                                                        variables=tuple(sorted(added.items())), cache=cache))
            finally:
                relay.event(Teardown())
    except DiagnosticError as exc:  # the partition could not be had (nothing started), or the backend failed running
        result = ApplyResult(statuses=(), error=ApplyError(status=CANNOT_LAUNCH, diagnostics=exc.diagnostics))
    except Stopped as exc:  # before anything started
        result = ApplyResult(statuses=(), error=ApplyError(status=128 + exc.signum, signal=exc.signum,
                                                           message=f"stopped by {signal_name(exc.signum)}"))
    except BaseException as exc:  # a bug, a sink that raised, an interrupt outside a launch: the record still ends
        if record is not None:
            why = f"poprun ended by {type(exc).__name__}: {exc}"
            with contextlib.suppress(Exception):  # the sink may be what raised: the report is written first anyway
                _finish(ApplyResult(statuses=(), error=ApplyError(status=CANNOT_LAUNCH, message=why)), relay, record,
                        clock)
            record.close()
        raise
    control._finished = True  # noqa: SLF001
    return _finish(evolve(result, signals=tuple(control.signals), warnings=tuple(released)), relay, record, clock)


class _Clock:
    """The phases of a run, timed into its record: each :meth:`lap` ends one."""

    def __init__(self, record: RunRecord | None) -> None:
        self._phases = record.phases if record is not None else {}
        self._last = time.monotonic()

    def lap(self, phase: str) -> None:
        now = time.monotonic()
        self._phases[phase] = round(now - self._last, 6)
        self._last = now


def _finish(result: ApplyResult, relay: _Relay, record: RunRecord | None, clock: _Clock) -> ApplyResult:
    """Tell the end of the run, and write its report into the record; return the result with the run's id."""
    clock.lap("teardown")
    status = exit_status(result)
    error = result.error
    try:
        relay.event(RunEnded(status=status, root_cause=result.root_cause,
                             error=(error.message or "; ".join(d.summary for d in error.diagnostics)) if error else ""))
    finally:  # a sink that raises does not keep the report from being written
        if record is not None:
            from poprun.runs.report import report_data

            record.finish(report_data(record, result, status))
    return result if record is None else evolve(result, run=record.id)


@contextlib.contextmanager
def _executable_cache(plan: LaunchPlan) -> Iterator[str | None]:
    """Yield the temporary executable cache made for ``plan`` (owner-only), or None; remove it after."""
    if plan.cache.mode != "temporary":
        yield None
        return
    from poprun.backends._process.files import private_directory, remove_directories

    path = private_directory(CACHE_PREFIX)  # the backend removes it too (and its watchdog)
    try:
        yield path
    finally:
        if plan.cache.remove_at_exit:
            remove_directories([path])


def _launch(backend: Backend, plan: LaunchPlan, environ: Mapping[str, str], *, relay: _Relay, control: Control,
            clock: _Clock, cache: TemporaryCache | None, started: LaunchStarting) -> ApplyResult:
    """Launch and wait; return the result (``error`` when nothing could start)."""
    relay.event(started)
    try:
        launch = backend.launch(plan, env_source=environ, sink=relay, cache=cache)
    except LaunchError as exc:
        clock.lap("start")
        return ApplyResult(statuses=(), error=ApplyError(status=exc.status, message=exc.message,
                                                         diagnostics=exc.diagnostics))
    try:  # whatever raises now (the sink, an interrupt) stops the launch first
        if relay.failed is not None:
            raise relay.failed  # noqa: TRY301 - stopped by the except below
        control._started(launch)  # noqa: SLF001
        clock.lap("start")
        relay.event(LaunchRunning())
        relay.observe()
        result = launch.wait()
    except BaseException:
        launch.terminate(0)
        with contextlib.suppress(Exception):
            launch.wait()  # nothing of the launch is left when apply() raises
        raise
    finally:
        clock.lap("run")
    if relay.failed is not None:
        raise relay.failed
    relay.event(LaunchEnded(statuses=result.statuses, root_cause=result.root_cause))
    return result
