"""
Running a short POSIX sh script through a command that reads it on its standard input.

Layer: ``poprun.process``; the standard library and :mod:`poprun.core.exitstatus` (and, on a failure,
:mod:`poprun.process.instance` for its diagnostic). The shared half of every
built-in backend's :meth:`~poprun.backends.base.HostCommands.run_on_host`: ``/bin/sh -s`` here,
or ``ssh ... sh -s`` / ``srun ... sh -s`` there. The script is written to the command's
standard input (never its argv, which ``ps`` shows), wrapped in ``{ ...; } </dev/null`` so that a
command of the script that reads its standard input cannot swallow the rest of the script.
Its standard output is kept up to :data:`MAX_OUTPUT` bytes (more is read and dropped, so the
script never blocks on a full pipe); after ``timeout_s`` the command's whole process group is
killed and the status is :data:`TIMED_OUT`.

A caller that must end such scripts early from another thread (poprun stopped while health
checks run on every host) runs them inside a :class:`Scope` (:func:`scope`): :meth:`Scope.cancel`
sends SIGTERM to the process group of every command running in it (the local ``sh``, an ``ssh``
or ``srun`` client), gives it :data:`CANCEL_GRACE_S` to end (a host-side script that traps TERM
cleans up), then SIGKILL; :func:`run_script` then raises :class:`CancelledError`. The protocol's
``run_on_host`` keeps its signature: the scope is the calling thread's.
"""

from __future__ import annotations

import contextlib
import math
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping, Sequence

from poprun.core.exitstatus import TIMED_OUT  # timeout(1)'s status

MAX_OUTPUT = 1 << 20  # bytes of standard output kept (HostCommands' promise)
MAX_ERROR = 1 << 14  # bytes of the command's own standard error kept (ssh's or srun's words)
LOCAL_SHELL = ("/bin/sh", "-s")
CANCEL_GRACE_S = 1.0  # after SIGTERM, how long a cancelled command has to end before SIGKILL
_TICK_S = 0.1  # how often a running script looks whether its scope was cancelled

__all__ = ["CANCEL_GRACE_S", "LOCAL_SHELL", "MAX_OUTPUT", "TIMED_OUT", "CancelledError", "Scope", "bounded_shell",
           "run_here", "run_script", "scope"]


class CancelledError(Exception):
    """A script's command was ended because its :class:`Scope` was cancelled (nothing of it is left here)."""


class Scope:
    """
    Commands started by :func:`run_script` in the threads that entered this scope, which :meth:`cancel` ends.

    Thread-safe. A command started after :meth:`cancel` is ended at once.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[subprocess.Popen[bytes]] = set()
        self.cancelled = False

    def cancel(self) -> None:
        """Send SIGTERM to the process group of every command running in the scope; :func:`run_script` does the rest."""
        with self._lock:
            self.cancelled = True
            running = list(self._running)
        for proc in running:
            _signal_group(proc, signal.SIGTERM)

    def _add(self, proc: subprocess.Popen[bytes]) -> None:
        with self._lock:
            self._running.add(proc)
            cancelled = self.cancelled
        if cancelled:
            _signal_group(proc, signal.SIGTERM)

    def _remove(self, proc: subprocess.Popen[bytes]) -> None:
        with self._lock:
            self._running.discard(proc)


_CURRENT = threading.local()  # .scope: the Scope the calling thread runs its scripts in (none: not cancellable)


@contextlib.contextmanager
def scope(cancel: Scope) -> Iterator[Scope]:
    """Run the calling thread's scripts (:func:`run_script`, through any backend's ``run_on_host``) in ``cancel``."""
    before = getattr(_CURRENT, "scope", None)
    _CURRENT.scope = cancel
    try:
        yield cancel
    finally:
        _CURRENT.scope = before


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    if proc.returncode is None:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, sig)  # its own session: the group id is its pid until it is reaped


def wrapped(script: str) -> bytes:
    """Return ``script`` as it is written to ``sh -s``: one compound command whose input is /dev/null."""
    return ("{\n" + script.rstrip("\n") + "\n} </dev/null\n").encode(errors="surrogateescape")  # argv's own bytes


def bounded_shell(timeout_s: float) -> str:
    """
    Return shell text for another host: ``sh -s`` killed after ``timeout_s`` (and a second) there, its stderr dropped.

    The host bounds the script itself (``timeout``, of coreutils, when it has it), so that a
    script whose connection was cut here does not run on there for ever. Holds no value, only a number.
    """
    seconds = max(1, math.ceil(timeout_s)) + 1
    return (f"if command -v timeout >/dev/null 2>&1; then exec timeout -s KILL {seconds} sh -s 2>/dev/null; "
            "else exec sh -s 2>/dev/null; fi")


def run_script(argv: Sequence[str], script: str, *, env: Mapping[str, str], timeout_s: float,
               keep_stderr: bool = False) -> tuple[int, bytes, bytes]:
    """
    Run ``argv`` with ``script`` on its standard input; return its status, standard output and standard error.

    Standard error is kept (up to :data:`MAX_ERROR` bytes) only with ``keep_stderr`` (the words
    of ssh or srun, not the script's); otherwise it is dropped. After ``timeout_s`` the command's
    process group (a session of its own) is killed: status :data:`TIMED_OUT`.

    Raises:
        OSError: when ``argv`` cannot be started.
        CancelledError: when the calling thread's :class:`Scope` was cancelled meanwhile.
    """
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,  # noqa: S603 - the caller's command
                            stderr=subprocess.PIPE if keep_stderr else subprocess.DEVNULL, env=dict(env),
                            start_new_session=True)
    within: Scope | None = getattr(_CURRENT, "scope", None)
    if within is not None:
        within._add(proc)  # noqa: SLF001 - the scope's own module
    try:
        out, err, late = _pump(proc, wrapped(script), time.monotonic() + timeout_s, within)
    except BaseException:  # an interrupt (poprun stopped while it waits): nothing of the command is left
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    finally:
        if within is not None:
            within._remove(proc)  # noqa: SLF001 - the scope's own module
    if within is not None and within.cancelled:
        _end(proc)
        raise CancelledError
    if late:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return TIMED_OUT, out, err
    try:
        return proc.wait(max(0.1, timeout_s)), out, err  # its outputs ended: it is ending
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return TIMED_OUT, out, err


def _end(proc: subprocess.Popen[bytes]) -> None:
    """End ``proc``'s group: SIGTERM, :data:`CANCEL_GRACE_S` to go (a script's trap cleans up), then SIGKILL; reap it."""
    _signal_group(proc, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(CANCEL_GRACE_S)
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)  # what is left of its group (the leader may be gone: its pid is not reused yet)
    proc.wait()


def _pump(proc: subprocess.Popen[bytes], data: bytes, deadline: float,
          within: Scope | None = None) -> tuple[bytes, bytes, bool]:
    """Write ``data`` to ``proc``'s input and read its outputs until both end (or ``within`` is cancelled); return them and whether time ran out."""
    assert proc.stdin is not None
    assert proc.stdout is not None
    out, err = proc.stdout.fileno(), proc.stderr.fileno() if proc.stderr is not None else -1
    kept = {out: bytearray(), err: bytearray()}
    limits = {out: MAX_OUTPUT, err: MAX_ERROR}
    view, stdin, late = memoryview(data), proc.stdin.fileno(), False
    with selectors.DefaultSelector() as selector:
        for fd in (out, err):
            if fd >= 0:
                selector.register(fd, selectors.EVENT_READ)
        os.set_blocking(stdin, False)
        selector.register(stdin, selectors.EVENT_WRITE)
        while selector.get_map() and not late and not (within is not None and within.cancelled):
            left = deadline - time.monotonic()
            late = left <= 0
            wait = max(0.0, left) if within is None else min(max(0.0, left), _TICK_S)
            for key, _ in selector.select(wait):
                if key.fd == stdin:
                    view = _write(proc, selector, view)
                    continue
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    selector.unregister(key.fd)
                    continue
                kept[key.fd] += chunk[:max(0, limits[key.fd] - len(kept[key.fd]))]
    _close(proc)
    return bytes(kept[out]), bytes(kept[err]), late


def _write(proc: subprocess.Popen[bytes], selector: selectors.BaseSelector, view: memoryview) -> memoryview:
    """Write what the pipe takes of ``view``; close the input once all is written, or the command is gone."""
    assert proc.stdin is not None
    stdin = proc.stdin.fileno()
    try:
        view = view[os.write(stdin, view[:65536]):]
    except BlockingIOError:
        return view
    except OSError:  # the command ended without reading it all: its status says why
        view = view[len(view):]
    if not view:
        selector.unregister(stdin)
        with contextlib.suppress(OSError):
            proc.stdin.close()
    return view


def _close(proc: subprocess.Popen[bytes]) -> None:
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()


def run_here(script: str, *, environ: Mapping[str, str], timeout_s: float) -> tuple[int, bytes]:
    """
    Run ``script`` with ``/bin/sh -s`` on this machine; return its status and standard output (stderr dropped).

    Raises:
        LaunchError: when ``/bin/sh`` cannot be started.
    """
    try:
        status, out, _ = run_script(LOCAL_SHELL, script, env=environ, timeout_s=timeout_s)
    except OSError as exc:
        from poprun.process.instance import helper_failed

        raise helper_failed(exc, "/bin/sh", f"cannot run /bin/sh here: {exc.strerror}") from exc
    return status, out
