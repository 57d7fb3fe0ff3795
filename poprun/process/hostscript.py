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

A caller may cancel the commands its thread runs (a stop while health checks run on many hosts):
within :func:`cancelled_by`, once the event is set, the command's process group is sent SIGHUP
(a script's traps clean up; a closed ssh session ends the remote script at its next write) and,
a moment later, SIGKILL; the status is :data:`TIMED_OUT`. The event travels in the thread's
context (a :class:`~contextvars.ContextVar`), so no backend's ``run_on_host`` has to pass it on.
"""

from __future__ import annotations

import contextlib
import math
import os
import selectors
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from contextvars import ContextVar

from poprun.core.exitstatus import TIMED_OUT  # timeout(1)'s status

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    import threading
    from collections.abc import Iterator

MAX_OUTPUT = 1 << 20  # bytes of standard output kept (HostCommands' promise)
MAX_ERROR = 1 << 14  # bytes of the command's own standard error kept (ssh's or srun's words)
LOCAL_SHELL = ("/bin/sh", "-s")

__all__ = ["LOCAL_SHELL", "MAX_OUTPUT", "TIMED_OUT", "bounded_shell", "cancelled_by", "run_here", "run_script"]

_CANCEL: ContextVar[threading.Event | None] = ContextVar("poprun_host_command_cancel", default=None)
_HANGUP_GRACE_S = 2.0  # between SIGHUP and SIGKILL of a cancelled command (its traps clean up)
_POLL_S = 0.1  # how often a cancellable command's wait looks at its event


@contextlib.contextmanager
def cancelled_by(event: threading.Event) -> Iterator[None]:
    """Within this block, the commands this thread runs (:func:`run_script`) end once ``event`` is set."""
    token = _CANCEL.set(event)
    try:
        yield
    finally:
        _CANCEL.reset(token)


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
    """
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,  # noqa: S603 - the caller's command
                            stderr=subprocess.PIPE if keep_stderr else subprocess.DEVNULL, env=dict(env),
                            start_new_session=True)
    cancel = _CANCEL.get()
    try:
        out, err, late = _pump(proc, wrapped(script), time.monotonic() + timeout_s, cancel)
    except BaseException:  # an interrupt (poprun stopped while it waits): nothing of the command is left
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    if cancel is not None and cancel.is_set():
        _hang_up(proc)
        return TIMED_OUT, out, err
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


def _hang_up(proc: subprocess.Popen[bytes]) -> None:
    """End a cancelled command: SIGHUP to its process group, SIGKILL if it is still there a moment later."""
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGHUP)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(_HANGUP_GRACE_S)
    with contextlib.suppress(OSError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def _pump(proc: subprocess.Popen[bytes], data: bytes, deadline: float,
          cancel: threading.Event | None = None) -> tuple[bytes, bytes, bool]:
    """Write ``data`` to ``proc``'s input and read its outputs until both end (or ``cancel``); return them and whether time ran out."""
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
        while selector.get_map() and not late and not (cancel is not None and cancel.is_set()):
            left = deadline - time.monotonic()
            late = left <= 0
            for key, _ in selector.select(max(0.0, min(left, _POLL_S) if cancel is not None else left)):
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
