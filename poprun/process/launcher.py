"""
A launch run by one launcher process (``mpirun``, ``srun``) that starts every instance and relays their output.

Layer: ``poprun.process``; imports :mod:`poprun.core.launching` (and the rest of ``poprun.core``), the other ``poprun.process`` modules and ``poprun.planner.plan``.

:class:`LauncherLaunch` is what the mpirun and slurm backends share: one child process in the
group of a :class:`~poprun.process.watchdog.Watchdog`, whose two pipes carry every instance's
output with a label saying whose it is (mpirun's ``[1,N]<stdout>:`` tags, srun's ``N:``
labels). A thread reads both pipes to their end, hands each instance's pieces to the
:class:`~poprun.process.output.Router` and the launcher's own lines to :meth:`_own`, runs
what is due (the kill after the grace period), and at the end makes the
:class:`~poprun.core.outcome.ApplyResult`. A subclass says how to split the output, how to
stop the instances gently and how to kill them, what the launcher's own lines mean, and how
the launch ended; it awaits the launch's gate (:meth:`LauncherLaunch._await_gate`, see
:data:`~poprun.core.launching.Gate`) after telling a failure, before any teardown of its own.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping

from poprun.core.events import Event, InstanceEnded, InstanceStarted
from poprun.core.launching import Gate, OutputSink
from poprun.core.outcome import ApplyResult, InstanceFailure
from poprun.planner.plan import LaunchPlan
from poprun.process.files import remove_directories
from poprun.process.instance import helper_failed, start_supervising
from poprun.process.output import Router
from poprun.process.watchdog import Watchdog, WatchdogError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from typing import Protocol

    from poprun.core.launching import Stream

    Piece = tuple[int | None, Stream, bytes]

    class Splitter(Protocol):
        """Labelled output in, (instance or None, stream, bytes) pieces out."""

        def feed(self, chunk: bytes) -> list[Piece]:
            """Return the pieces that ``chunk`` completes."""

        def end(self) -> list[Piece]:
            """Return what is left at the end of the stream."""

_READ = 1 << 18  # bytes read from a pipe at once


def start_launcher(argv: tuple[str, ...], *, env: Mapping[str, str], group_env: Mapping[str, str],
                   remove: tuple[str, ...], router: Router, cleanup: tuple[str, ...] = (),
                   executable: str | None = None, stdin: int | None = None) -> tuple[subprocess.Popen[bytes], Watchdog]:
    """
    Start the launcher ``argv`` with ``env`` in the group of a new watchdog (which removes ``remove`` should poprun die).

    ``executable``, when given, is the file run, ``argv[0]`` then being only the name the
    launcher sees itself called by. ``stdin``: the descriptor the launcher reads as its
    standard input (poprun's, from :func:`~poprun.process.instance.forwarded_stdin`,
    which the launcher passes on to instance 0 alone: mpirun's ``--stdin`` default, srun's
    ``--input=0``); None: ``/dev/null``.

    Raises:
        LaunchError: when the watchdog or the launcher cannot start; then nothing is left: the
            router is closed and the directories ``cleanup`` are removed.
    """
    try:
        watchdog = Watchdog(remove=remove, env=group_env)
    except WatchdogError as exc:
        router.close()
        remove_directories(list(cleanup))
        raise helper_failed(exc, "the watchdog") from exc
    try:
        proc = subprocess.Popen(argv, executable=executable, stdout=subprocess.PIPE,  # noqa: S603 - the plan's
                                stdin=subprocess.DEVNULL if stdin is None else stdin,
                                stderr=subprocess.PIPE, env=dict(env), process_group=watchdog.group)
        watchdog.await_ready()
    except (OSError, WatchdogError) as exc:
        watchdog.close()
        router.close()
        remove_directories(list(cleanup))
        name = os.path.basename(argv[0])
        raise helper_failed(exc, name, f"cannot start {name}: {exc.strerror}") from exc
    return proc, watchdog


class LauncherLaunch:
    """The running launcher of one plan; see :class:`~poprun.backends.base.Launch` and the module docstring."""

    thread_name = "poprun-launcher"

    def __init__(self, plan: LaunchPlan, proc: subprocess.Popen[bytes], *, watchdog: Watchdog, router: Router,
                 sink: OutputSink, grace_s: float, remove: tuple[str, ...] = (), gate: Gate | None = None) -> None:
        self._plan, self._proc, self._watchdog, self._router, self._sink = plan, proc, watchdog, router, sink
        self._grace_s, self._remove, self._gate = grace_s, remove, gate
        self._notify: Callable[[Event], None] | None = getattr(sink, "event", None)
        self._lock = threading.RLock()
        self._stopping = self._finished = False
        self._kill_at: float | None = None
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._done = threading.Event()
        self._result: ApplyResult | None = None
        self._error: BaseException | None = None
        self._open_pipes = 2  # the launcher's pipes not at their end yet
        start_supervising(threading.Thread(target=self._run, name=self.thread_name, daemon=True),
                          self._announce, self._abort)

    def _announce(self) -> None:
        for instance in self._plan.instances:
            self._event(InstanceStarted(index=instance.index, pid=self._proc.pid))

    def _abort(self) -> None:
        """Stop everything at once and wait for the clean-up (the launch was interrupted as it started)."""
        self.terminate(0)
        self._done.wait()

    # -- the protocol ------------------------------------------------------------------
    def terminate(self, grace_s: float) -> None:
        """Stop every instance gently now, kill them after ``grace_s``; at once with 0; nothing once ended."""
        with self._lock:
            if self._finished:
                return
            first, self._stopping = not self._stopping, True
            if grace_s <= 0:
                self._kill_at = None
                self._kill()
            elif first:
                self._stop_gently()
                self._kill_at = time.monotonic() + grace_s
            with contextlib.suppress(BlockingIOError, OSError):
                os.write(self._wake_w, b"!")

    def forward(self, sig: int) -> None:
        """
        Send ``sig`` to the launcher (``mpirun``, ``srun``), which passes it on to every instance; nothing once ended.

        OpenMPI's mpirun forwards SIGUSR1 and SIGUSR2 to its ranks, and srun most signals to the
        tasks of its step: ``--signal SIG@SECONDS`` reaches the instances. Job control (SIGTSTP,
        SIGCONT: Ctrl-Z) is left to the launchers' own terminal handling, as before.
        """
        if sig in (signal.SIGTSTP, signal.SIGCONT):
            return
        with self._lock:
            if not self._finished:
                with contextlib.suppress(ProcessLookupError):
                    self._proc.send_signal(sig)

    def wait(self) -> ApplyResult:
        """Return once the launcher has ended and its output is forwarded."""
        self._done.wait()
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    # -- what a subclass says ----------------------------------------------------------
    def _splitter(self, stream: Stream) -> Splitter:
        raise NotImplementedError

    def _stop_gently(self) -> None:
        """Ask every instance to stop (SIGTERM); called with the lock held, maybe from a signal handler."""
        with contextlib.suppress(ProcessLookupError):
            self._proc.send_signal(signal.SIGTERM)

    def _kill(self) -> None:
        """Kill everything of the launch now; called with the lock held."""
        self._watchdog.signal(signal.SIGKILL)

    def _timeout(self) -> float | None:
        """Return how long the reading thread may wait before something is due (None: until output comes)."""
        return None if self._kill_at is None else max(0.0, self._kill_at - time.monotonic())

    def _due(self) -> None:
        """Do what is due now (the reading thread): the kill once the grace period is over."""
        if self._kill_at is not None and time.monotonic() >= self._kill_at:
            self.terminate(0)

    def _own(self, stream: Stream, data: bytes) -> None:
        """Take the launcher's own lines (no instance's label): passed on as they are."""
        self._router.flush()
        self._sink.write(stream, data)

    def _make_result(self, code: int, *, stopped: bool) -> ApplyResult:
        raise NotImplementedError

    # -- the reading thread ------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._forward()
            code = self._proc.wait()
            with self._lock:
                self._finished = True
                stopped = self._stopping
            self._watchdog.close()
            remove_directories(list(self._remove))
            self._result = self._make_result(code, stopped=stopped)
        except BaseException as exc:  # noqa: BLE001 - a bug: kill everything, and let wait() raise it
            self._error = exc
            with self._lock:
                self._finished = True
            self._watchdog.close()
        finally:
            self._router.close()
            os.close(self._wake_r)
            os.close(self._wake_w)
            self._done.set()

    def _forward(self) -> None:
        """Read the launcher's pipes to their end, passing each piece on; do what is due between reads."""
        splitters = {"stdout": self._splitter("stdout"), "stderr": self._splitter("stderr")}
        with selectors.DefaultSelector() as selector:
            selector.register(self._wake_r, selectors.EVENT_READ, None)
            for stream, pipe in (("stdout", self._proc.stdout), ("stderr", self._proc.stderr)):
                assert pipe is not None
                os.set_blocking(pipe.fileno(), False)
                selector.register(pipe, selectors.EVENT_READ, stream)
            self._open_pipes = 2
            self._attach(selector)
            while self._open_pipes or self._busy():
                for key, _ in selector.select(self._timeout()):
                    if key.data is None:
                        with contextlib.suppress(BlockingIOError):
                            os.read(self._wake_r, 4096)
                    elif callable(key.data):
                        key.data(key.fd)
                    else:
                        self._read(key, splitters[key.data], selector)
                self._router.flush()
                self._due()
            self._detach()
        for splitter in splitters.values():
            self._pass_on(splitter.end())
        self._router.flush()

    def _attach(self, selector: selectors.BaseSelector) -> None:
        """Register more sources of output with ``selector`` (their data: a callable taking the descriptor)."""

    def _busy(self) -> bool:
        """Return whether to go on reading once the launcher's pipes are closed."""
        return False

    def _detach(self) -> None:
        """Close what :meth:`_attach` registered: reading is over."""

    def _read(self, key: selectors.SelectorKey, splitter: Splitter, selector: selectors.BaseSelector) -> None:
        try:
            chunk = os.read(key.fd, _READ)
        except BlockingIOError:
            return
        if chunk:
            self._pass_on(splitter.feed(chunk))
            return
        selector.unregister(key.fileobj)
        key.fileobj.close()  # type: ignore[union-attr]
        self._open_pipes -= 1

    def _pass_on(self, pieces: list[Piece]) -> None:
        for index, stream, data in pieces:
            if index is not None and 0 <= index < len(self._plan.instances):
                self._router.feed(index, stream, data)
            else:
                self._own(stream, data)

    def _await_gate(self) -> None:
        """Await the launch's gate (after a failure was told, before a teardown): this thread waits, never the sink."""
        if self._gate is not None:
            self._gate()

    def _event(self, event: Event) -> None:
        if self._notify is not None:
            self._router.flush()
            self._notify(event)

    def _result_of(self, ends: list[InstanceEnded]) -> ApplyResult:
        """Return the result of every instance's end, in the order seen: the first failure not caused by a stop is the root cause."""
        failures = tuple(InstanceFailure(index=e.index, host=self._plan.instances[e.index].host, pid=None,
                                         exit_code=e.exit_code, signal=e.signal, stopped=e.stopped,
                                         tail=self._router.tail(e.index)) for e in ends if e.status != 0)
        statuses = tuple(e.status for e in sorted(ends, key=lambda e: e.index))
        cause = next((f.index for f in failures if not f.stopped), None)
        return ApplyResult(statuses=statuses, failures=failures, root_cause=cause)
