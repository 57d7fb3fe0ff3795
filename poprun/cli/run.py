"""
Running a plan: the apply step of the CLI.

Layer: ``poprun.cli``. Picks the plan's backend, makes the temporary executable cache, stops
the launch on SIGINT/SIGTERM/SIGHUP (a second one kills; one ignored on entry, as under
``nohup``, stays ignored) or when its stdout or stderr is closed (SIGPIPE semantics: exit
141), passes Ctrl-Z (SIGTSTP) on to the instances, shows progress and log lines
(:mod:`poprun.cli.progress`, :mod:`poprun.cli.log`) and prints the failure report. The
backend only executes the plan; what this module adds to it (the cache path) is added to the
plan first. poprun makes itself a child subreaper here, so that descendants of instances that
leave their process group come back to it and die with the launch
(:mod:`poprun.backends._process.watchdog`).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from types import FrameType

from popdist.env import EXECUTABLE_CACHE_PATH
from poprun.backends._process.files import private_directory, remove_directories
from poprun.backends._process.watchdog import become_subreaper
from poprun.backends.base import (
    ApplyResult,
    Backend,
    Event,
    InstanceEnded,
    InstanceFailure,
    InstanceStarted,
    Launch,
    LaunchError,
    Stream,
    TemporaryCache,
    signal_name,
)
from poprun.backends.registry import BackendRegistry, default_registry
from poprun.cli import exitcode, partition
from poprun.cli.log import Log
from poprun.cli.progress import Console
from poprun.core.diagnostic import Diagnostic, DiagnosticError
from poprun.planner.environment import is_secret
from poprun.planner.plan import LaunchPlan

GRACE_S = 5.0  # between SIGTERM and SIGKILL when poprun is interrupted
CACHE_PREFIX = "poprun-cache-"  # the name of a temporary cache begins so (a name only: removal goes by record)
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


class _Reporter:
    """Turns the backend's events and poprun's own steps into log lines and the status line."""

    def __init__(self, plan: LaunchPlan, verbose: Log, console: Console) -> None:
        self._plan, self.verbose, self._console = plan, verbose, console
        self._running, self._since = 0, time.monotonic()
        self._started = False  # until every instance has started, the status line says "starting"
        self._waited = False
        self._stopping: str | None = None

    def event(self, event: Event) -> None:
        """Log an instance starting or ending; update the status line."""
        instance = self._plan.instances[event.index]
        if isinstance(event, InstanceStarted):
            self._running += 1
            self.verbose.info(f"Instance {event.index} (PID {event.pid}) on {instance.host}: {shlex.join(instance.argv)}")
            if self._running == len(self._plan.instances):
                self._waiting()
        elif isinstance(event, InstanceEnded):
            self._running -= 1
            how = f"exit code {event.exit_code}" if event.signal is None else f"signal {signal_name(event.signal)}"
            self.verbose.info(f"Instance {event.index} (PID {event.pid}) terminated with {how}")
            if event.lost:
                self.stopping(f"host {instance.host} stopped answering")
            elif event.status != 0 and not event.stopped:
                self.stopping(f"instance {event.index} failed")
        self._show()

    def stopping(self, why: str) -> None:
        """Note that the launch is being stopped, and why."""
        if self._stopping is None:
            self._stopping = why
            self.verbose.info(f"Stopping every instance: {why}")
        self._show()

    def starting(self) -> None:
        """Note that the instances are being started."""
        self._show()

    def running(self) -> None:
        """Note that every instance has started."""
        self._since, self._started = time.monotonic(), True
        self._waiting()
        self._show()

    def _waiting(self) -> None:
        """Log that poprun waits, once: when the last instance started, or when launch() returned."""
        if not self._waited:
            self._waited = True
            self.verbose.info("Waiting for instances")

    def _show(self) -> None:
        total = len(self._plan.instances)
        if not self._started:
            self._console.status(f"starting {_plural(total, 'instance')}")
        elif self._stopping is not None:
            self._console.status(f"stopping {_plural(self._running, 'instance')} ({self._stopping})")
        elif self._running == total:
            self._console.status(f"running {_plural(total, 'instance')}", since=self._since)
        else:
            self._console.status(f"running {self._running} of {_plural(total, 'instance')}", since=self._since)


class _Stopped(BaseException):  # like KeyboardInterrupt: it unwinds the steps before the launch
    """A stop signal came before anything was launched (the partition step, the cache)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class _Interrupts:
    """
    What stops a launch: SIGINT, SIGTERM or SIGHUP (a second one kills), or a closed output stream.

    Until the backend has started the launch a stop signal unwinds the steps before it
    (:class:`_Stopped`), the backend's start included (it undoes what it began: a preflight
    waiting on a host that does not answer ends at once); once it has, it stops the launch. A stream whose reader is gone (``poprun ... | head -1``)
    stops the launch as a SIGPIPE would, once; ``signals`` lists what came, SIGPIPE included.
    """

    def __init__(self, reporter: _Reporter) -> None:
        self.signals: list[int] = []
        self.launch: Launch | None = None
        self._reporter = reporter
        self._launching = False
        self._stops = 0  # stop signals received: the second kills

    def __call__(self, signum: int, _frame: FrameType | None) -> None:
        self.signals.append(signum)
        self._stops += 1
        if self.launch is None:  # before the launch, or while the backend starts it (a preflight that waits)
            raise _Stopped(signum)
        self._reporter.stopping(f"received {signal_name(signum)}")
        if self.launch is not None:
            self.launch.terminate(self._grace())

    def broken(self, stream: Stream) -> None:
        """``stream`` has no reader any more: stop the launch, as SIGPIPE stops a tool (from any thread)."""
        if signal.SIGPIPE in self.signals:
            return
        self.signals.append(signal.SIGPIPE)
        self._reporter.stopping(f"{stream} was closed")
        if self.launch is not None:
            self.launch.terminate(GRACE_S)

    def launching(self) -> None:
        """Note that the backend starts launching: from now on a signal stops the launch, not the steps."""
        self._launching = True

    def started(self, launch: Launch) -> None:
        """Remember ``launch``; stop it at once if a signal came while it was starting."""
        self.launch = launch
        if self.signals:
            launch.terminate(self._grace())

    def _grace(self) -> float:
        return GRACE_S if self._stops <= 1 else 0

    def suspend(self, _signum: int, _frame: FrameType | None) -> None:
        """Ctrl-Z (SIGTSTP): stop the instances too, then poprun itself; continue them when poprun continues."""
        forward = getattr(self.launch, "forward", None)  # a LocalLaunch can signal its instances
        if forward is not None:
            forward(signal.SIGTSTP)
        # SIGSTOP, not SIGTSTP: the kernel discards a SIGTSTP to an orphaned process group (poprun
        # started by a script or a service), and the one who sent it wants poprun stopped
        os.kill(os.getpid(), signal.SIGSTOP)  # stops here until SIGCONT
        if forward is not None:
            forward(signal.SIGCONT)


def _handled(sig: int) -> bool:
    """Return whether poprun may take ``sig`` over: not when it was ignored on entry (``nohup``, ``&``)."""
    return signal.getsignal(sig) is not signal.SIG_IGN


@contextlib.contextmanager
def _handling_signals(interrupts: _Interrupts) -> Iterator[_Interrupts]:
    """
    Install ``interrupts`` for SIGINT, SIGTERM, SIGHUP and SIGTSTP while running; restore afterwards.

    A signal that was ignored when poprun started stays ignored, as ``nohup`` and a shell's
    ``&`` expect, and the instances inherit it ignored.
    """
    if threading.current_thread() is not threading.main_thread():
        interrupts.launching()
        yield interrupts
        return
    handlers = dict.fromkeys(_STOP_SIGNALS, interrupts) | {signal.SIGTSTP: interrupts.suspend}
    previous = {sig: signal.signal(sig, handler) for sig, handler in handlers.items() if _handled(sig)}
    try:
        yield interrupts
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def _executable_cache(plan: LaunchPlan) -> Iterator[tuple[LaunchPlan, TemporaryCache | None]]:
    """Yield ``plan`` with its temporary executable cache made (0o700) and set, and the cache; remove it after."""
    if plan.cache.mode != "temporary":
        yield plan, None
        return
    path = private_directory(CACHE_PREFIX)  # owner-only; the backend removes it too (and its watchdog)
    try:
        yield plan.with_variables({EXECUTABLE_CACHE_PATH: path}), TemporaryCache(path=path,
                                                                                  remove_at_exit=plan.cache.remove_at_exit)
    finally:
        if plan.cache.remove_at_exit:
            remove_directories([path])


def _log_plan(plan: LaunchPlan, verbose: Log) -> None:
    verbose.info(f"Running {_plural(len(plan.instances), 'instance')} with the {plan.backend.name} backend")
    if not verbose.debugging:
        return
    cache = plan.instances[0].env.get(EXECUTABLE_CACHE_PATH) if plan.instances else None
    verbose.debug(f"Executable cache: {cache or 'none'} ({plan.cache.mode})")
    for instance in plan.instances:
        values = " ".join(f"{k}={'****' if is_secret(k, plan.mask) else shlex.quote(v)}" for k, v in instance.env.set)
        verbose.debug(f"Instance {instance.index} environment: {values}; forwarded: "
                      f"{', '.join(instance.env.forward) or 'none'}; unset: {', '.join(instance.env.unset) or 'none'}")


def run_plan(plan: LaunchPlan, *, registry: BackendRegistry | None = None,
             env_source: Mapping[str, str] | None = None, subreaper: bool = True,
             console: Console | None = None) -> int:
    """
    Run ``plan`` with its backend; return poprun's exit status (design.md section 3).

    That is the root-cause instance's status (128+N for signal N), 128+N when poprun was
    stopped by signal N (141, SIGPIPE's, when its stdout or stderr was closed), 1 when the
    instances succeeded but their output could not be written, 125 when the backend is
    unavailable or cannot launch, and 126/127 when the program is not executable / not found. With ``subreaper`` (the command line),
    this process becomes a child subreaper (see the module docstring). ``console`` is one the
    caller made earlier (to show ``planning`` on the status line); it is closed here.
    """
    console = console or Console()
    try:
        backend = (registry or default_registry()).get(plan.backend.name)
    except (KeyError, DiagnosticError) as exc:  # UnknownBackendError is both
        console.close()
        _error(str(exc.args[0]) if isinstance(exc, KeyError) else str(exc))
        return exitcode.LAUNCH
    if subreaper:
        become_subreaper()
    reporter = _Reporter(plan, Log(plan.output.verbosity, console.log), console)
    console.on_event = reporter.event
    interrupts = _Interrupts(reporter)
    console.on_broken = interrupts.broken
    environ = os.environ if env_source is None else env_source
    released: list[Diagnostic] = []  # what releasing the partition warns about, told at the very end
    try:
        with _handling_signals(interrupts), partition.acquired(plan, environ, released, status=console.status) \
                as leased, _executable_cache(leased) as (ready, cache):
            result = _apply(backend, ready, env_source, console=console, reporter=reporter, interrupts=interrupts,
                            cache=cache)
    except DiagnosticError as exc:  # the partition could not be had: nothing started
        console.close()
        _diagnose(exc.diagnostics)
        return exitcode.LAUNCH
    except _Stopped as exc:  # before anything started
        console.close()
        _error(f"stopped by {signal_name(exc.signum)}")
        return 128 + exc.signum
    finally:
        console.close()
        _diagnose(tuple(released))
    if isinstance(result, int):
        return result
    return _status(result, interrupts.signals, console.failed)


def _status(result: ApplyResult, signals: list[int], failed: Mapping[Stream, str]) -> int:
    """
    Report how the launch ended; return poprun's status.

    Stopped by a signal with no instance to blame: 128+N (141 when stdout or stderr was
    closed, as for a tool killed by SIGPIPE, without a word: the reader left). The instances'
    status otherwise; 1 when they succeeded but their output could not be written (``failed``).
    """
    if result.root_cause is None and signals:
        if signals[0] != signal.SIGPIPE:
            _error(f"stopped by {signal_name(signals[0])}")
        return 128 + signals[0]
    _report(result)
    if result.status == 0 and failed:
        return exitcode.FAILURE
    return result.status


def _apply(backend: Backend, plan: LaunchPlan, env_source: Mapping[str, str] | None, *, console: Console,
           reporter: _Reporter, interrupts: _Interrupts, cache: TemporaryCache | None = None) -> ApplyResult | int:
    """Launch and wait; return the result, or poprun's status when nothing could start."""
    _log_plan(plan, reporter.verbose)
    reporter.starting()
    interrupts.launching()
    try:
        launch = backend.launch(plan, env_source=os.environ if env_source is None else env_source, sink=console,
                                cache=cache)
    except LaunchError as exc:
        console.close()
        if exc.diagnostics:
            _diagnose(exc.diagnostics)
        else:
            _error(exc.message)
        return exc.status
    interrupts.started(launch)
    reporter.running()
    try:
        return launch.wait()
    except BaseException:
        launch.terminate(0)
        raise


def _diagnose(diagnostics: tuple[Diagnostic, ...]) -> None:
    if diagnostics:
        from poprun.render.diagnostics import render_diagnostics

        _to_stderr(render_diagnostics(diagnostics, {}))


def _error(message: str) -> None:
    _to_stderr(f"poprun: {message}\n")


def _to_stderr(text: str) -> None:
    """Write ``text`` to stderr; a closed or full stderr is no error (nothing more can be said)."""
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(text)
        sys.stderr.flush()


def describe(failure: InstanceFailure) -> str:
    """Return how an instance ended: ``exited with status 3``, ``killed by SIGKILL (...)``."""
    if failure.lost:
        return f"lost: host {failure.host} stopped answering"
    if failure.signal is None:
        text = f"exited with status {failure.exit_code}"
    else:
        text = f"killed by {failure.signal_name}"
        if failure.signal == signal.SIGKILL and not failure.stopped:
            text += " (possibly out of memory)"
    return text + (" (stopped by poprun)" if failure.stopped else "")


def render_failures(result: ApplyResult) -> str:
    """
    Return the failure report, or "" when nothing failed.

    Every failed instance, root cause first, with its host, PID, how it ended and the tail of its
    output; then the root cause again, on the last line.
    """
    if not result.failures:
        return ""
    cause = result.failure(result.root_cause)
    ordered = sorted(result.failures, key=lambda f: f is not cause)  # stable: the rest in the order seen
    lines = [f"poprun: {_plural(len(ordered), 'instance')} failed"]
    for failure in ordered:
        pid = f" (PID {failure.pid})" if failure.pid is not None else ""
        lines.append(f"  instance {failure.index} on {failure.host}{pid}: {describe(failure)}")
        lines.extend(f"    | {line}" for line in failure.tail)
    if cause is not None and cause.lost:
        lines.append(f"Root cause: error[PR411]: host {cause.host} stopped answering (instance {cause.index} ran "
                     "there); every other instance was stopped")
    elif cause is not None:
        lines.append(f"Root cause: instance {cause.index} on {cause.host} {describe(cause)}")
    return "\n".join(lines) + "\n"


def _report(result: ApplyResult) -> None:
    text = render_failures(result)
    if text:
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
        _to_stderr(text)
