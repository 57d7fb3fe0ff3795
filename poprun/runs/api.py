"""
Run records as a library: find a run, follow its output, attach to it, read its report, stop it.

Layer: ``poprun.runs``; imports ``poprun.core`` and the rest of ``poprun.runs``, never
``poprun.render`` or ``poprun.cli``. Every function returns a value (or an iterator of them) and
prints nothing; ``poprun ps``, ``logs``, ``report``, ``stop`` and ``attach``
(:mod:`poprun.cli.commands.runs`) parse their words, call these and print what
:mod:`poprun.render.runs` makes of the values. Not on the launch path.

A run is ``running`` while its supervisor lives, ``ended`` once its report exists, ``lost``
otherwise (:func:`poprun.runs.store.state_of`). Problems are diagnostics: PR600-PR602, PR605 and
PR609 as :class:`~poprun.core.diagnostic.DiagnosticError` (a command-line or record error);
PR603, PR604, PR607, PR608 and PR618 as :class:`RunStateError`, the run not being in a state the
call can act on.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator, Mapping

from poprun.core.diagnostic import DiagnosticError, error
from poprun.core.record import field, record
from poprun.core.runinfo import RunInfo
from poprun.core.span import SourceSpan
from poprun.runs import store

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see poprun.core.record)
if TYPE_CHECKING:
    from typing import Any

    from poprun.core.outcome import ApplyResult

RECENT = 10  # ended runs that ``poprun ps`` shows without --all
POLL_S = 0.1  # how often ``follow`` looks for more output
STOP_WAIT_S = 15.0  # how long ``stop`` waits for the run to end: poprun's grace period (5 s) and some

Piece = tuple[int, str, bytes]  # (instance index, "stdout" | "stderr", bytes), in the order the record kept them


class RunStateError(DiagnosticError):
    """The run is not in a state the call can act on (PR603, PR604, PR607, PR608, PR618): ``poprun`` exits 1."""


@record
class Run:
    """A run found in the runs directory: its id and its directory."""

    id: str
    path: str


@record
class StopResult:
    """
    How :func:`stop` left the run: it ended.

    ``reported``: its report exists, and ``status`` is the status it holds (as written: a
    record is untrusted); else its supervisor is gone without one (or ended as it was signalled).
    """

    run: Run
    reported: bool
    status: object = field(default=None, eq=False)


@record
class RunReport:
    """
    What ``poprun report`` shows of a run.

    ``data``: its ``report.json`` (None while it runs or once lost; checked unless read ``raw``);
    ``info``, ``result`` and ``actual`` (``actual.json``'s data, or None) are read for the text
    view only.
    """

    run: Run
    data: Any = field(default=None, eq=False)
    info: RunInfo | None = None
    result: ApplyResult | None = None
    actual: Any = field(default=None, eq=False)


def locate(given: str, environ: Mapping[str, str] | None = None) -> Run:
    """
    Return the run ``given`` names: its id, a unique prefix of one, or ``last``.

    Diagnostics:
        PR600 (no such run), PR601 (a prefix of several), PR602 (the runs directory unreadable).
    """
    root = store.runs_root(os.environ if environ is None else environ)
    run_id = store.find_run(root, given)
    return Run(id=run_id, path=os.path.join(root, run_id))


def list_runs(*, every: bool = False, environ: Mapping[str, str] | None = None) -> list[RunInfo]:
    """Return the running runs and the last :data:`RECENT` ended ones (every run with ``every``), newest first."""
    found = list(store.list_runs(store.runs_root(os.environ if environ is None else environ)))
    if every:
        return found
    ended = [r for r in found if r.state != "running"][:RECENT]
    return [r for r in found if r.state == "running" or r in ended]


def info(run: Run) -> RunInfo:
    """Return what ``poprun ps`` shows of ``run`` (a record that cannot be read is ``damaged``, not an error)."""
    return store.run_info(os.path.dirname(run.path), run.id)


def report_json(run: Run) -> Any:
    """Return the data of the run's ``report.json`` as written (None while it runs or once it was lost); PR602."""
    return store.read_json(os.path.join(run.path, "report.json"))


def check_instance(run: Run, instance: int | None) -> None:
    """PR605 when ``instance`` is not an instance of the run's plan."""
    if instance is None:
        return
    count = info(run).instances
    if count is not None and instance >= count:
        raise DiagnosticError([error("PR605", f"no instance {instance} in the run",
                                     detail=f"run {run.id} has {count} instance"
                                     f"{'' if count == 1 else 's'}, 0 to {count - 1}",
                                     span=SourceSpan.flag("--instance"),
                                     hint=f"give --instance a number from 0 to {count - 1}")])


def check_attempt(run: Run, attempt: int | None) -> None:
    """PR609 when the run has no attempt ``attempt`` (it could not restart, or did not that often)."""
    if attempt is None or os.path.isdir(os.path.join(run.path, "attempts", str(attempt))):
        return
    try:
        kept = sorted(int(n) for n in os.listdir(os.path.join(run.path, "attempts")) if n.isdigit())
    except OSError:
        kept = []
    have = f"attempts 0 to {kept[-1]}" if kept else "no attempts kept apart (it could not restart)"
    raise DiagnosticError([error("PR609", f"no attempt {attempt} in the run",
                                 detail=f"run {run.id} has {have}",
                                 span=SourceSpan.flag("--attempt"),
                                 hint=f"give --attempt a number from 0 to {kept[-1]}" if kept
                                 else "drop --attempt: the run's logs are its only attempt's")])


def follow(run: Run, *, instance: int | None = None, attempt: int | None = None, tail: int | None = None,
           until_over: bool = False, tick: Callable[[], None] | None = None) -> Iterator[Piece]:
    """
    Yield the run's output: what the record holds now (everything, or the last ``tail`` lines).

    With ``until_over``, then the output as it arrives until the run is over (its report
    written, or its supervisor gone), following each new attempt's logs from their start;
    ``tick`` is called between looks (every :data:`POLL_S`). Only ``instance``'s output when
    given; attempt ``attempt``'s logs when given. PR602 when the logs cannot be read.
    """
    reader = store.LogReader(run.path, instance=instance, attempt=attempt)
    yield from (reader.pieces() if tail is None else reader.last_lines(tail))
    if not until_over:
        return
    current = _attempt_link(run.path)
    while True:
        over = store.state_of(run.path) != "running"
        yield from reader.pieces()
        now = _attempt_link(run.path)
        if now != current:  # the run restarted: follow the new attempt's logs from their start
            current, reader = now, store.LogReader(run.path, instance=reader.instance)
            continue
        if over:
            return
        if tick is not None:
            tick()
        time.sleep(POLL_S)


def _attempt_link(path: str) -> str:
    """Return where the run's ``logs`` link points (the current attempt's logs), or "" when it is no link."""
    try:
        return os.readlink(os.path.join(path, "logs"))
    except OSError:
        return ""


def attach(run: Run, *, tick: Callable[[], None] | None = None) -> Iterator[Piece]:
    """
    Return the running run's output so far, then as it arrives until the run is over (:func:`follow`).

    Diagnostics:
        PR603 (:class:`RunStateError`) when the run has ended or was lost; checked at once, not when iterated.
    """
    require_running(run, "attach")
    return follow(run, until_over=True, tick=tick)


def ended_with(run: Run) -> int | None:
    """Return the status the run ended with (its report; 1 when the report holds none that is one), None when it was lost."""
    report = report_json(run)
    if report is None:
        return None
    status = report.get("status")
    return status if isinstance(status, int) and not isinstance(status, bool) and 0 <= status <= 255 else 1  # noqa: PLR2004


def require_running(run: Run, command: str) -> store.Supervisor | None:
    """Return the run's supervisor; PR603 (:class:`RunStateError`) when the run has ended or was lost."""
    state = store.state_of(run.path)
    if state == "running":
        return store.read_supervisor(run.path)
    if state == "ended":
        report = report_json(run)
        detail = f"run {run.id} has ended with status {report.get('status')}"
    else:
        detail = f"run {run.id} was lost: its supervisor ended without writing a report"
    raise RunStateError([error("PR603", "run is not running", detail=detail, span=SourceSpan.flag("RUN"),
                               hint=f"'poprun report {run.id}' tells how it ended, 'poprun logs {run.id}' shows its "
                               "output" if command != "report" else "")])


def read_report(run: Run, *, raw: bool = False) -> RunReport:
    """
    Return the run's report: checked, with what the text view shows (``raw``: the data as written, once checked).

    Diagnostics:
        PR602 (a record file unreadable); PR608 (:class:`RunStateError`) with ``raw`` when there is no report yet.
    """
    name = os.path.join(run.path, "report.json")
    data = store.read_json(name)
    if data is None:
        if raw:
            state = store.state_of(run.path)
            raise RunStateError([error(
                "PR608", "run has no report yet", detail=f"run {run.id} is {state}: its report is written when it ends"
                if state == "running" else f"run {run.id} was lost: its supervisor ended without writing a report",
                span=SourceSpan.flag("RUN"), hint=f"'poprun ps' shows its state; 'poprun logs {run.id}' its output")])
        return RunReport(run=run, info=info(run))
    checked = store.checked_report(data, name)
    if raw:
        return RunReport(run=run, data=data)
    from poprun.runs.report import result_of

    about = info(run)
    result = result_of(checked)
    actual = store.read_json(os.path.join(run.path, "actual.json"))
    return RunReport(run=run, data=checked, info=about, result=result, actual=actual)


def stop(run: Run, timeout: float = STOP_WAIT_S) -> StopResult:
    """
    Stop every instance of the run as Ctrl-C would (SIGTERM to its supervisor: grace, then SIGKILL); return once it ended.

    Diagnostics (:class:`RunStateError`):
        PR603 (not running), PR604 (supervised on another host), PR618 (the supervisor ignores
        SIGTERM: nothing is sent), PR607 (not ended ``timeout`` seconds after SIGTERM).
    """
    supervisor = require_running(run, "stop")
    if supervisor is None or not store.supervised_here(supervisor):
        where = supervisor.host if supervisor is not None else "another host"
        raise RunStateError([error("PR604", "run supervised on another host",
                                   detail=f"run {run.id} is supervised by poprun (PID "
                                   f"{supervisor.pid if supervisor else '?'}) on {where}: poprun signals only "
                                   "processes of its own host", span=SourceSpan.flag("RUN"),
                                   hint=f"run 'poprun stop {run.id}' on {where}")])
    if _ignores(supervisor.pid, signal.SIGTERM):
        raise RunStateError([error("PR618", "run's supervisor ignores SIGTERM",
                                   detail=f"run {run.id}'s supervisor (PID {supervisor.pid}) was started with SIGTERM "
                                   "ignored, and keeps it so: nothing was sent", span=SourceSpan.flag("RUN"),
                                   hint=f"'kill -KILL {supervisor.pid}' ends it, and its watchdog every instance (the "
                                   "run is then lost, without a report)")])
    if not _signal(supervisor, signal.SIGTERM):
        return _stopped(run)  # it ended in the meantime
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if store.state_of(run.path) != "running":
            return _stopped(run)
        time.sleep(0.05)
    if store.state_of(run.path) != "running":
        return _stopped(run)
    raise RunStateError([error("PR607", "run did not stop in time",
                               detail=f"run {run.id}'s supervisor (PID {supervisor.pid}) was sent SIGTERM, but the run "
                               f"had not ended {timeout:g} s later", span=SourceSpan.flag("--timeout"),
                               hint=f"wait, then 'poprun ps'; 'poprun stop {run.id}' again kills every instance at "
                               "once")])


def _ignores(pid: int, sig: int) -> bool:
    """Return whether process ``pid`` ignores ``sig`` (``SigIgn`` of ``/proc/PID/status``); False when unknown."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as file:
            mask = next((line.split(":", 1)[1] for line in file if line.startswith("SigIgn:")), "0")
        return bool(int(mask.strip(), 16) >> (sig - 1) & 1)
    except (OSError, ValueError):
        return False


def _signal(supervisor: store.Supervisor, sig: int) -> bool:
    """
    Send ``sig``, then SIGCONT, to the supervisor if it is still the process the record names (pid and start time).

    A pidfd holds the process while its start time is checked, so a reused pid is never signalled.
    SIGCONT follows, as kill(1) and a shell's ``kill`` do for a stopped job: a supervisor
    suspended (Ctrl-Z, SIGSTOP) would otherwise hold ``sig`` pending until someone continued
    it; it then continues its instances and stops them. Return False when it is gone.
    """
    try:
        handle = os.pidfd_open(supervisor.pid)
    except ProcessLookupError:
        return False
    try:
        if not supervisor.alive():
            return False
        signal.pidfd_send_signal(handle, sig)
        signal.pidfd_send_signal(handle, signal.SIGCONT)
    except ProcessLookupError:
        return False
    finally:
        os.close(handle)
    return True


def _stopped(run: Run) -> StopResult:
    data = None
    with contextlib.suppress(DiagnosticError):
        data = report_json(run)
    return StopResult(run=run, reported=data is not None, status=data.get("status") if data is not None else None)

