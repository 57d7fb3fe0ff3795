"""
Running a plan from the command line: the apply step with a console, signals and an exit status.

Layer: ``poprun.cli``. :func:`run_plan` calls :func:`poprun.apply.apply` and adds what belongs
to a process run from a terminal: it stops the launch on SIGINT/SIGTERM/SIGHUP (a second one
kills; one ignored on entry, as under ``nohup``, stays ignored) or when its stdout or stderr is
closed (SIGPIPE semantics: exit 141), passes Ctrl-Z (SIGTSTP) on to the instances, shows the
apply step's events as progress and log lines (:mod:`poprun.cli.progress`, :mod:`poprun.cli.log`),
prints how it ended (:func:`poprun.render.outcome.render_outcome`) and maps the result to an
exit status. poprun makes itself a child subreaper here, so that descendants of instances that
leave their process group come back to it and die with the launch
(:mod:`poprun.process.watchdog`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from types import FrameType

from popdist.env import EXECUTABLE_CACHE_PATH
from poprun.apply import Control, apply
from poprun.backends.registry import BackendRegistry
from poprun.cli.log import Log
from poprun.cli.progress import Console
from poprun.core.events import (
    AttemptEnded,
    AttemptStarted,
    Event,
    HostConnected,
    InstanceEnded,
    InstanceProgressed,
    InstanceStarted,
    LaunchRunning,
    LaunchStarting,
    LimitReached,
    MpiWithoutLauncher,
    PartitionAcquiring,
    PhaseEnded,
    Replan,
    RunStarted,
    Stopping,
)
from poprun.core.outcome import exit_status, signal_name
from poprun.core.rawbytes import shell_join, shell_quote
from poprun.core.secret import is_secret
from poprun.planner.plan import LaunchPlan
from poprun.process.cgroup import release_ahead
from poprun.process.watchdog import become_subreaper

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from poprun.cli.eventstream import EventStream
    from poprun.cli.progress import ProgressLine
    from poprun.runs.record import RunRecord

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
RECORD = "POPRUN_RECORD"  # 0: keep no run record


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


class _Reporter:
    """Turns the apply step's events into log lines and the status line."""

    def __init__(self, plan: LaunchPlan, verbose: Log, console: Console) -> None:
        self._plan, self.verbose, self._console = plan, verbose, console
        self._running, self._since = 0, time.monotonic()
        self._started = False  # until every instance has started, the status line says "starting"
        self._waited = False
        self._stopping: str | None = None
        self._total = len(plan.instances)  # the current attempt's instances (a re-planned attempt's may be fewer)
        self._progress: ProgressLine | None = None  # the -v progress line, once progress is heard

    def event(self, event: Event) -> None:
        """Log what ``event`` says; update the status line."""
        if isinstance(event, RunStarted):
            if event.run:
                self.verbose.info(f"Run {event.run}")
        elif isinstance(event, PartitionAcquiring):
            self._console.status("partition: acquiring it from the V-IPU service")
        elif isinstance(event, LaunchStarting):
            _log_plan(self._plan.with_variables(dict(event.variables)), event, self.verbose)
            self._show()
        elif isinstance(event, LaunchRunning):
            self._since, self._started = time.monotonic(), True
            self._waiting()
            self._show()
        elif isinstance(event, Stopping):
            self._stopping = self._stopping or event.reason
            self.verbose.info(f"Stopping every instance: {event.reason}")
            self._show()
        elif isinstance(event, InstanceStarted | InstanceEnded):
            self._instance(event)
            self._show()
        elif isinstance(event, AttemptStarted):
            self._stopping, self._started, self._waited = None, False, False
            if event.chosen:
                self.verbose.debug(f"MASTER_PORT {event.master_port} (chosen for attempt {event.attempt})")
        elif isinstance(event, AttemptEnded) and event.restart:
            self._console.log(f"poprun: attempt {event.attempt} failed: {event.reason}\n")
        elif isinstance(event, Replan):
            self._total = event.instances
            self._console.log(f"poprun: attempt {event.attempt} runs on {','.join(event.hosts)}: {event.reason}\n")
        elif isinstance(event, LimitReached):
            self._limit(event)
        elif isinstance(event, PhaseEnded):
            self.verbose.info(f"{event.phase.capitalize()} took {event.ms / 1000:.2f} s"
                              + (f" ({event.detail})" if event.detail else ""))
        elif isinstance(event, HostConnected):
            self._connected(event)
        elif isinstance(event, InstanceProgressed):
            self._progressed(event)
        elif isinstance(event, MpiWithoutLauncher):  # passed on by apply only when it is to be told (PR425)
            from poprun.apply.mpicheck import mpi_warning
            from poprun.render.diagnostics import render_diagnostics

            told = mpi_warning(self._plan, event)
            if told is not None:
                self._console.log(render_diagnostics((told,), {}))

    def _progressed(self, event: InstanceProgressed) -> None:
        """Log the run's progress with -v, every 10 s at most (:class:`~poprun.cli.progress.ProgressLine`)."""
        if self.verbose.verbosity < 1:
            return
        if self._progress is None:
            from poprun.cli.progress import ProgressLine

            self._progress = ProgressLine()
        line = self._progress.line(event)
        if line is not None:
            self.verbose.info(line)

    def _connected(self, event: HostConnected) -> None:
        tries = f", {event.attempts} attempts" if event.attempts > 1 else ""
        if event.slow:
            self.verbose.info(f"Host {event.host} is slow: connected in {event.ms / 1000:.2f} s{tries}")
        else:
            self.verbose.debug(f"Host {event.host}: connected in {event.ms / 1000:.2f} s{tries}")

    def _limit(self, event: LimitReached) -> None:
        if event.limit == "signal":
            self.verbose.info(f"Sending {signal_name(event.signal)} to every instance (--signal)")
        else:
            self.verbose.info(f"Time limit reached: {event.limit} after {event.after_ms / 1000:.1f} s; "
                              "reading where each instance is, then stopping them")

    def _instance(self, event: InstanceStarted | InstanceEnded) -> None:
        instance = self._plan.instances[min(event.index, len(self._plan.instances) - 1)]  # argv: the same in any attempt
        if isinstance(event, InstanceStarted):
            self._running += 1
            self.verbose.info(f"Instance {event.index} (PID {event.pid}) on {event.host or instance.host}: "
                              f"{shell_join(instance.argv)}")
            if self._running == self._total:
                self._waiting()
        else:
            self._running -= 1
            how = f"exit code {event.exit_code}" if event.signal is None else f"signal {signal_name(event.signal)}"
            self.verbose.info(f"Instance {event.index} (PID {event.pid}) terminated with {how}")

    def _waiting(self) -> None:
        """Log that poprun waits, once: when the last instance started, or when the launch is running."""
        if not self._waited:
            self._waited = True
            self.verbose.info("Waiting for instances")

    def _show(self) -> None:
        total = self._total
        if not self._started:
            self._console.status(f"starting {_plural(total, 'instance')}")
        elif self._stopping is not None:
            self._console.status(f"stopping {_plural(self._running, 'instance')} ({self._stopping})")
        elif self._running == total:
            self._console.status(f"running {_plural(total, 'instance')}", since=self._since)
        else:
            self._console.status(f"running {self._running} of {_plural(total, 'instance')}", since=self._since)


def _handled(sig: int) -> bool:
    """Return whether poprun may take ``sig`` over: not when it was ignored on entry (``nohup``, ``&``)."""
    return signal.getsignal(sig) is not signal.SIG_IGN


@contextlib.contextmanager
def _handling_signals(control: Control, *, first: Callable[[], None] = lambda: None) -> Iterator[Control]:
    """
    Have SIGINT, SIGTERM and SIGHUP stop the apply step, and SIGTSTP pause it, while it runs; restore afterwards.

    A signal that was ignored when poprun started stays ignored, as ``nohup`` and a shell's
    ``&`` expect, and the instances inherit it ignored. A stop calls ``first`` before anything
    else (it must take no lock: the console's :meth:`~poprun.cli.progress.Console.stopped`).
    """
    if threading.current_thread() is not threading.main_thread():
        yield control
        return

    def stop(signum: int, _frame: FrameType | None) -> None:
        first()
        control.stop(signum)

    def suspend(_signum: int, _frame: FrameType | None) -> None:
        """Ctrl-Z (SIGTSTP): stop the instances too, then poprun itself; continue them when poprun continues."""
        control.forward(signal.SIGTSTP)
        # SIGSTOP, not SIGTSTP: the kernel discards a SIGTSTP to an orphaned process group (poprun
        # started by a script or a service), and the one who sent it wants poprun stopped
        os.kill(os.getpid(), signal.SIGSTOP)  # stops here until SIGCONT
        control.forward(signal.SIGCONT)

    handlers = dict.fromkeys(_STOP_SIGNALS, stop) | {signal.SIGTSTP: suspend}
    previous = {sig: signal.signal(sig, handler) for sig, handler in handlers.items() if _handled(sig)}
    try:
        yield control
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _log_plan(plan: LaunchPlan, starting: LaunchStarting, verbose: Log) -> None:
    verbose.info(f"Running {_plural(starting.instances, 'instance')} with the {starting.backend} backend")
    if not verbose.debugging:
        return
    cache = plan.instances[0].env.get(EXECUTABLE_CACHE_PATH) if plan.instances else None
    verbose.debug(f"Executable cache: {cache or 'none'} ({plan.cache.mode})")
    for instance in plan.instances:
        values = " ".join(f"{k}={'****' if is_secret(k, plan.mask) else shell_quote(v)}" for k, v in instance.env.set)
        verbose.debug(f"Instance {instance.index} environment: {values}; forwarded: "
                      f"{', '.join(instance.env.forward) or 'none'}; unset: {', '.join(instance.env.unset) or 'none'}")


def run_plan(plan: LaunchPlan, *, registry: BackendRegistry | None = None,
             env_source: Mapping[str, str] | None = None, subreaper: bool = True,
             console: Console | None = None, started: float | None = None,
             events: EventStream | None = None, detach: bool = False, record: RunRecord | None = None) -> int:
    """
    Run ``plan`` with its backend; return poprun's exit status (design.md section 3).

    That is the root-cause instance's status (128+N for signal N), 128+N when poprun was
    stopped by signal N (141, SIGPIPE's, when its stdout or stderr was closed), 1 when the
    instances succeeded but their output could not be written, 125 when the backend is
    unavailable or cannot launch, and 126/127 when the program is not executable / not found. With ``subreaper`` (the command line),
    this process becomes a child subreaper (see the module docstring). ``console`` is one the
    caller made earlier (to show ``planning`` on the status line); it is closed here. The run
    is recorded (:mod:`poprun.runs.record`) unless ``POPRUN_RECORD=0``; ``started`` (monotonic) is
    when planning began, for the record's timing of it; ``record``, a record made already. ``events``
    (``--events``) hears every event as a JSON line. With ``detach``, the run goes on in a supervisor
    of its own (:mod:`poprun.cli.detach`) and this returns once every instance has started.
    """
    console = console or Console()
    if detach:
        from poprun.cli.detach import detach as supervise_detached

        return supervise_detached(_record(os.environ if env_source is None else env_source, console, started), console,
                                  lambda console, record: run_plan(plan, registry=registry, env_source=env_source,
                                                                   console=console, events=events, record=record))
    if events is not None and events.fd == 1:
        events.console = console  # on standard output, event lines and output lines stay whole
    if subreaper:
        become_subreaper()
    reporter = _Reporter(plan, Log(plan.output.verbosity, console.log), console)
    console.on_event = reporter.event if events is None else _both(events, reporter)
    control = Control()
    console.on_broken = control.output_closed
    environ = os.environ if env_source is None else env_source
    _cgroup_ahead(plan, environ)  # its move overlaps the record's making and the launch's preparation (start-up)
    try:
        record = record if record is not None else _record(environ, console, started)
    except BaseException:
        release_ahead()
        raise
    try:
        with _handling_signals(control, first=console.stopped):
            result = apply(plan, sink=console, registry=registry, env_source=env_source, control=control,
                           record=record)
            if events is not None:  # a reader that is behind gets a little while, not the run's signals
                stops = len(control.signals)
                events.drain(stop=lambda: len(control.signals) > stops)
    finally:
        release_ahead()  # a cgroup made ahead that no launch took
        console.close()
        if events is not None:
            events.close()
    if events is not None and events.warning:
        _to_stderr(console, f"poprun: warning: {events.warning}\n")
    if record is not None and record.warning:
        _to_stderr(console, f"poprun: warning: {record.warning}\n")
    from poprun.render.outcome import render_outcome

    text = render_outcome(result)
    if text:
        if "stdout" not in console.abandoned:
            with contextlib.suppress(OSError, ValueError):
                sys.stdout.flush()
        _to_stderr(console, text)
    return exit_status(result, failed_output=bool(console.failed))


def _cgroup_ahead(plan: LaunchPlan, environ: Mapping[str, str]) -> None:
    """
    Begin the launch's cgroup ahead (:func:`poprun.backends.local.cgroup_ahead`).

    Not for a launch with a partition step: its tools (``vipu``) would begin in the launch's cgroup.
    """
    from poprun.apply.partition import wanted
    from poprun.backends.local import cgroup_ahead

    if not wanted(plan, environ):
        cgroup_ahead(plan)


def _both(events: EventStream, reporter: _Reporter) -> Callable[[Event], None]:
    def tell(event: Event) -> None:
        events.event(event)
        reporter.event(event)

    return tell


def _record(environ: Mapping[str, str], console: Console, started: float | None) -> RunRecord | None:
    """Return a new run record, or None (``POPRUN_RECORD=0``, or a warning when it cannot be made)."""
    if environ.get(RECORD, "").strip().lower() in ("0", "no", "false", "off"):
        return None
    from poprun.runs.record import RecordError, RunRecord

    try:
        record = RunRecord.create(environ, prune=False)  # pruned once the instances started (start-up)
    except RecordError as exc:
        console.log(f"poprun: warning: {exc.strerror}: this run is not recorded\n")
        return None
    for note in record.notes:
        console.log(f"poprun: warning: {note}\n")
    if started is not None:
        record.phases["plan"] = round(time.monotonic() - started, 6)
    return record


def _to_stderr(console: Console, text: str) -> None:
    """
    Write ``text`` to stderr; a closed or full stderr is no error (nothing more can be said).

    After a stop, through the console: bounded, so that a stderr nobody reads does not hold poprun's exit.
    """
    if console.stops:
        console.final(text)
        return
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(text)
        sys.stderr.flush()
