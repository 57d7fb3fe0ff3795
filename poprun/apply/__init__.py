"""
Applying a plan: the one library step between a finished plan and the backend that runs it.

Layer: ``poprun.apply``; imports its own modules (:mod:`~poprun.apply.control`,
:mod:`~poprun.apply.relay`, :mod:`~poprun.apply.attempts`, :mod:`~poprun.apply.limits`, and lazily
:mod:`~poprun.apply.channel` and :mod:`~poprun.apply.progress`: none imports this one), ``poprun.backends`` and
``poprun.partitions`` (lazily), ``poprun.planner.plan`` (and ``poprun.planner.address``, lazily: a listening run's
ssh configuration) and ``poprun.core``. It never prints and never exits: the CLI maps its
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
   whose message a failure carries. The attempts, their restarts and the run's state
   (:class:`~poprun.apply.attempts.RunState`) are :mod:`poprun.apply.attempts`'; the sink a
   backend writes to is :mod:`poprun.apply.relay`'s; the time limits, the stacks read at one and
   the teardown gate a backend awaits after a failure are :mod:`poprun.apply.limits`'. A run
   with a record (or a feature that reads the instances' progress) listens for progress on a
   channel of its own (:mod:`poprun.apply.channel`, docs/progress.md), made as the launch
   prepares and closed at its end.

Progress is reported as typed events (:mod:`poprun.core.events`) to the sink it is given,
which also receives the instances' output, from one thread at a time: the partition step, the launch starting (with the
variables this step added), every instance starting and ending, the launch running, stopping
(once, with the first reason) and ending.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator, Mapping

from popdist import env as names
from popdist.env import EXECUTABLE_CACHE_PATH
from poprun.apply import partition
from poprun.apply.attempts import Attempts, Run
from poprun.apply.control import GRACE_S, Control, Stopped
from poprun.apply.errorfile import ErrorFiles
from poprun.apply.limits import Gate
from poprun.apply.relay import Clock, Relay
from poprun.backends.base import EventSink, TemporaryCache
from poprun.backends.registry import BackendRegistry, default_registry
from poprun.core.diagnostic import Diagnostic, DiagnosticError
from poprun.core.events import RunEnded, RunStarted, Teardown
from poprun.core.exitstatus import CANNOT_LAUNCH
from poprun.core.outcome import ApplyError, ApplyResult, exit_status, signal_name
from poprun.core.record import evolve
from poprun.planner.plan import LaunchPlan
from poprun.runs.record import RUN_ID, RunRecord, new_id

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from poprun.apply.channel import Channel
    from poprun.apply.observe import Observers
    from poprun.backends.base import Backend

__all__ = ["CACHE_PREFIX", "GRACE_S", "Control", "Stopped", "apply"]

CACHE_PREFIX = "poprun-cache-"  # a temporary cache's name begins so (a name only: it is removed by record)


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
    if registry is None:  # a registry of its own: what its backends keep (connections) is closed when the run ends
        with default_registry() as own:
            return apply(plan, sink=sink, registry=own, env_source=env_source, control=control, record=record)
    control, environ = control or Control(), os.environ if env_source is None else env_source
    relay, clock = Relay(plan, sink, record, environ), Clock(record)
    run_id = record.id if record is not None else new_id(time.time())
    observers = _observers(plan, environ, run_id, relay, control)
    try:  # a stop may come while the first event waits on its reader (a stdout nobody reads)
        relay.event(RunStarted(run=record.id if record is not None else "", backend=plan.backend.name,
                               instances=len(plan.instances), hosts=plan.topology.hosts))
        backend = _backend(registry, plan, observers)
    except (Stopped, KeyError, DiagnosticError) as exc:  # a stop; an unknown backend, a plugin unmade (PR460), PR469
        return _finish(_unstarted(exc, control), relay, record, clock, observers)
    run = Run(control, tell=relay.stopping, gate=Gate())
    relay.started = run.instance_started
    control.bind(run)
    released: list[Diagnostic] = []  # what releasing the partition warns about, told at the very end
    channel = _channel(plan, relay, record, environ) if _listens(plan, record) else None  # made meanwhile
    _watched(observers, channel)
    from poprun.apply.ports import master_port

    try:
        # attempt 0's MASTER_PORT first: reading another host's ports takes a connection, and nothing of the
        # launch (its temporary cache) exists yet should poprun be killed meanwhile
        first_port = master_port(backend, plan, environ, avoid=())
        with partition.acquired(plan, environ, released, emit=relay.event) as variables, \
                _executable_cache(plan) as cache:
            clock.lap("partition")
            added = _added(plan, variables, cache, run_id, recorded=record is not None)
            errors = ErrorFiles(plan, record.path if record is not None else None)
            try:
                result = Attempts(backend, plan, environ, relay=relay, control=control, run=run, clock=clock,
                                  record=record, cache=TemporaryCache(path=cache, remove_at_exit=plan.cache.remove_at_exit)
                                  if cache is not None else None, added=added, run_id=run_id,
                                  first_port=first_port, errors=errors, channel=channel).run()
            finally:
                _close(errors, channel)
                relay.event(Teardown())
    except DiagnosticError as exc:  # the partition could not be had (nothing started), or the backend failed running
        result = ApplyResult(statuses=(), error=ApplyError(status=CANNOT_LAUNCH, diagnostics=exc.diagnostics))
    except Stopped as exc:  # before anything started
        result = ApplyResult(statuses=(), error=_stopped(exc))
    except BaseException as exc:  # a bug, a sink that raised, an interrupt outside a launch: the record still ends
        if record is not None or observers is not None:
            _abandon(exc, relay, record, clock, observers)
        raise
    run.finish()
    return _finish(evolve(result, warnings=(*released, *result.warnings, *_heard(channel, record)),
                          signals=tuple(control.signals), notes=(*result.notes, *relay.notes)), relay, record, clock,
                   observers)


def _backend(registry: BackendRegistry, plan: LaunchPlan, observers: Observers | None) -> Backend:
    """
    Return the plan's backend, found by name in ``registry``.

    Raises:
        DiagnosticError: PR469, when the metrics file cannot be kept (nothing starts), or the registry's.
        KeyError: the registry's (an unknown backend).
    """
    if observers is not None and observers.refused is not None:
        raise DiagnosticError([observers.refused])
    return registry.get(plan.backend.name)


def _observers(plan: LaunchPlan, environ: Mapping[str, str], run_id: str, relay: Relay,
               control: Control) -> Observers | None:
    """Return the run's notifier and metrics file, listening to ``relay``; None for a plan with neither (no import)."""
    if not plan.observe.active:
        return None
    from poprun.apply.observe import Observers

    return Observers(plan, environ, run_id, relay, control)


def _listens(plan: LaunchPlan, record: RunRecord | None) -> bool:
    """Return whether the run listens for its instances' progress: with a run record, or a feature that reads it."""
    if record is not None:
        return True
    return bool(plan.recovery.heartbeat_timeout_ms or plan.observe.metrics_file or plan.observe.notify)


def _channel(plan: LaunchPlan, relay: Relay, record: RunRecord | None, environ: Mapping[str, str]) -> Channel:
    """
    Return the run's progress channel, its socket being made in its own thread (docs/progress.md).

    With the ssh backend, the channel's thread looks (a second into the run) for hosts that ssh
    reaches through a jump host, whose progress cannot reach poprun (PR449).
    """
    from poprun.apply.channel import Channel, here
    from poprun.apply.progress import Board
    from poprun.planner.address import ssh_proxy
    from poprun.planner.setting import straggler_rule

    window, _ = straggler_rule({s.name: s.value for s in plan.backend.settings})  # W: the straggler rule's window
    board = Board(tuple(i.host for i in plan.instances), window=window, last_attempt=plan.recovery.max_restarts)
    local = here(plan)
    proxied = dict.fromkeys(i.host for i, at in zip(plan.instances, local, strict=True) if not at)
    ssh = plan.backend.traits.own_ssh_sessions()  # its hosts' SSH_CONNECTION is where their progress goes
    channel = Channel(board, remote=not all(local), emit=relay.event,
                      write=record.write_progress if record is not None else None,
                      proxy=lambda host: ssh_proxy(host, environ), proxied=tuple(proxied) if ssh else ())
    channel.start()
    return channel


def _close(errors: ErrorFiles, channel: Channel | None) -> None:
    """Close what the attempts used: the error files, the progress channel."""
    errors.close()
    if channel is not None:
        channel.close()


def _heard(channel: Channel | None, record: RunRecord | None) -> tuple[Diagnostic, ...]:
    """Close the progress channel; return what it warns of (PR447, PR448), and keep its summary for the report."""
    if channel is None:
        return ()
    channel.close()  # closed already, unless the attempts never began (the partition step failed)
    from poprun.apply.channel import forged, unopened

    if record is not None and channel.error is None:
        record.progress = channel.report()
    if channel.error is not None:
        return (unopened(channel.error),)
    from poprun.apply.channel import jumped

    unreachable = channel.unreachable()
    return ((forged(channel.forged, channel.received),) if channel.forged else ()) + (
        (jumped(unreachable),) if unreachable else ())


def _unstarted(exc: Stopped | KeyError | DiagnosticError, control: Control) -> ApplyResult:
    """Return how a run ended that stopped, or whose backend could not be had, before anything of it was made."""
    if isinstance(exc, Stopped):
        return ApplyResult(statuses=(), error=_stopped(exc), signals=tuple(control.signals))
    return ApplyResult(statuses=(), error=_unmade(exc))


def _watched(observers: Observers | None, channel: Channel | None) -> None:
    """Have the metrics file read the instances' progress from the channel's board."""
    if channel is not None and observers is not None:
        observers.watch(channel.board.snapshot)


def _unmade(exc: KeyError | DiagnosticError) -> ApplyError:
    """Return how a run whose backend could not be had ended: 125 (an unknown name, a plugin that cannot be made)."""
    if isinstance(exc, KeyError):
        return ApplyError(status=CANNOT_LAUNCH, message=str(exc.args[0]))
    return ApplyError(status=CANNOT_LAUNCH, message=str(exc), diagnostics=tuple(exc.diagnostics))


def _stopped(exc: Stopped) -> ApplyError:
    """Return how a run stopped before anything started ended: 128+N."""
    return ApplyError(status=128 + exc.signum, signal=exc.signum, message=f"stopped by {signal_name(exc.signum)}")


def _abandon(exc: BaseException, relay: Relay, record: RunRecord | None, clock: Clock,
             observers: Observers | None) -> None:
    """End ``record`` of a run that ``exc`` ends (a bug, a sink that raised, an interrupt outside a launch)."""
    why = f"poprun ended by {type(exc).__name__}: {exc}"
    with contextlib.suppress(Exception):  # the sink may be what raised: the report is written first anyway
        _finish(ApplyResult(statuses=(), error=ApplyError(status=CANNOT_LAUNCH, message=why)), relay, record, clock,
                observers)
    if observers is not None:
        observers.close()  # told once: a second close does nothing
    if record is not None:
        record.close()


def _added(plan: LaunchPlan, variables: Mapping[str, str], cache: str | None, run_id: str, *,
           recorded: bool) -> dict[str, str]:
    """Return the variables this step adds to every instance: the partition's the plan leaves open, the cache's, the run's id."""
    # the partition's variables the plan leaves open (its id when not named): the rest are the plan's,
    # the user's -x IPUOF_VIPU_API_TIMEOUT among them, and explain showed them
    planned = {name for i in plan.instances for name in (*dict(i.env.set), *i.env.forward)}
    added = {k: v for k, v in variables.items() if k not in planned}
    added |= {EXECUTABLE_CACHE_PATH: cache} if cache is not None else {}
    r = plan.recovery
    limited = r.timeout_ms or r.stall_timeout_ms or r.heartbeat_timeout_ms  # stacks find instances by their id
    added |= {names.TORCHELASTIC_RUN_ID: run_id} | ({RUN_ID: run_id} if recorded or limited else {})
    return added


def _finish(result: ApplyResult, relay: Relay, record: RunRecord | None, clock: Clock,
            observers: Observers | None = None) -> ApplyResult:
    """
    Tell the end of the run, end its observers, and write its report into the record; return the result with the run's id.

    The observers (the notifier, the metrics file) end after run-ended was told and before the report is
    written, so that their warnings are in it; the notifications left take at most the notify deadline.
    """
    clock.lap("teardown")
    status = exit_status(result)
    error = result.error
    try:
        relay.event(RunEnded(status=status, root_cause=result.root_cause,
                             error=(error.message or "; ".join(d.summary for d in error.diagnostics)) if error else ""))
    finally:  # a sink that raises does not keep the report from being written
        if observers is not None:
            result = evolve(result, warnings=result.warnings + observers.close())
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
    from poprun.process.files import private_directory, remove_directories

    path = private_directory(CACHE_PREFIX)  # the backend removes it too (and its watchdog)
    try:
        yield path
    finally:
        if plan.cache.remove_at_exit:
            remove_directories([path])


class _Package(type(sys)):  # type: ignore[misc]  # types.ModuleType, without importing types
    """The package as ``from poprun import apply`` gives it: calling it is :func:`apply` (the ``poprun`` facade)."""

    def __call__(self, plan: LaunchPlan, *, sink: EventSink, registry: BackendRegistry | None = None,
                 env_source: Mapping[str, str] | None = None, control: Control | None = None,
                 record: RunRecord | None = None) -> ApplyResult:
        return apply(plan, sink=sink, registry=registry, env_source=env_source, control=control, record=record)


sys.modules[__name__].__class__ = _Package
