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
4. the launch, and waiting for it, stopped on the caller's request (:class:`Control`); each
   attempt's instances on this machine get torch's error file (:mod:`poprun.apply.errorfile`),
   whose message a failure carries.

Progress is reported as typed events (:mod:`poprun.core.events`) to the sink it is given,
which also receives the instances' output, from one thread at a time: the partition step, the launch starting (with the
variables this step added), every instance starting and ending, the launch running, stopping
(once, with the first reason) and ending.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping

from popdist import env as names
from popdist.env import EXECUTABLE_CACHE_PATH
from poprun.apply import partition
from poprun.apply.errorfile import ErrorFiles
from poprun.apply.recovery import LimitWatch, RestartBudget, run_pre_restart, seconds
from poprun.backends.base import (
    RESTARTS_INSTANCES,
    Backend,
    EventSink,
    Launch,
    LaunchError,
    Stream,
    TemporaryCache,
    capabilities,
)
from poprun.backends.registry import BackendRegistry, default_registry
from poprun.core.diagnostic import Diagnostic, DiagnosticError, error
from poprun.core.events import (
    AttemptEnded,
    AttemptStarted,
    Event,
    InstanceEnded,
    InstanceOutputTruncated,
    InstanceStarted,
    LaunchEnded,
    LaunchRunning,
    LaunchStarting,
    LimitReached,
    MpiWithoutLauncher,
    RunEnded,
    RunStarted,
    StacksCollected,
    Stopping,
    Teardown,
)
from poprun.core.exitstatus import CANNOT_LAUNCH
from poprun.core.localhost import is_this_machine
from poprun.core.outcome import ApplyError, ApplyResult, Attempt, exit_status, signal_name
from poprun.core.record import evolve
from poprun.core.span import SourceSpan
from poprun.planner.plan import LaunchPlan
from poprun.runs.record import RUN_ID, RunRecord, new_id

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
    before any instance of the attempt has started (the partition step, a backend's preflight
    waiting on a host that does not answer), it raises :class:`Stopped` there, which unwinds
    every step, the backend's start included (a backend undoes what it began); once an instance
    has started (the launch may not have returned yet), it stops the instances as soon as the
    launch exists: SIGTERM, SIGKILL after the grace period; a second stop kills at once.
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
        self._woken = threading.Event()  # set by every stop: a wait between attempts ends
        self._between = False  # a launch ended, the next has not begun: a stop is told (signals, woken), never raised

    def stop(self, signum: int) -> None:
        """Stop the launch because of signal ``signum`` (see the class docstring)."""
        self.signals.append(signum)
        self._stops += 1
        self._woken.set()
        if self._tell is not None:
            self._tell.released.set()  # a stop is not held off by the reading of stacks
        if self._finished:
            return
        if self._launch is None:
            started = self._tell is not None and self._tell.attempt_started
            if threading.current_thread() is threading.main_thread() and not self._between and not started:
                raise Stopped(signum)
            return  # apply() stops the launch once it exists (between attempts: the wait ends, nothing starts)
        self._stopping(f"received {signal_name(signum)}")
        self._launch.terminate(self._grace())

    def output_closed(self, stream: Stream) -> None:
        """``stream`` has no reader any more: stop the launch, as SIGPIPE stops a tool (from any thread), once."""
        if signal.SIGPIPE in self.signals:
            return
        self.signals.append(signal.SIGPIPE)
        self._woken.set()
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
    (:meth:`instance_lines`, which the backend's output router calls when its sink has it);
    with time limits, each instance's output also tells the limit watch that it is alive, and
    once a limit is reached each instance's standard error is kept (faulthandler's stacks).
    """

    def __init__(self, plan: LaunchPlan, sink: EventSink, record: RunRecord | None,
                 environ: Mapping[str, str]) -> None:
        self.plan, self._sink, self._record, self._environ = plan, sink, record, environ
        self._lock = threading.Lock()
        self._calls = threading.RLock()
        self._stopping = False
        self.failed: Exception | None = None  # the first exception of the sink at a backend's event: raised by apply()
        self._pids: dict[int, int] = {}  # instance -> pid, as started
        self.attempt_started = False  # an instance of this attempt has started: a stop waits for the launch
        self._running: set[int] = set()  # instances running now (none: the stall clock stops)
        self._waiting: set[int] = set()  # instances waiting to start again alone (--restart-scope instance)
        self.hold_until = 0.0  # (monotonic) until then a failure is not handed back to the backend (see hold)
        self.released = threading.Event()  # set by a stop: no hold any more
        self.watch: LimitWatch | None = None
        self.captured: dict[int, bytearray] | None = None  # instance -> stderr since a limit was reached
        self.notes: list[Diagnostic] = []  # warnings told as the run went on (PR425), for the report
        self.restarted: Callable[[int], None] | None = None  # told first when an instance starts again alone
        if record is not None or plan.recovery.stall_timeout_ms or plan.recovery.timeout_ms:
            self.instance_lines = self._instance_lines
        if plan.recovery.stall_timeout_ms:
            self.instance_output = self._instance_output

    def observe(self) -> None:
        """Read back what each instance started as, into the record (once every instance has started)."""
        if self._record is None:
            return
        from poprun.runs.verify import observe

        for index, pid in sorted(self._pids.items()):
            self._record.observed[index] = observe(self.plan.instances[index], pid, self._environ)

    def next_attempt(self) -> None:
        """Begin a new attempt: its first failure is told as stopping again."""
        with self._lock:
            self._stopping = False

    def write(self, stream: Stream, data: bytes) -> None:
        with self._calls:
            self._sink.write(stream, data)

    def event(self, event: Event) -> None:
        if isinstance(event, MpiWithoutLauncher):  # told once, and only when it is news (see poprun.apply.mpicheck)
            from poprun.apply.mpicheck import mpi_warning

            told = mpi_warning(self.plan, event)
            if told is None or self.notes:
                return
            self.notes.append(told)
        if isinstance(event, InstanceStarted) and event.restart and self.restarted is not None:
            self.restarted(event.index)  # its restart is made now: told before it is seen to start
        if isinstance(event, LaunchStarting):
            self.attempt_started = False
        if isinstance(event, InstanceStarted) and 0 <= event.index < len(self.plan.instances):
            instance = self.plan.instances[event.index]
            event = event if event.host else evolve(event, host=instance.host)
            self._pids[event.index] = event.pid
            self.attempt_started = True
        if self.watch is not None and isinstance(event, InstanceStarted | InstanceEnded):
            self._alive(event)
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
        if isinstance(event, InstanceEnded) and event.status != 0 and self.hold_until:
            self.hold()  # the backend tears down after a failure's event: not while stacks are read (a time limit)
        if isinstance(event, InstanceEnded) and not event.restarting:
            if event.lost:
                self.stopping(f"host {event.via or self.plan.instances[event.index].host} stopped answering")
            elif event.status != 0 and not event.stopped:
                self.stopping(f"instance {event.index} failed")

    def hold(self) -> None:
        """Return at :attr:`hold_until`, or at once on a stop (:attr:`released`)."""
        while not self.released.is_set() and (left := self.hold_until - time.monotonic()) > 0:
            self.released.wait(min(left, 0.05))

    def _alive(self, event: InstanceStarted | InstanceEnded) -> None:
        """Stop the stall clock while no instance runs (one waits to start again alone), start it when one does."""
        assert self.watch is not None
        with self._lock:
            if isinstance(event, InstanceStarted):
                self._running.add(event.index)
                self._waiting.discard(event.index)
                self.watch.resume()
            else:
                self._running.discard(event.index)
                if event.restarting:
                    self._waiting.add(event.index)
                if self._waiting and not self._running:
                    self.watch.pause()

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

    def _instance_output(self, index: int) -> None:  # noqa: ARG002 - any instance's output is a sign of life
        """Tell the limit watch that an instance wrote output, whole lines or not (a progress bar's carriage returns)."""
        if self.watch is not None:
            self.watch.output()

    def _instance_lines(self, index: int, stream: Stream, data: bytes) -> None:
        if self.watch is not None:
            self.watch.output()
        captured = self.captured
        if captured is not None and stream == "stderr" and len(captured.setdefault(index, bytearray())) < _CAPTURE:
            captured[index] += data[:_CAPTURE - len(captured[index])]
        if self._record is None:
            return
        self._record.instance_lines(index, stream, data)
        while self._record.on_truncated:
            cut, kept = self._record.on_truncated.pop(0)
            self.event(InstanceOutputTruncated(index=cut, kept=kept))


_CAPTURE = 256 << 10  # bytes of an instance's stderr kept once a limit is reached (faulthandler's stacks)


def apply(plan: LaunchPlan, *, sink: EventSink, registry: BackendRegistry | None = None,
          env_source: Mapping[str, str] | None = None, control: Control | None = None,
          record: RunRecord | None = None) -> ApplyResult:
    """
    Run ``plan`` with its backend (see the module docstring); return how it ended.

    ``sink`` receives the instances' output and the events; ``env_source`` is the launching
    environment (default ``os.environ``): forwarded variables and the V-IPU settings are read
    from it. ``control`` is how the caller stops the launch. With ``record`` (a new
    :class:`~poprun.runs.record.RunRecord`), the run is kept there as it happens: its id is
    every instance's ``POPRUN_RUN_ID`` (and torchrun's ``TORCHELASTIC_RUN_ID``, which a run
    without a record gets too, with an id of its own), and the record is finished (``report.json``) before this
    returns. When poprun itself failed (nothing ran, or the backend failed while running), the
    result's ``error`` says why; ``signals`` what stopped it; ``warnings`` what to tell at the end.
    The plan's recovery (:mod:`poprun.apply.recovery`) restarts it, limits it in time and picks
    its MASTER_PORT for each attempt.
    """
    control = control or Control()
    environ = os.environ if env_source is None else env_source
    relay = _Relay(plan, sink, record, environ)
    clock = _Clock(record)
    try:  # a stop may come while the first event waits on its reader (a stdout nobody reads)
        relay.event(RunStarted(run=record.id if record is not None else "", backend=plan.backend.name,
                               instances=len(plan.instances), hosts=plan.topology.hosts))
        backend = (registry or default_registry()).get(plan.backend.name)
    except Stopped as exc:
        return _finish(ApplyResult(statuses=(), error=_stopped(exc), signals=tuple(control.signals)), relay, record,
                       clock)
    except (KeyError, DiagnosticError) as exc:  # UnknownBackendError is both; a plugin that cannot be made (PR460)
        failed = ApplyError(status=CANNOT_LAUNCH, message=str(exc.args[0])) if isinstance(exc, KeyError) else \
            ApplyError(status=CANNOT_LAUNCH, message=str(exc), diagnostics=tuple(exc.diagnostics))
        return _finish(ApplyResult(statuses=(), error=failed), relay, record, clock)
    control._tell = relay  # noqa: SLF001 - the control and the step are one piece
    released: list[Diagnostic] = []  # what releasing the partition warns about, told at the very end
    try:
        # attempt 0's MASTER_PORT first: reading another host's ports takes a connection, and nothing of the
        # launch (its temporary cache) exists yet should poprun be killed meanwhile
        first_port = _master_port(backend, plan, environ, avoid=())
        with partition.acquired(plan, environ, released, emit=relay.event) as variables, \
                _executable_cache(plan) as cache:
            clock.lap("partition")
            # the partition's variables the plan leaves open (its id when not named): the rest are the plan's,
            # the user's -x IPUOF_VIPU_API_TIMEOUT among them, and explain showed them
            planned = {name for i in plan.instances for name in (*dict(i.env.set), *i.env.forward)}
            added = {k: v for k, v in variables.items() if k not in planned}
            added |= {EXECUTABLE_CACHE_PATH: cache} if cache is not None else {}
            run_id = record.id if record is not None else new_id(time.time())
            limited = plan.recovery.timeout_ms or plan.recovery.stall_timeout_ms  # stacks find instances by their id
            added |= {names.TORCHELASTIC_RUN_ID: run_id} | ({RUN_ID: run_id} if record is not None or limited else {})
            errors = ErrorFiles(plan, record.path if record is not None else None)
            try:
                result = _Attempts(backend, plan, environ, relay=relay, control=control, clock=clock, record=record,
                                   cache=TemporaryCache(path=cache, remove_at_exit=plan.cache.remove_at_exit)
                                   if cache is not None else None, added=added, run_id=run_id,
                                   first_port=first_port, errors=errors).run()
            finally:
                errors.close()
                relay.event(Teardown())
    except DiagnosticError as exc:  # the partition could not be had (nothing started), or the backend failed running
        result = ApplyResult(statuses=(), error=ApplyError(status=CANNOT_LAUNCH, diagnostics=exc.diagnostics))
    except Stopped as exc:  # before anything started
        result = ApplyResult(statuses=(), error=_stopped(exc))
    except BaseException as exc:  # a bug, a sink that raised, an interrupt outside a launch: the record still ends
        if record is not None:
            why = f"poprun ended by {type(exc).__name__}: {exc}"
            with contextlib.suppress(Exception):  # the sink may be what raised: the report is written first anyway
                _finish(ApplyResult(statuses=(), error=ApplyError(status=CANNOT_LAUNCH, message=why)), relay, record,
                        clock)
            record.close()
        raise
    control._finished = True  # noqa: SLF001
    return _finish(evolve(result, signals=tuple(control.signals), warnings=tuple(released) + result.warnings,
                          notes=result.notes + tuple(relay.notes)), relay,
                   record, clock)


def _stopped(exc: Stopped) -> ApplyError:
    """Return how a run stopped before anything started ended: 128+N."""
    return ApplyError(status=128 + exc.signum, signal=exc.signum, message=f"stopped by {signal_name(exc.signum)}")


class _Attempts:
    """
    The attempts of one run: each launched with its own restart count and MASTER_PORT, until one needs no restart.

    With ``--restart-scope instance`` there is one launch, whose backend restarts each failed
    instance alone (:class:`_InstanceRestarts`); the time limits (:class:`LimitWatch`) span them all.
    """

    def __init__(self, backend: Backend, plan: LaunchPlan, environ: Mapping[str, str], *, relay: _Relay,
                 control: Control, clock: _Clock, record: RunRecord | None, cache: TemporaryCache | None,
                 added: dict[str, str], run_id: str, first_port: tuple[int, bool, bool, Diagnostic | None],
                 errors: ErrorFiles) -> None:
        self.backend, self.plan, self.environ = backend, plan, environ
        self.errors = errors
        self.relay, self.control, self.clock, self.record, self.cache = relay, control, clock, record, cache
        self.added, self.run_id = added, run_id
        self.recovery = plan.recovery
        self.budget = RestartBudget(plan.recovery)
        self.attempts: list[Attempt] = []
        self.warnings: list[Diagnostic] = []
        self.ports: list[int] = []
        self.launch: Launch | None = None
        self.limit = ""
        self.limit_text = ""
        self.stacks: dict[int, str] = {}
        self._limit_lock = threading.Lock()
        self.watch: LimitWatch | None = None
        self._first_port: tuple[int, bool, bool, Diagnostic | None] | None = first_port
        self._next_port: tuple[int, bool] | None = None  # the next attempt's, chosen as its restart was to begin
        self.waiting = False  # between attempts: the back-off and the pre-restart command
        self.limit_waiting = False  # the limit came then: no instance ran, none was stopped by it
        self.signalled = 0  # --signal's signal, once sent: no restart after it (the time limit is near)
        self.port_checked = True  # the last chosen MASTER_PORT was read free on its host (not the default)

    def run(self) -> ApplyResult:
        r = self.recovery
        if r.timeout_ms or r.stall_timeout_ms:
            self.watch = LimitWatch(r, on_limit=self._limit_reached, on_signal=self._signal)
            self.relay.watch = self.watch
        try:
            return self._run()
        finally:
            self.control._between = False  # noqa: SLF001 - the attempts are over
            self.relay.restarted = None
            if self.watch is not None:
                self.watch.close()

    def _run(self) -> ApplyResult:
        number = 0
        instance_scope = self.recovery.scope == "instance" and self.budget.enabled
        if instance_scope and RESTARTS_INSTANCES not in capabilities(self.backend):
            raise DiagnosticError((error(
                "PR450", "this backend cannot restart one instance",
                detail=f"--restart-scope instance: the {self.plan.backend.name} backend starts its instances together "
                       "and cannot start one of them again alone",
                span=SourceSpan.derived("restart_scope"),
                hint="use --restart-scope all (every instance starts again), or the local, offline or ssh backend"),))
        while True:
            port, chosen = self._next_port or self._master_port()
            self._next_port = None
            variables = self.added | {names.RESTART_COUNT: str(number), names.TORCHELASTIC_RESTART_COUNT: str(number)}
            if chosen:
                variables[names.TORCH_MASTER_PORT] = str(port)
            applied = self.plan.with_variables(variables).with_instance_variables(self.errors.files(number))
            self.relay.plan = applied  # what the instances are compared with
            if self.record is not None:
                if number == 0:
                    self.record.write_plan(applied)
                if self.budget.enabled:
                    self.record.begin_attempt(number)
            self.relay.next_attempt()
            if self.budget.enabled or chosen:
                self.relay.event(AttemptStarted(attempt=number, master_port=port, chosen=chosen and self.port_checked))
            if self.watch is not None:
                self.watch.attempt()
            restarts = _InstanceRestarts(self, number) if instance_scope else None
            self.relay.restarted = restarts.started if restarts is not None else None
            began = time.monotonic()
            self.control._between = False  # noqa: SLF001 - a stop now unwinds the launch's start again
            result = self._launch(applied, variables, restarts)
            result = self.errors.read(result)
            if restarts is not None:
                return self._instances_ended(result, restarts, port, began)
            # a stop or a time limit is the attempt's status (128+N, 124), never the 0 of instances all stopped
            status = exit_status(evolve(result, signals=tuple(self.control.signals), limit=self.limit))
            delay, why = self.budget.decide(status, time.monotonic() - began, stopped=self._stopped(result))
            self.attempts.append(Attempt(number=number, status=status, root_cause=result.root_cause,
                                         seconds=round(time.monotonic() - began, 3), master_port=port,
                                         next="" if delay is None and status == 0 else why, cause=_cause(result)))
            if delay is not None:
                stopped = self._between(delay, number + 1)
                if stopped is None:  # the restart begins: told and counted now, never before
                    self.budget.begun()
                    self._ended(self.attempts[-1], why, delay=delay)
                    number += 1
                    continue
                self.budget.cancelled()
                why = f"not restarted: {stopped}"
                self.attempts[-1] = evolve(self.attempts[-1], next=why)
                if self.control.signals and not self.limit:  # stopped while waiting to restart: as before a launch
                    sig = self.control.signals[-1]
                    result = evolve(result, error=ApplyError(
                        status=128 + sig, signal=sig, message=f"stopped by {signal_name(sig)} before restart {number + 1}"))
            if self.budget.enabled:
                self._ended(self.attempts[-1], why)
            return self._result(result)

    def _launch(self, applied: LaunchPlan, variables: Mapping[str, str],
                restarts: _InstanceRestarts | None) -> ApplyResult:
        """Launch an attempt of ``applied`` (``variables`` added) and wait; return how it ended."""
        try:
            return _launch(self.backend, applied, self.environ, relay=self.relay, control=self.control,
                           clock=self.clock, cache=self.cache, restarter=restarts, attempts=self,
                           started=LaunchStarting(backend=self.plan.backend.name, instances=len(self.plan.instances),
                                                  variables=tuple(sorted(variables.items())),
                                                  cache=self.cache.path if self.cache is not None else None))
        except Stopped as exc:  # as a restart's launch started (nothing of it is left): the attempts so far stay
            if not self.attempts:
                raise
            return ApplyResult(statuses=(), error=ApplyError(status=128 + exc.signum, signal=exc.signum,
                                                             message=f"stopped by {signal_name(exc.signum)}"))

    def _ended(self, attempt: Attempt, why: str, *, delay: float | None = None) -> None:
        """Tell that ``attempt`` ended and ``why``; ``delay``: it was restarted, after that wait (call as the restart begins)."""
        reason = f"{attempt.cause}; {why}" if attempt.cause else why
        self.relay.event(AttemptEnded(attempt=attempt.number, status=attempt.status, root_cause=attempt.root_cause,
                                      restart=delay is not None, delay_ms=int((delay or 0) * 1000), reason=reason))

    def _instances_ended(self, result: ApplyResult, restarts: _InstanceRestarts, port: int,
                         began: float) -> ApplyResult:
        """
        Return ``result`` of a launch that restarted instances alone, with its attempts: each restart made, each not.

        A restart granted that never started (a stop, its pre-restart command failed, it could not
        start again, another instance's failure ended the run first) is given back, and its attempt
        says why; when the run ended with that very failure, it is the last attempt.
        """
        stopped = self._stopped(result)
        root = result.failure(result.root_cause)
        cause = _cause(result)
        cancelled, own = [], None
        for index, position in sorted(restarts.pending.items(), key=lambda item: item[1]):
            mine = root is not None and root.pid == restarts.held.get(index)
            why = restarts.failed.get(index) or (
                f"not restarted: {stopped}" if stopped else "not restarted: it could not start again" if mine
                else f"not restarted: the run ended first ({cause})" if cause else "not restarted: the run ended first")
            self.budget.cancelled()
            restarts.attempts[position] = evolve(restarts.attempts[position], next=why)
            cancelled.append(position)
            own = position if mine else own
        first = len(self.attempts)
        self.attempts.extend(restarts.attempts)
        for position in cancelled:
            self._ended(self.attempts[first + position], self.attempts[first + position].next)
        if cancelled and self.control.signals and not self.limit:  # stopped while one waited: as before a launch
            sig = self.control.signals[-1]
            restart = min(self.attempts[first + k].number + 1 for k in cancelled)
            return self._result(evolve(result, error=ApplyError(
                status=128 + sig, signal=sig, message=f"stopped by {signal_name(sig)} before restart {restart}")))
        if own is not None:  # the run ended with the failure whose restart was given up: that is its last attempt
            return self._result(result, gave_up=self.attempts[first + own].next)
        status = exit_status(evolve(result, signals=tuple(self.control.signals), limit=self.limit))
        refused = restarts.refused.get(root.pid) if root is not None and root.pid is not None else None
        why = "succeeded" if status == 0 else refused or (
            f"not restarted: {stopped}" if stopped else
            "not restarted: its host stopped answering" if root is not None and root.lost else "not restarted")
        self.attempts.append(Attempt(number=len(self.attempts), status=status, root_cause=result.root_cause,
                                     seconds=round(time.monotonic() - began, 3), master_port=port,
                                     next="" if status == 0 else why, cause=cause))
        self._ended(self.attempts[-1], why)
        return self._result(result)

    def _result(self, result: ApplyResult, *, gave_up: str | None = None) -> ApplyResult:
        """Return the last attempt's result with what the attempts, limits and stacks add (``gave_up``: why it ended)."""
        if gave_up is None:
            gave_up = ""
            if self.budget.enabled and self.attempts and self.attempts[-1].status != 0:
                gave_up = self.attempts[-1].next
        stacks = self._stacks_with_faulthandler()
        if self.limit and not self.limit_waiting:  # poprun stopped every instance (faulthandler's SIGABRT
            # included): none is the root cause. A limit reached while waiting to restart stopped none of them:
            # the failure that came before it stays the root cause (which tells the report so)
            result = evolve(result, root_cause=None, failures=tuple(evolve(f, stopped=True) for f in result.failures))
        return evolve(result, attempts=tuple(self.attempts) if self.budget.enabled else (), limit=self.limit,
                      limit_text=self.limit_text, stacks=tuple(sorted(stacks.items())), gave_up=gave_up,
                      warnings=result.warnings + tuple(self.warnings))

    def _stopped(self, result: ApplyResult) -> str:
        """Return what stopped the run ("" if nothing did: an instance failed on its own)."""
        if self.limit:
            return self.limit_text
        if self.control.signals:
            return f"poprun was stopped ({signal_name(self.control.signals[-1])})"
        if result.error is not None:
            return "poprun could not launch it"
        if self.signalled:
            return (f"{signal_name(self.signalled)} was sent {seconds(self.recovery.signal_before_ms)} before the "
                    "time limit (--signal)")
        return ""

    def _between(self, delay: float, number: int) -> str | None:
        """Wait ``delay`` seconds, run the pre-restart command, choose the next MASTER_PORT; return why the run stops instead, or None."""
        woken = self.control._woken  # noqa: SLF001
        if self.watch is not None:
            self.watch.pause()
        with self._limit_lock:
            self.waiting = True
        try:
            if woken.wait(delay) or self.control.signals or self.limit or self.signalled:
                return self._stopped(ApplyResult(statuses=())) or "stopped"
            if self.recovery.pre_restart:
                failed = run_pre_restart(self.recovery.pre_restart, self.environ,
                                         {RUN_ID: self.run_id, names.RESTART_COUNT: str(number)}, cancelled=woken)
                if failed is not None:
                    return self._stopped(ApplyResult(statuses=())) or failed
        except Stopped as exc:  # a signal in the main thread while waiting
            return f"poprun was stopped ({signal_name(exc.signum)})"
        finally:
            with self._limit_lock:
                self.waiting = False
        try:
            self._next_port = self._master_port()  # a stop meanwhile ends the run here, before the restart is told
        except DiagnosticError as exc:  # the user's MASTER_PORT is taken now (PR440): the restart cannot begin
            self.warnings.extend(exc.diagnostics)
            return self._stopped(ApplyResult(statuses=())) or "; ".join(
                f"{d.summary} ({d.code})" for d in exc.diagnostics)
        if self.control.signals or self.limit or self.signalled:
            return self._stopped(ApplyResult(statuses=())) or "stopped"
        return None

    def _master_port(self) -> tuple[int, bool]:
        """Return the MASTER_PORT of the next attempt and whether it was chosen here (attempt 0's: chosen before)."""
        decided, self._first_port = self._first_port, None
        port, chosen, checked, problem = decided or _master_port(self.backend, self.plan, self.environ,
                                                                 avoid=tuple(self.ports))
        if chosen:
            self.ports.append(port)
            self.port_checked = checked  # False: the default, unchecked (the host's ports could not be read)
        if problem is not None and not self.attempts:
            self.warnings.append(problem)
        return port, chosen

    def _signal(self, sig: int) -> None:
        """``--signal``'s moment: send ``sig`` to every instance, where the backend can."""
        self.signalled = sig
        self.relay.event(LimitReached(limit="signal", after_ms=self.recovery.timeout_ms - self.recovery.signal_before_ms,
                                      signal=sig))
        self.control.forward(sig)
        self.control._woken.set()  # noqa: SLF001 - a wait to restart ends: an attempt now would only meet the limit

    def _limit_reached(self, kind: str, after_ms: int) -> None:
        """End the run at a time limit: tell it, collect where each instance was, then stop every instance."""
        with self._limit_lock:
            self.limit = kind
            self.limit_waiting = self.waiting
            # the limit as declared (the event has the time measured, a few ms past it)
            self.limit_text = (f"the run timed out after {seconds(self.recovery.timeout_ms)} (--timeout)"
                               if kind == "timeout" else
                               f"no instance wrote output for {seconds(self.recovery.stall_timeout_ms)} (--stall-timeout)")
            if self.waiting:
                self.limit_text += ", while waiting to restart"
        self.relay.event(LimitReached(limit=kind, after_ms=after_ms))
        self.relay.stopping(self.limit_text)
        self.relay.captured = {}
        launch = self.launch
        if launch is not None:
            # No teardown (the backend's at a failure, this step's) until the stacks are read and each process
            # sent SIGABRT for faulthandler has had time to write its dump: a SIGTERM that arrives before such
            # a process runs its handler ends it first (the kernel delivers the pending SIGABRT, then the fatal
            # SIGTERM before the handler's first instruction), and its stack is lost.
            self.relay.hold_until = time.monotonic() + _STACKS_TIMEOUT_S + 5
            try:
                self._collect_stacks()
            finally:
                from poprun.apply.stacks import FAULTHANDLER

                dumped = any(FAULTHANDLER in text for text in self.stacks.values())
                self.relay.hold_until = time.monotonic() + (_DUMP_WAIT_S if dumped else 0)
            self.relay.hold()
            launch.terminate(self.control.grace_s)
        self.control._woken.set()  # noqa: SLF001 - a wait between attempts ends

    def _collect_stacks(self) -> None:
        """Read where each instance is (:mod:`poprun.apply.stacks`), bounded in time; nothing when it fails."""
        from poprun.apply.stacks import FAULTHANDLER, collect_stacks

        try:

            hosts = {i.index: i.host for i in self.plan.instances}
            self.stacks = dict(collect_stacks(self.backend, hosts, self.run_id, environ=self.environ,
                                              timeout_s=_STACKS_TIMEOUT_S, skip_pid=os.getpid()))
        except Exception as exc:  # noqa: BLE001 - a report without stacks, never a run that does not stop
            self.stacks = {-1: f"the stacks could not be read: {exc}"}
        if self.stacks:
            texts = [text for i, text in self.stacks.items() if i >= 0]
            ways = (("py-spy", "Python v"), ("faulthandler", FAULTHANDLER))  # py-spy's dump names the interpreter
            how = ",".join(name for name, mark in ways if any(mark in text for text in texts))
            self.relay.event(StacksCollected(instances=tuple(i for i in sorted(self.stacks) if i >= 0), how=how))

    def _stacks_with_faulthandler(self) -> dict[int, str]:
        """Return the stacks, those that faulthandler wrote to an instance's stderr taken from there."""
        stacks = dict(self.stacks)
        if not stacks:
            return stacks
        from poprun.apply.stacks import FAULTHANDLER

        captured = self.relay.captured or {}
        for index, text in stacks.items():
            if FAULTHANDLER in text and index in captured:
                dump = _faulthandler_dump(bytes(captured[index]).decode(errors="replace"))
                if dump:
                    stacks[index] = dump
        return stacks


_STACKS_TIMEOUT_S = 10.0
_DUMP_WAIT_S = 1.0  # the time faulthandler's dumps are given before the teardown


def _master_port(backend: Backend, plan: LaunchPlan, environ: Mapping[str, str],
                 *, avoid: tuple[int, ...]) -> tuple[int, bool, bool, Diagnostic | None]:
    """
    Return an attempt's MASTER_PORT, whether it was chosen here, whether it was read free, and a warning about it.

    Chosen free on instance 0's host when the plan leaves it to the apply step, never one of
    ``avoid`` (the earlier attempts'); else the user's, checked: PR440 (raised) when it is taken.
    """
    if not plan.instances:
        return 0, False, False, None
    first = plan.instances[0]
    from poprun.apply import ports

    if plan.recovery.choose_port:
        _prepare(backend, plan, environ)
        choice = ports.choose_port(backend, first.host, environ=environ, avoid=avoid)
        return choice.port, True, choice.chosen, None
    given = first.env.get(names.TORCH_MASTER_PORT)
    if given is None and names.TORCH_MASTER_PORT in first.env.forward:
        given = environ.get(names.TORCH_MASTER_PORT)
    if not given or not given.strip().isdigit() or not 0 < int(given) < 65536:  # noqa: PLR2004
        return 0, False, False, None
    _prepare(backend, plan, environ)
    problem = ports.check_port(backend, first.host, int(given), environ=environ)
    if problem is not None and problem.is_error:
        raise DiagnosticError((problem,))
    return int(given), False, problem is None, problem


def _prepare(backend: Backend, plan: LaunchPlan, environ: Mapping[str, str]) -> None:
    """
    Let a backend that can (:class:`~poprun.backends.base.Prepares`) get ready to launch ``plan`` before instance 0's host is read.

    The ssh backend opens every host's connection then, so that the port plan's is one of them,
    not one opened alone before the others.
    """
    prepare = getattr(backend, "prepare", None)
    if callable(prepare) and not is_this_machine(plan.instances[0].host):
        prepare(plan, environ=environ)


def _faulthandler_dump(text: str) -> str:
    """Return faulthandler's dump (``Fatal Python error`` ... the last ``File`` line) within ``text``, or ""."""
    start = text.find("Fatal Python error")
    if start < 0:
        return ""
    lines = text[start:].splitlines()
    keep = [line for line in lines if line.startswith(("Fatal Python", "Thread 0x", "Current thread 0x", "  File",
                                                       "Extension modules", "<no Python frame>")) or not line]
    return "\n".join(keep).strip()


def _cause(result: ApplyResult) -> str:
    """Return the root cause of ``result`` in one line ("" when none)."""
    if result.error is not None:
        return result.error.message or "; ".join(d.summary for d in result.error.diagnostics)
    failure = result.failure(result.root_cause)
    if failure is None:
        return ""
    return _ended(failure.index, failure.host, failure.signal, failure.exit_code)


def _ended(index: int, host: str, sig: int | None, exit_code: int | None) -> str:
    """Return how instance ``index`` ended, in one line: ``instance 1 exited with 3 on h1``."""
    how = f"was killed by {signal_name(sig)}" if sig is not None else f"exited with {exit_code}"
    return f"instance {index} {how} on {host}"


class _InstanceRestarts:
    """
    The apply step's :class:`~poprun.backends.base.Restarter` for ``--restart-scope instance``: the run's one budget.

    A restart granted (:meth:`restart_after`) is *pending* until the backend tells that the
    instance started again (:meth:`started`, through the relay): only then is it counted as made
    and told (``attempt-ended`` with ``restart``, the line on stderr). The apply step gives back
    those still pending when the launch has ended (:meth:`_Attempts._instances_ended`).
    """

    def __init__(self, attempts: _Attempts, first: int) -> None:
        self._attempts, self._next = attempts, first
        self.attempts: list[Attempt] = []
        self.pending: dict[int, int] = {}  # instance -> its position in attempts: granted, not started yet
        self.held: dict[int, int] = {}  # instance -> the pid of its run that failed, while pending
        self.refused: dict[int, str] = {}  # the pid of a failed run not restarted -> why
        self.failed: dict[int, str] = {}  # instance -> why its restart was given up (its pre-restart command)
        self._delays: dict[int, float] = {}  # position in attempts -> the wait before that restart
        self._counts: dict[int, int] = {}
        self._lock = threading.Lock()

    def restart_after(self, ended: InstanceEnded, uptime_s: float) -> float | None:
        a = self._attempts
        stopped = a._stopped(ApplyResult(statuses=()))  # noqa: SLF001
        delay, why = a.budget.decide(ended.status, uptime_s, stopped=stopped)
        if delay is None:  # the run's last attempt is the launch's own result
            with self._lock:
                self.refused[ended.pid] = why
            return None
        host = a.plan.instances[ended.index].host if 0 <= ended.index < len(a.plan.instances) else "?"
        with self._lock:
            attempt = Attempt(number=self._next + len(self.attempts), status=ended.status, root_cause=ended.index,
                              seconds=round(uptime_s, 3), master_port=a.ports[-1] if a.ports else 0, next=why,
                              cause=_ended(ended.index, host, ended.signal, ended.exit_code))
            self.attempts.append(attempt)
            self._counts[ended.index] = self._counts.get(ended.index, 0) + 1
            self.pending[ended.index] = len(self.attempts) - 1
            self.held[ended.index] = ended.pid
            self._delays[len(self.attempts) - 1] = delay
        return delay

    def started(self, index: int) -> None:
        """Instance ``index`` started again: its restart is made; tell it (the backend's thread, before its start)."""
        with self._lock:
            position = self.pending.pop(index, None)
            self.held.pop(index, None)
        if position is None:
            return
        a = self._attempts
        a.budget.begun()
        a._ended(self.attempts[position], self.attempts[position].next, delay=self._delays[position])  # noqa: SLF001

    def prepare(self, index: int) -> Mapping[str, str] | None:
        a = self._attempts
        count = self._counts.get(index, 0)
        if a.control.signals or a.limit or a.signalled:  # --signal sent: a restart now would only meet the limit
            return None
        if a.recovery.pre_restart:
            failed = run_pre_restart(a.recovery.pre_restart, a.environ,
                                     {RUN_ID: a.run_id, names.RESTART_COUNT: str(count)},
                                     cancelled=a.control._woken)  # noqa: SLF001
            if failed is not None:
                if not a.relay.is_stopping:  # else the launch's end killed the command: the run ended first
                    with self._lock:
                        self.failed[index] = f"not restarted: {failed}"
                return None
        return ({names.RESTART_COUNT: str(count), names.TORCHELASTIC_RESTART_COUNT: str(count)}
                | a.errors.files(count, [index]).get(index, {}))


class _Clock:
    """The phases of a run, timed into its record: each :meth:`lap` ends one."""

    def __init__(self, record: RunRecord | None) -> None:
        self._phases = record.phases if record is not None else {}
        self._last = time.monotonic()

    def lap(self, phase: str) -> None:
        now = time.monotonic()
        self._phases[phase] = round(self._phases.get(phase, 0.0) + now - self._last, 6)  # attempts add up
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
            clock: _Clock, cache: TemporaryCache | None, started: LaunchStarting,
            restarter: _InstanceRestarts | None = None, attempts: _Attempts | None = None) -> ApplyResult:
    """Launch and wait; return the result (``error`` when nothing could start)."""
    relay.event(started)
    extra = {"restarter": restarter} if restarter is not None else {}
    try:
        launch = backend.launch(plan, env_source=environ, sink=relay, cache=cache, **extra)
    except LaunchError as exc:
        clock.lap("start")
        return ApplyResult(statuses=(), error=ApplyError(status=exc.status, message=exc.message,
                                                         diagnostics=exc.diagnostics))
    try:  # whatever raises now (the sink, an interrupt) stops the launch first
        if relay.failed is not None:
            raise relay.failed  # noqa: TRY301 - stopped by the except below
        control._started(launch)  # noqa: SLF001
        if attempts is not None:
            attempts.launch = launch
            if attempts.limit:  # reached while it started
                launch.terminate(control.grace_s)
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
        if attempts is not None and attempts.budget.enabled:  # until the next launch a stop ends the wait before
            control._between = True  # noqa: SLF001 - a restart (or the restart's start), it raises nothing
        control._launch = None  # noqa: SLF001
        if attempts is not None:
            attempts.launch = None
    if relay.failed is not None:
        raise relay.failed
    relay.event(LaunchEnded(statuses=result.statuses, root_cause=result.root_cause))
    return result



class _Package(type(sys)):  # type: ignore[misc]  # types.ModuleType, without importing types
    """The package as ``from poprun import apply`` gives it: calling it is :func:`apply` (the ``poprun`` facade)."""

    def __call__(self, plan: LaunchPlan, *, sink: EventSink, registry: BackendRegistry | None = None,
                 env_source: Mapping[str, str] | None = None, control: Control | None = None,
                 record: RunRecord | None = None) -> ApplyResult:
        return apply(plan, sink=sink, registry=registry, env_source=env_source, control=control, record=record)


sys.modules[__name__].__class__ = _Package
