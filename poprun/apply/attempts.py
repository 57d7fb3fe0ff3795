"""
The attempts of one run: each launched and waited for, restarted as the plan's recovery allows; the run's state.

Layer: ``poprun.apply``; imports :mod:`poprun.apply.control`, :mod:`~poprun.apply.limits`,
:mod:`~poprun.apply.relay`, :mod:`~poprun.apply.recovery`, :mod:`~poprun.apply.restarts`,
:mod:`~poprun.apply.errorfile`, :mod:`~poprun.apply.ports` (lazily: the MASTER_PORT of each attempt) and
:mod:`~poprun.apply.members` (lazily: with a membership policy), :mod:`~poprun.apply.channel` (types),
:mod:`~poprun.apply.watch` (lazily: a run that listens for progress), ``poprun.backends.base``, ``poprun.planner.plan``,
``poprun.planner.setting`` (lazily), ``poprun.runs.record`` and ``poprun.core``; never :func:`poprun.apply.apply`,
which makes the attempts object and runs it.

The run's state is one value, :class:`RunState`, held by :class:`Run` for the attempts object
(which makes its transitions; the relay tells when an instance started); :class:`Control`
asks it what a stop does. Every attempt has its own restart count and MASTER_PORT; with
``--restart-scope instance`` there is one launch, whose backend restarts each failed instance
alone (:class:`~poprun.apply.restarts.InstanceRestarts`); the time limits
(:class:`~poprun.apply.limits.Limits`) span them all. With a membership policy, each attempt
runs on the hosts of its own plan (:class:`~poprun.apply.members.Members`): one that lost hosts,
or whose hosts failed their preflight or health check, is followed by a re-planned one.

Length: the run's state and the one loop of its attempts, whose steps (launch, end, restart or
not, re-plan, the verdicts of the time limits and of the instance watch) share the attempts'
budget, ports and plan; the parts that need no such state live beside it (restarts, limits,
members, watch).
"""

from __future__ import annotations

import contextlib
import enum
import signal
import threading
import time
from collections.abc import Callable, Mapping

from popdist import env as names
from poprun.apply.control import Control, Stopped
from poprun.apply.errorfile import ErrorFiles
from poprun.apply.limits import Gate, Limits, end_instance, read_stacks
from poprun.apply.recovery import RestartBudget, run_pre_restart, seconds
from poprun.apply.relay import Clock, Relay
from poprun.apply.restarts import InstanceRestarts, cause
from poprun.backends.base import (
    RESTARTS_INSTANCES,
    Backend,
    Launch,
    LaunchError,
    TemporaryCache,
    accepts_keyword,
    capabilities,
)
from poprun.core.diagnostic import Diagnostic, DiagnosticError, HostLostError, error
from poprun.core.events import AttemptEnded, AttemptStarted, LaunchEnded, LaunchRunning, LaunchStarting
from poprun.core.exitstatus import CANNOT_LAUNCH, TIMED_OUT
from poprun.core.outcome import ApplyError, ApplyResult, Attempt, exit_status, signal_name
from poprun.core.record import evolve
from poprun.core.span import SourceSpan
from poprun.planner.plan import LaunchPlan
from poprun.runs.record import RUN_ID, RunRecord

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from typing import Any

    from poprun.apply.channel import Channel
    from poprun.apply.members import Members
    from poprun.apply.progress import Board
    from poprun.apply.watch import Verdict, Watch

__all__ = ["Attempts", "Run", "RunState"]


class RunState(enum.Enum):
    """
    Where a run is, as one value (torch elastic's ``WorkerState``); :class:`Run` holds it for the attempts object.

    ========  ===========================================================  ==========================================
    state     the run                                                      a stop (:class:`Control`)
    ========  ===========================================================  ==========================================
    STARTING  runs nothing of the attempt yet (the partition step, the     raises :class:`Stopped` in the main
              port plan, the backend's start before any instance)          thread; elsewhere, waits for the launch
    STARTED   has an instance started; the launch has not returned yet     waits for the launch, then stops it
    RUNNING   has its attempt's launch                                     stops it: SIGTERM, SIGKILL after the grace
    WAITING   ended a launch and may restart (back-off, pre-restart        ends the wait; nothing starts again
              command, the next MASTER_PORT)
    ENDED     is past its attempts (the partition released, the report)    is noted, nothing more
    FINISHED  is over: :func:`~poprun.apply.apply` has returned            is noted, changes nothing
    ========  ===========================================================  ==========================================

    Transitions, and who makes them::

        STARTING ──an instance started (the relay, the backend's thread)──> STARTED
        STARTING | STARTED ──the launch returned (the attempts)──> RUNNING
        STARTING | STARTED ──the launch failed (LaunchError)──> unchanged
        RUNNING ──the launch ended, restarts allowed (the attempts)──> WAITING
        RUNNING ──the launch ended, no restart (the attempts)──> ENDED
        WAITING ──the next launch begins (launch-starting)──> STARTING
        WAITING ──the attempts are over (the attempts)──> ENDED
        any ──apply() returns──> FINISHED

    The rest of the run's state is each part's own, read through methods: the attempts and
    their ports (:class:`Attempts`), the limits and stacks (:class:`~poprun.apply.limits.Limits`),
    the restarts granted to single instances (:class:`~poprun.apply.restarts.InstanceRestarts`), the stops received
    (:class:`Control`), what passed to the sink (:class:`~poprun.apply.relay.Relay`).
    """

    STARTING = "starting"
    STARTED = "started"
    RUNNING = "running"
    WAITING = "waiting"
    ENDED = "ended"
    FINISHED = "finished"


class Run:
    """The run's :class:`RunState`, its launch while it exists and its teardown gate: what a stop reaches."""

    def __init__(self, control: Control, *, tell: Callable[[str], None], gate: Gate) -> None:
        """Begin STARTING; ``tell`` says that every instance is being stopped, and why (the relay's)."""
        self.state = RunState.STARTING
        self.launch: Launch | None = None
        self.gate = gate
        self._control, self._tell = control, tell

    # -- what a stop does (Control) ------------------------------------------------------
    def stop(self, signum: int, why: str, grace_s: float) -> None:
        """Stop the run because of ``signum`` (see :class:`RunState`'s table)."""
        self.gate.release()  # a stop is not held off by the reading of stacks
        if self.state is RunState.FINISHED:
            return
        if self.launch is None:
            if threading.current_thread() is threading.main_thread() and self.state is RunState.STARTING:
                raise Stopped(signum)
            return  # the launch is stopped once it exists (between attempts: the wait ends, nothing starts)
        self._tell(why)
        self.launch.terminate(grace_s)

    def output_closed(self, why: str, grace_s: float) -> None:
        """Stop the run because an output stream has no reader any more (never raises)."""
        if self.state is RunState.FINISHED:
            return
        self._tell(why)
        if self.launch is not None:
            self.launch.terminate(grace_s)

    # -- transitions -----------------------------------------------------------------------
    def launching(self) -> None:
        """Begin an attempt's launch: STARTING."""
        self.state = RunState.STARTING

    def instance_started(self) -> None:
        """Note that an instance started: STARTING becomes STARTED."""
        if self.state is RunState.STARTING:
            self.state = RunState.STARTED

    def running(self, launch: Launch) -> None:
        """Hold ``launch``: RUNNING; stop it at once if a stop came while it was starting."""
        self.launch = launch
        self.state = RunState.RUNNING
        signals = self._control.signals
        if signals:
            if signals[-1] != signal.SIGPIPE:
                self._tell(f"received {signal_name(signals[-1])}")
            launch.terminate(self._control.grace())

    def launch_ended(self, *, restarts: bool) -> None:
        """Let the launch go, ended: WAITING when the run may restart (``restarts``), else ENDED."""
        self.state = RunState.WAITING if restarts else RunState.ENDED
        self.launch = None

    def attempts_over(self) -> None:
        """No attempt follows: WAITING becomes ENDED."""
        if self.state is RunState.WAITING:
            self.state = RunState.ENDED

    def finish(self) -> None:
        """apply() returns: FINISHED."""
        self.state = RunState.FINISHED


class Attempts:
    """
    The attempts of one run: each launched with its own restart count and MASTER_PORT, until one needs no restart.

    With ``--restart-scope instance`` there is one launch, whose backend restarts each failed
    instance alone (:class:`~poprun.apply.restarts.InstanceRestarts`); the time limits (:class:`Limits`) span them all.
    """

    def __init__(self, backend: Backend, plan: LaunchPlan, environ: Mapping[str, str], *, relay: Relay,
                 control: Control, run: Run, clock: Clock, record: RunRecord | None, cache: TemporaryCache | None,
                 added: dict[str, str], run_id: str, first_port: tuple[int, bool, bool, Diagnostic | None],
                 errors: ErrorFiles, channel: Channel | None = None) -> None:
        self.backend, self.plan, self.environ = backend, plan, environ
        self.errors, self.channel = errors, channel
        self.relay, self.control, self.run_state, self.clock, self.record, self.cache = \
            relay, control, run, clock, record, cache
        self.added, self.run_id = added, run_id
        self.recovery = plan.recovery
        self.budget = RestartBudget(plan.recovery)
        self.attempts: list[Attempt] = []
        self.warnings: list[Diagnostic] = []
        self.ports: list[int] = []
        self.limits = Limits(plan, emit=relay.event, stopping=relay.stopping, gate=run.gate,
                             launch=lambda: run.launch, grace_s=control.grace_s, forward=control.forward,
                             woken=control.woken)
        self._first_port: tuple[int, bool, bool, Diagnostic | None] | None = first_port
        self._next_port: tuple[int, bool] | None = None  # the next attempt's, chosen as its restart was to begin
        self.port_checked = True  # the last chosen MASTER_PORT was read free on its host (not the default)
        self.members = _members(self)  # the hosts of each attempt, with a membership policy (else None)
        self._begun: set[int] = set()  # attempts whose record and events have begun (a re-plan may launch one again)
        self._launch_failure: LaunchError | None = None  # why the last launch could not start
        self._no_plan: tuple[Diagnostic, ...] = ()  # why a re-plan found no plan: the run ends with them
        self._hosts_lost: dict[str, str] = {}  # the hosts the last launch lost, when it could not tell its instances'
        self.board: Board | None = channel.board if channel is not None else None  # when the run listens for progress
        self.health: Watch | None = None  # its heartbeat limit and straggler rule (poprun.apply.watch), with a board
        self._as_planned: LaunchPlan | None = None  # the plan before the hosts' interfaces were read (poprun.apply.network)

    def run(self) -> ApplyResult:
        """Launch attempts until one needs no restart; return the last one's result with what the attempts add."""
        self.limits.start(lambda only=None: read_stacks(self.backend, self.plan, self.run_id, self.environ, only),
                          lambda index, count: end_instance(self.backend, self.plan, self.run_id, self.environ,
                                                            index=index, count=count))
        self.relay.limits = self.limits
        if self.board is not None:  # the run listens for progress: its heartbeats and stragglers are watched
            from poprun.apply.watch import watch_of

            alone = self.recovery.scope == "instance" and self.budget.enabled  # an instance ends alone, restarts alone
            self.health = self.relay.health = watch_of(
                self.board, self.plan, emit=self.relay.event, alone=alone,
                end=lambda verdict: self.limits.instance_limit(verdict, alone=alone))
        try:
            return self._run()
        finally:
            self.run_state.attempts_over()
            self.relay.restarted = None
            self.limits.close()
            if self.health is not None:
                self.health.close()

    def _run(self) -> ApplyResult:
        number = 0
        instance_scope = self._instance_scope()
        if self.members is not None and self.members.checks:
            self._admit(0)  # the health check before anything starts: unhealthy hosts are left out now
        while True:
            if self.plan.network.pending:  # the interfaces the plan left to the launch (again after a re-plan)
                self._settle_network()
            port, chosen = self._next_port or self._master_port()
            self._next_port = None
            applied, variables = self._begin(number, port, chosen)
            restarts = InstanceRestarts(self, number) if instance_scope else None
            self.relay.restarted = restarts.started if restarts is not None else None
            began = time.monotonic()
            result = self._launch(applied, variables, restarts)
            if self._left_out_at_preflight(number):
                continue  # nothing of it started: the same attempt, on the re-planned hosts
            result = self.errors.read(result)
            if restarts is not None:
                return self._instances_ended(result, restarts, port, began)
            result, again = self._attempt_ended(result, number, port, began)
            if not again:
                return result
            number += 1

    def _settle_network(self) -> None:
        """
        Read on each host the interface collectives use (poprun.apply.network): the plan gets the values.

        Raises:
            DiagnosticError: PR318, PR474-PR478: nothing starts.
        """
        from poprun.apply.network import settle_network

        self._as_planned = self.plan  # attempts/K/plan.json: the plan as the planner made it
        self.plan, found = settle_network(self.backend, self.plan, environ=self.environ, stop=self.control.woken)
        self.warnings += found
        if self.control.signals:
            raise Stopped(self.control.signals[-1])

    def _instance_scope(self) -> bool:
        """
        Return whether each instance restarts alone (``--restart-scope instance`` with restarts).

        Raises:
            DiagnosticError: PR450 when the backend cannot restart one instance.
        """
        instance_scope = self.recovery.scope == "instance" and self.budget.enabled
        if instance_scope and RESTARTS_INSTANCES not in capabilities(self.backend):
            from poprun.core.hint import join_or
            from poprun.planner.trait import restarting_names

            raise DiagnosticError((error(
                "PR450", "this backend cannot restart one instance",
                detail=f"--restart-scope instance: the {self.plan.backend.name} backend starts its instances together "
                       "and cannot start one of them again alone",
                span=SourceSpan.derived("restart_scope"),
                hint="use --restart-scope all (every instance starts again), "
                     f"or the {join_or(restarting_names())} backend"),))
        return instance_scope

    def _admit(self, number: int) -> None:
        """
        Run the health check before attempt ``number`` starts; re-plan without the hosts that failed it.

        Raises:
            DiagnosticError: PR310/PR311 with each failed host's PR445/PR446: no plan is left, nothing starts.
        """
        members = self.members
        assert members is not None
        unhealthy = members.unhealthy(stop=self.control.woken)
        if self.control.signals:
            raise Stopped(self.control.signals[-1])
        if unhealthy:
            self._replan(unhealthy, number)

    def _replan(self, lost: Mapping[str, str], number: int) -> None:
        """
        Make attempt ``number``'s plan without the hosts of ``lost``.

        Raises:
            DiagnosticError: no plan is left (PR310, PR311; the health checks' own diagnostics first).
        """
        members = self.members
        assert members is not None
        master = self.plan.instances[0].host if self.plan.instances else ""
        found = members.diagnostics_for(lost)  # what the health checks found
        if found and not self.plan.membership.replans:  # no host can take their places: they say why it ends
            raise DiagnosticError(found)
        try:
            self.plan = members.replan(lost, number)
        except DiagnosticError as exc:
            raise DiagnosticError((*found, *exc.diagnostics)) from exc
        self.errors.follow(self.plan)
        self._as_planned = None  # the re-planned plan's hosts are read again
        if self.plan.instances and self.plan.instances[0].host != master:
            self._first_port = None  # chosen on instance 0's old host: chosen again on its new one

    def _left_out_at_preflight(self, number: int) -> bool:
        """Return whether the last launch's preflight failed on hosts that a re-plan left out (launch again, then)."""
        failure, self._launch_failure = self._launch_failure, None
        if self.members is None or failure is None or self.control.signals:
            return False
        lost = self.members.failed_preflight(failure)
        if not lost:
            return False
        try:
            self._replan(lost, number)
        except DiagnosticError as exc:  # no plan left: the preflight's diagnostics say what failed, then why it ends
            raise DiagnosticError((*failure.diagnostics, *exc.diagnostics)) from exc
        return True

    def _begin(self, number: int, port: int, chosen: bool) -> tuple[LaunchPlan, dict[str, str]]:
        """Begin attempt ``number`` (its port ``chosen`` here or not): return its plan and the variables it adds."""
        variables = self.added | {names.RESTART_COUNT: str(number), names.TORCHELASTIC_RESTART_COUNT: str(number)}
        if chosen:
            variables[names.TORCH_MASTER_PORT] = str(port)
        files = self.errors.files(number)
        recorded, told = self.channel.begin(number, self.plan, files) if self.channel is not None else (files, files)
        applied = self.plan.with_variables(variables).with_instance_variables(told)
        self.relay.plan = applied  # what the instances are compared with
        if self.record is not None:
            if number == 0:  # as applied, but for the progress channel's token (docs/progress.md: who can read it)
                self.record.write_plan(self.plan.with_variables(variables).with_instance_variables(recorded))
            if self.budget.enabled and number not in self._begun:
                self.record.begin_attempt(number)
            if self.members is not None and self.budget.enabled:  # as planned: diffs of attempts show what changed
                self.record.write_plan(self._as_planned or self.plan, attempt=number)
        self._begun.add(number)
        if self.members is not None:
            self.members.tell()
        self.relay.next_attempt()
        if self.budget.enabled or chosen:
            self.relay.event(AttemptStarted(attempt=number, master_port=port, chosen=chosen and self.port_checked))
        if self.limits.watch is not None:
            self.limits.watch.attempt()
        self.limits.next_attempt()
        if self.health is not None:
            self.health.hosts([i.host for i in self.plan.instances])
            self.health.attempt(number)
        return applied, variables

    def _attempt_ended(self, result: ApplyResult, number: int, port: int,
                       began: float) -> tuple[ApplyResult, bool]:
        """Note how attempt ``number`` ended; return the run's result, and whether the run starts again."""
        # a stop or a time limit is the attempt's status (128+N, 124), never the 0 of instances all stopped
        status = exit_status(evolve(result, signals=tuple(self.control.signals), limit=self.limits.limit))
        verdict = self.limits.verdict  # an instance hung, or was a straggler: the attempt's failure is its
        # (unless every instance ended well meanwhile: the one judged hung was not, it ended on its own)
        if verdict is not None and not self.limits.limit and not self.control.signals and result.failures:
            status = TIMED_OUT
        else:
            if verdict is not None and not result.failures:
                self.limits.next_attempt()  # its stacks too: they were read from a run that then ended well
            verdict = None
        delay, why = self.budget.decide(status, time.monotonic() - began, stopped=self.stopped_by(result))
        self.attempts.append(Attempt(number=number, status=status,
                                     root_cause=verdict.index if verdict is not None else result.root_cause,
                                     seconds=round(time.monotonic() - began, 3), master_port=port,
                                     next="" if delay is None and status == 0 else why,
                                     cause=verdict.cause if verdict is not None else cause(result),
                                     **self._hosts_of(number)))
        if verdict is not None:
            self._after_verdict(verdict, restarts=delay is not None)
        if delay is not None:
            stopped = self._between(delay, number + 1, result)
            if stopped is None:  # the restart begins: told and counted now, never before
                self.budget.begun()
                self.tell_ended(self.attempts[-1], why, delay=delay)
                return result, True
            self.budget.cancelled()
            why = f"not restarted: {stopped}"
            self.attempts[-1] = evolve(self.attempts[-1], next=why)
            if self.control.signals and not self.limits.limit:  # stopped while waiting to restart: as before a launch
                sig = self.control.signals[-1]
                result = evolve(result, error=ApplyError(
                    status=128 + sig, signal=sig, message=f"stopped by {signal_name(sig)} before restart {number + 1}"))
            elif self._no_plan:  # no plan left on the hosts that are: the run ends with why
                result = evolve(result, error=ApplyError(status=CANNOT_LAUNCH, message=why, diagnostics=self._no_plan))
        if self.budget.enabled:
            self.tell_ended(self.attempts[-1], why)
        return self._result(result), False

    def _hosts_of(self, number: int) -> dict[str, Any]:
        """Return the hosts attempt ``number`` ran on and why they changed, for its record (nothing without a policy)."""
        if self.members is None:
            return {}
        return {"hosts": self.plan.topology.hosts, "replan": self.members.changes.get(number, "")}

    def _launch(self, applied: LaunchPlan, variables: Mapping[str, str],
                restarts: InstanceRestarts | None) -> ApplyResult:
        """Launch an attempt of ``applied`` (``variables`` added) and wait; return how it ended."""
        try:
            return self._launch_and_wait(applied, restarts, LaunchStarting(
                backend=self.plan.backend.name, instances=len(self.plan.instances),
                variables=tuple(sorted(variables.items())),
                cache=self.cache.path if self.cache is not None else None))
        except Stopped as exc:  # as a restart's launch started (nothing of it is left): the attempts so far stay
            if not self.attempts:
                raise
            return ApplyResult(statuses=(), error=ApplyError(status=128 + exc.signum, signal=exc.signum,
                                                             message=f"stopped by {signal_name(exc.signum)}"))

    def _launch_and_wait(self, plan: LaunchPlan, restarter: InstanceRestarts | None,
                         started: LaunchStarting) -> ApplyResult:
        """Launch and wait; return the result (``error`` when nothing could start)."""
        relay, run, clock = self.relay, self.run_state, self.clock
        run.launching()
        relay.event(started)
        extra: dict[str, Any] = {"restarter": restarter} if restarter is not None else {}
        if accepts_keyword(self.backend.launch, "gate"):  # a plugin written before the gate has none
            extra["gate"] = run.gate.wait
        try:
            launch = self.backend.launch(plan, env_source=self.environ, sink=relay, cache=self.cache, **extra)
        except LaunchError as exc:
            clock.lap("start")
            self._launch_failure = exc
            return ApplyResult(statuses=(), error=ApplyError(status=exc.status, message=exc.message,
                                                             diagnostics=exc.diagnostics))
        try:  # whatever raises now (the sink, an interrupt) stops the launch first
            if relay.failed is not None:
                raise relay.failed  # noqa: TRY301 - stopped by the except below
            run.running(launch)
            if self.limits.limit:  # reached while it started
                launch.terminate(self.control.grace_s)
            clock.lap("start")
            relay.event(LaunchRunning())
            relay.observe()
            if self.record is not None:  # old runs are pruned while the instances run, not before they start
                self.record.prune_old()
            result = launch.wait()
        except HostLostError as exc:  # the launch has ended: its hosts stopped answering (mpirun lost its daemons)
            if self.members is None or not set(exc.hosts) & set(plan.topology.hosts):
                raise  # no policy, or no host of the plan to leave out (a name mpirun gave that none matches): PR411
            from poprun.apply.members import LOST

            self._hosts_lost = dict.fromkeys(exc.hosts, LOST)
            result = ApplyResult(statuses=(), error=ApplyError(status=CANNOT_LAUNCH, message=str(exc),
                                                               diagnostics=tuple(exc.diagnostics)))
        except BaseException:
            launch.terminate(0)
            with contextlib.suppress(Exception):
                launch.wait()  # nothing of the launch is left when apply() raises
            raise
        finally:
            clock.lap("run")
            if self.health is not None:
                self.health.attempt_ended()
            # until the next launch a stop ends the wait before a restart (or the restart's start), it raises nothing
            run.launch_ended(restarts=self.budget.enabled)
        if relay.failed is not None:
            raise relay.failed
        if self.channel is not None:  # each instance's last state of the attempt, before it is told ended
            self.channel.attempt_ended()
        relay.event(LaunchEnded(statuses=result.statuses, root_cause=result.root_cause))
        return result

    def _after_verdict(self, verdict: Verdict, *, restarts: bool) -> None:
        """End the run with ``verdict`` (an instance hung, or was a straggler), or leave its host out of the restart if a spare can take its place."""
        from poprun.apply.watch import replaced

        if not restarts:
            self.limits.end_run(verdict)
        elif self.members is not None and (why := replaced(verdict, self.plan, self.members.unusable)):
            self._hosts_lost.setdefault(verdict.host, why)

    def tell_ended(self, attempt: Attempt, why: str, *, delay: float | None = None) -> None:
        """Tell that ``attempt`` ended and ``why``; ``delay``: it was restarted, after that wait (call as the restart begins)."""
        reason = f"{attempt.cause}; {why}" if attempt.cause else why
        self.relay.event(AttemptEnded(attempt=attempt.number, status=attempt.status, root_cause=attempt.root_cause,
                                      restart=delay is not None, delay_ms=int((delay or 0) * 1000), reason=reason))

    def _instances_ended(self, result: ApplyResult, restarts: InstanceRestarts, port: int,
                         began: float) -> ApplyResult:
        """
        Return ``result`` of a launch that restarted instances alone, with its attempts: each restart made, each not.

        A restart granted that never started (a stop, its pre-restart command failed, it could not
        start again, another instance's failure ended the run first) is given back, and its attempt
        says why; when the run ended with that very failure, it is the last attempt.
        """
        stopped = self.stopped_by(result)
        first = len(self.attempts)
        cancelled, own = restarts.give_back(stopped, result.failure(result.root_cause), cause(result))
        for _ in cancelled:
            self.budget.cancelled()
        self.attempts.extend(restarts.attempts)
        for position in cancelled:
            self.tell_ended(self.attempts[first + position], self.attempts[first + position].next)
        if cancelled and self.control.signals and not self.limits.limit:  # stopped while one waited: as before a launch
            sig = self.control.signals[-1]
            restart = min(self.attempts[first + k].number + 1 for k in cancelled)
            return self._result(evolve(result, error=ApplyError(
                status=128 + sig, signal=sig, message=f"stopped by {signal_name(sig)} before restart {restart}")))
        if own is not None:  # the run ended with the failure whose restart was given up: that is its last attempt
            return self._result(result, gave_up=self.attempts[first + own].next)
        return self._last_instance_attempt(result, restarts, port, began=began, stopped=stopped)

    def _last_instance_attempt(self, result: ApplyResult, restarts: InstanceRestarts, port: int, *,
                               began: float, stopped: str) -> ApplyResult:
        """Return ``result`` of a launch that restarted instances alone, its last attempt told (``stopped``: by what)."""
        root = result.failure(result.root_cause)
        status = exit_status(evolve(result, signals=tuple(self.control.signals), limit=self.limits.limit))
        refused = restarts.refused.get(root.pid) if root is not None and root.pid is not None else None
        why = "succeeded" if status == 0 else refused or (
            f"not restarted: {stopped}" if stopped else
            "not restarted: its host stopped answering" if root is not None and root.lost else "not restarted")
        self.attempts.append(Attempt(number=len(self.attempts), status=status, root_cause=result.root_cause,
                                     seconds=round(time.monotonic() - began, 3), master_port=port,
                                     next="" if status == 0 else why, cause=cause(result)))
        self.tell_ended(self.attempts[-1], why)
        return self._result(result)

    def _result(self, result: ApplyResult, *, gave_up: str | None = None) -> ApplyResult:
        """Return the last attempt's result with what the attempts, limits and stacks add (``gave_up``: why it ended)."""
        if gave_up is None:
            gave_up = ""
            if self.budget.enabled and self.attempts and self.attempts[-1].status != 0:
                gave_up = self.attempts[-1].next
        limits = self.limits
        stacks = limits.stacks_with_faulthandler()
        if limits.limit and not limits.limit_waiting:  # poprun stopped every instance (faulthandler's SIGABRT
            # included): none is the root cause. A limit reached while waiting to restart stopped none of them:
            # the failure that came before it stays the root cause (which tells the report so)
            result = evolve(result, root_cause=None, failures=tuple(evolve(f, stopped=True) for f in result.failures))
        return evolve(result, attempts=tuple(self.attempts) if self.budget.enabled else (), limit=limits.limit,
                      limit_text=limits.limit_text, stacks=tuple(sorted(stacks.items())), gave_up=gave_up,
                      warnings=result.warnings + tuple(self.warnings))

    def stopped_by(self, result: ApplyResult) -> str:
        """Return what stopped the run ("" if nothing did: an instance failed on its own)."""
        if self.limits.limit:
            return self.limits.limit_text
        if self.control.signals:
            return f"poprun was stopped ({signal_name(self.control.signals[-1])})"
        if result.error is not None and not self._hosts_lost:  # a launch that lost hosts ran: a failure, not a stop
            return "poprun could not launch it"
        if self.limits.signalled:
            return (f"{signal_name(self.limits.signalled)} was sent {seconds(self.recovery.signal_before_ms)} "
                    "before the time limit (--signal)")
        return ""

    def _between(self, delay: float, number: int, result: ApplyResult) -> str | None:
        """
        Wait ``delay`` seconds, run the pre-restart command, choose the next MASTER_PORT; return why the run stops instead, or None.

        With a membership policy, the next attempt (``number``) is re-planned first when the one
        that ended (``result``) lost hosts, or hosts fail their health check now.
        """
        woken = self.control.woken
        if self.limits.watch is not None:
            self.limits.watch.pause()
        self.limits.waiting(now=True)
        try:
            if woken.wait(delay) or self.control.signals or self.limits.ended:
                return self.stopped_by(ApplyResult(statuses=())) or "stopped"
            if self.recovery.pre_restart:
                failed = run_pre_restart(self.recovery.pre_restart, self.environ,
                                         {RUN_ID: self.run_id, names.RESTART_COUNT: str(number)}, cancelled=woken)
                if failed is not None:
                    return self.stopped_by(ApplyResult(statuses=())) or failed
        except Stopped as exc:  # a signal in the main thread while waiting
            return f"poprun was stopped ({signal_name(exc.signum)})"
        finally:
            self.limits.waiting(now=False)
        if self.members is not None:
            stopped = self._renew(number, result)
            if stopped is not None:
                return stopped
        try:
            self._next_port = self._master_port()  # a stop meanwhile ends the run here, before the restart is told
        except DiagnosticError as exc:  # the user's MASTER_PORT is taken now (PR440): the restart cannot begin
            self.warnings.extend(exc.diagnostics)
            return self.stopped_by(ApplyResult(statuses=())) or "; ".join(
                f"{d.summary} ({d.code})" for d in exc.diagnostics)
        if self.control.signals or self.limits.ended:
            return self.stopped_by(ApplyResult(statuses=())) or "stopped"
        return None

    def _renew(self, number: int, result: ApplyResult) -> str | None:
        """Re-plan attempt ``number`` without the hosts ``result`` lost and those unhealthy now; return why the run stops instead, or None."""
        members = self.members
        assert members is not None
        lost = members.lost_in(result) | self._hosts_lost
        self._hosts_lost = {}
        lost |= {h: why for h, why in members.unavailable().items() if h not in lost}
        try:
            lost |= {h: why for h, why in members.unhealthy(stop=self.control.woken).items()
                     if h not in lost}
            if self.control.signals or self.limits.ended:
                return self.stopped_by(ApplyResult(statuses=())) or "stopped"
            if lost:
                self._replan(lost, number)
        except Stopped as exc:  # a signal in the main thread while the checks ran
            return f"poprun was stopped ({signal_name(exc.signum)})"
        except DiagnosticError as exc:
            self._no_plan = tuple(exc.diagnostics)
            from poprun.apply.members import no_plan_left

            return no_plan_left(DiagnosticError([d for d in exc.diagnostics if d.code in ("PR310", "PR311")]
                                                or exc.diagnostics))
        return None

    def _master_port(self) -> tuple[int, bool]:
        """Return the MASTER_PORT of the next attempt and whether it was chosen here (attempt 0's: chosen before)."""
        decided, self._first_port = self._first_port, None
        if decided is None:
            from poprun.apply.ports import master_port

            decided = master_port(self.backend, self.plan, self.environ, avoid=tuple(self.ports))
        port, chosen, checked, problem = decided
        if chosen:
            self.ports.append(port)
            self.port_checked = checked  # False: the default, unchecked (the host's ports could not be read)
        if problem is not None and not self.attempts:
            self.warnings.append(problem)
        return port, chosen


def _members(attempts: Attempts) -> Members | None:
    """Return the run's :class:`~poprun.apply.members.Members` when its plan has a membership policy (else None)."""
    policy = attempts.plan.membership
    if not (policy.replans or policy.health_check):
        return None
    from poprun.apply.members import Members

    return Members(attempts.plan, attempts.backend, attempts.environ, emit=attempts.relay.event, record=attempts.record)
