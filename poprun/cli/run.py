"""
Running a plan: the apply step of the CLI.

Layer: ``poprun.cli``. Picks the plan's backend, makes the temporary executable cache,
stops the launch on SIGINT/SIGTERM, and prints the failure report. The backend only
executes the plan; what this module adds to it (the cache path) is added to the plan first.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping
from types import FrameType

import attrs

from popdist.env import EXECUTABLE_CACHE_PATH
from poprun.backends.base import ApplyResult, InstanceFailure, Launch, LaunchError, Stream
from poprun.backends.registry import BackendRegistry, default_registry
from poprun.cli import exitcode
from poprun.planner.plan import Instance, LaunchPlan

GRACE_S = 5.0  # between SIGTERM and SIGKILL when poprun is interrupted


class _TerminalSink:
    """Writes forwarded lines to poprun's own stdout and stderr; a closed pipe drops them."""

    def __init__(self) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        self._closed: set[Stream] = set()

    def write(self, stream: Stream, data: bytes) -> None:
        if stream in self._closed:
            return
        target = (sys.stdout if stream == "stdout" else sys.stderr).buffer
        try:
            target.write(data)
            target.flush()
        except BrokenPipeError:
            self._closed.add(stream)


class _Interrupts:
    """A SIGINT/SIGTERM handler: the first stops the launch gracefully, a second kills it."""

    def __init__(self) -> None:
        self.signals: list[int] = []
        self.launch: Launch | None = None

    def __call__(self, signum: int, _frame: FrameType | None) -> None:
        self.signals.append(signum)
        if self.launch is not None:
            self.launch.terminate(GRACE_S if len(self.signals) == 1 else 0)

    def started(self, launch: Launch) -> None:
        """Remember ``launch``; stop it at once if a signal came while it was starting."""
        self.launch = launch
        if self.signals:
            launch.terminate(GRACE_S)


@contextlib.contextmanager
def _handling_signals() -> Iterator[_Interrupts]:
    """Install :class:`_Interrupts` for SIGINT and SIGTERM while running; restore afterwards."""
    interrupts = _Interrupts()
    if threading.current_thread() is not threading.main_thread():
        yield interrupts
        return
    previous = {sig: signal.signal(sig, interrupts) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield interrupts
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _with_env(plan: LaunchPlan, name: str, value: str) -> LaunchPlan:
    """Return ``plan`` with ``name=value`` set in every instance's environment."""

    def evolve(instance: Instance) -> Instance:
        items = dict(instance.env.set) | {name: value}
        return attrs.evolve(instance, env=attrs.evolve(instance.env, set=tuple(sorted(items.items()))))

    return attrs.evolve(plan, instances=tuple(evolve(i) for i in plan.instances))


@contextlib.contextmanager
def _executable_cache(plan: LaunchPlan) -> Iterator[LaunchPlan]:
    """Yield ``plan`` with its temporary executable cache made (0o700) and set; remove it after."""
    if plan.cache.mode != "temporary":
        yield plan
        return
    path = tempfile.mkdtemp(prefix="poprun-cache-")
    try:
        yield _with_env(plan, EXECUTABLE_CACHE_PATH, path)
    finally:
        if plan.cache.remove_at_exit:
            shutil.rmtree(path, ignore_errors=True)


def run_plan(plan: LaunchPlan, *, registry: BackendRegistry | None = None,
             env_source: Mapping[str, str] | None = None) -> int:
    """
    Run ``plan`` with its backend; return poprun's exit status (design.md section 3).

    That is the root-cause instance's status (128+N for signal N), 128+N when poprun was
    stopped by signal N, 125 when the backend is unavailable or cannot launch, and 126/127
    when the program is not executable / not found.
    """
    try:
        backend = (registry or default_registry()).get(plan.backend.name)
    except KeyError as exc:
        _error(str(exc.args[0]))
        return exitcode.LAUNCH
    with _executable_cache(plan) as ready, _handling_signals() as interrupts:
        try:
            launch = backend.launch(ready, env_source=os.environ if env_source is None else env_source,
                                    sink=_TerminalSink())
        except LaunchError as exc:
            _error(exc.message)
            return exc.status
        interrupts.started(launch)
        try:
            result = launch.wait()
        except BaseException:
            launch.terminate(0)
            raise
    if result.root_cause is None and interrupts.signals:
        _error(f"stopped by {signal.Signals(interrupts.signals[0]).name}")
        return 128 + interrupts.signals[0]
    _report(result)
    return result.status


def _error(message: str) -> None:
    sys.stderr.write(f"poprun: {message}\n")
    sys.stderr.flush()


def describe(failure: InstanceFailure) -> str:
    """Return how an instance ended: ``exited with status 3``, ``killed by SIGKILL (...)``."""
    if failure.signal is None:
        text = f"exited with status {failure.exit_code}"
    else:
        text = f"killed by {failure.signal_name}"
        if failure.signal == signal.SIGKILL and not failure.stopped:
            text += " (possibly out of memory)"
    return text + (" (stopped by poprun)" if failure.stopped else "")


def render_failures(result: ApplyResult) -> str:
    """Return the failure report: every failed instance with its output's tail, then the root cause."""
    if not result.failures:
        return ""
    count = len(result.failures)
    lines = [f"poprun: {count} instance{'s' if count > 1 else ''} failed"]
    for failure in result.failures:
        lines.append(f"  instance {failure.index} on {failure.host}: {describe(failure)}")
        lines.extend(f"    | {line}" for line in failure.tail)
    cause = result.failure(result.root_cause)
    if cause is not None:
        lines.append(f"Root cause: instance {cause.index} on {cause.host} {describe(cause)}")
    return "\n".join(lines) + "\n"


def _report(result: ApplyResult) -> None:
    text = render_failures(result)
    if text:
        sys.stdout.flush()
        sys.stderr.write(text)
        sys.stderr.flush()
