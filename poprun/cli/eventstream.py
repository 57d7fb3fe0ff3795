"""
``--events FILE|-|fd:N``: a run's events as JSON lines, live, to a file, standard output or an inherited descriptor.

Layer: ``poprun.cli``. The lines are those of the run record's ``events.jsonl``
(:func:`poprun.runs.record.event_line`; the schema is ``docs/events.schema.json``). The target
is opened before planning, so that a wrong one is a diagnostic (PR113) before anything
starts. Events never wait for their reader: a thread writes them out from a bounded buffer, a
reader that goes away (``EPIPE``) ends the stream, and one that stops reading (a paused
``tail``) or a target that cannot be written any more (a full disk) stops it with one warning:
the run, its exit status and its signals go on as without ``--events``. ``POPRUN_EVENTS`` gives the
target when the command line does not (``poprun apply PLAN.json`` takes no option).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import select
import stat
import threading
import time
from collections.abc import Callable, Mapping

from poprun.core.diagnostic import DiagnosticError, error
from poprun.core.events import Event
from poprun.core.span import SourceSpan
from poprun.core.threads import spawn
from poprun.planner.spec import Sourced

VARIABLE = "POPRUN_EVENTS"
BUFFER = 8 << 20  # bytes of events that wait for a slow reader before it is dropped
DRAIN_S = 5.0  # once the run has ended, a reader that takes nothing for this long is dropped
DRAIN_MAX_S = 30.0  # and one still behind this long after the run ended (a trickle) too
_POLL_S = 0.1  # how often the writer, waiting on a reader, looks whether it should go on

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from poprun.cli.progress import Console


class EventStream:
    """
    Writes each event as one line to ``fd`` (through the console when it is standard output); never blocks its caller.

    Lines wait in a buffer of at most :data:`BUFFER` bytes that a thread of its own writes out
    (started on the first event), so a reader that stops reading holds up neither the run nor
    its signals. A reader that falls :data:`BUFFER` bytes behind, or that takes nothing for
    :data:`DRAIN_S` seconds once the run has ended (:meth:`drain`), is dropped with one warning
    (:attr:`warning`); so is a target that cannot be written any more (a full disk). A reader
    that goes away (``EPIPE``) ends the stream silently.
    """

    def __init__(self, fd: int, name: str, *, owned: bool) -> None:
        self.fd, self.name, self._owned = fd, name, owned
        self.console: Console | None = None  # set when the stream is standard output: its lines stay whole
        self.warning: str | None = None
        self._pending = bytearray()  # written by event(), taken by the writer thread; at most BUFFER bytes
        self._ready = threading.Condition(threading.RLock())  # reentrant: a signal handler may tell of stopping
        self._writer: threading.Thread | None = None
        self._ended = False  # nothing more is written: the reader went away, was dropped, or the stream closed
        self._closing = False  # no more events come: the writer ends once the buffer is empty
        self._progress = 0.0  # (monotonic) when the reader last took something

    def event(self, event: Event) -> None:
        """Queue ``event`` as one JSON line for the writer and return at once; drop a reader too far behind."""
        if self.fd < 0 or self._ended:
            return
        from poprun.runs.record import event_line

        data = event_line(event, time.time()).encode(errors="surrogateescape")
        if self.console is not None:  # between the instances' lines; dropped if stdout takes nothing for a while
            self.console.write_event(data)
            if self.console.events_dropped is not None:
                self.warning, self._ended = self.warning or self.console.events_dropped, True
            return
        with self._ready:
            if self._ended:
                return
            if len(self._pending) + len(data) > BUFFER:
                self._give_up(f"the reader of {self.name} fell more than {BUFFER} bytes behind: the events stop there")
                return
            self._pending += data
            self._ready.notify_all()
            if self._writer is None or not self._writer.is_alive():  # none yet, or not in this process (a fork)
                self._progress = time.monotonic()
                self._writer = spawn(self._write, name="poprun-events")

    def drain(self, *, stop: Callable[[], bool] = lambda: False) -> None:
        """
        Wait until every queued line is written; not past :data:`DRAIN_S` s of an idle reader, :data:`DRAIN_MAX_S` s, or ``stop()``.

        What is left unread then is dropped, with the warning.
        """
        deadline = time.monotonic() + DRAIN_MAX_S
        while True:
            with self._ready:
                self._closing = True
                if self._ended or not self._pending:
                    return
                now = time.monotonic()
                if now >= deadline:
                    self._give_up(f"the reader of {self.name} was still {len(self._pending)} bytes behind "
                                  f"{DRAIN_MAX_S:g} s after the run ended: those events were dropped")
                    return
                idle = now - self._progress
                if idle >= DRAIN_S:
                    self._give_up(f"the reader of {self.name} took nothing for {DRAIN_S:g} s: the last "
                                  f"{len(self._pending)} bytes of events were dropped")
                    return
                if stop():
                    self._give_up(f"poprun was stopped while the reader of {self.name} was {len(self._pending)} bytes "
                                  "behind: those events were dropped")
                    return
                self._ready.wait(min(_POLL_S, DRAIN_S - idle))

    def close(self) -> None:
        """Stop writing; close the target when poprun opened it (the writer does, as it ends, if it still runs)."""
        with self._ready:
            if self._pending:
                self._give_up(f"the reader of {self.name} was {len(self._pending)} bytes behind at the end: those "
                              "events were dropped")
            self._closing = self._ended = True
            self._ready.notify_all()
            if self._writer is None or not self._writer.is_alive():
                self._release()

    def _release(self) -> None:
        """Close the target if poprun opened it (called with the lock held; once)."""
        if self._owned and self.fd >= 0:
            os.close(self.fd)
        self.fd = -1

    def _give_up(self, warning: str) -> None:
        """Write nothing more (called with the lock held); keep the first ``warning``."""
        if not self._ended and self.warning is None:
            self.warning = warning
        self._ended = True
        self._pending.clear()
        self._ready.notify_all()

    def _write(self) -> None:
        """Write the buffer out as the target takes it (the writer thread); end once ended, or closing and empty."""
        try:
            writable = select.poll()  # not select(): a descriptor may be numbered 1024 or more
            writable.register(self.fd, select.POLLOUT)
            while True:
                with self._ready:
                    while not self._pending and not self._ended and not self._closing:
                        self._ready.wait()
                    if self._ended or not self._pending:
                        return
                    chunk, fd = _whole_lines(self._pending), self.fd
                if not writable.poll(_POLL_S * 1000):
                    continue  # not writable yet: look again whether to go on
                written = os.write(fd, chunk)  # whole lines, at most PIPE_BUF bytes when they fit: taken at once
                with self._ready:
                    del self._pending[:written]
                    self._progress = time.monotonic()
                    self._ready.notify_all()
        except (OSError, ValueError) as exc:
            with self._ready:
                if isinstance(exc, OSError) and exc.errno in (errno.EPIPE, errno.ECONNRESET):
                    self._ended = True  # the reader went away: the stream ends, not the run
                    self._pending.clear()
                else:
                    why = getattr(exc, "strerror", None) or exc
                    self._give_up(f"cannot write the events to {self.name} ({why}): they stop there")
        finally:
            with self._ready:
                self._ended = True
                self._ready.notify_all()
                self._release()


def _whole_lines(pending: bytearray) -> bytes:
    """
    Return the first whole lines of ``pending`` that fit in PIPE_BUF bytes (else its first line).

    A pipe takes a write of at most PIPE_BUF bytes at once and whole, never mixed with another
    writer's (``fd:N`` may be a pipe the shell shares: ``3>&1``), so each write ends a line.
    """
    end = pending.rfind(b"\n", 0, select.PIPE_BUF) + 1 or pending.find(b"\n") + 1 or len(pending)
    return bytes(pending[:end])


def open_stream(given: Sourced[str] | None, environ: Mapping[str, str]) -> EventStream | None:
    """
    Return the event stream ``--events`` (or ``POPRUN_EVENTS``) names, opened, or None.

    Raises:
        DiagnosticError: PR113 when the target cannot be opened for writing.
    """
    target = given.value if given is not None else environ.get(VARIABLE, "")
    if not target:
        return None
    span = given.origin if given is not None else SourceSpan.environment(VARIABLE)
    if target == "-":
        return EventStream(1, "standard output", owned=False)
    if target.startswith("fd:"):
        number = target[3:]
        if not number.isdigit() or int(number) < 3:  # noqa: PLR2004 - 0-2 are poprun's own streams
            raise _cannot(target, "fd:N takes an inherited descriptor number of 3 or more", span,
                          "write e.g. --events fd:3 and open it in the shell: 3>events.jsonl")
        try:
            os.fstat(int(number))
            os.set_inheritable(int(number), False)  # noqa: FBT003 - the instances do not inherit the events
            mode = fcntl.fcntl(int(number), fcntl.F_GETFL) & os.O_ACCMODE
        except (OSError, OverflowError) as exc:  # OverflowError: a number no descriptor can have
            why = getattr(exc, "strerror", None) or "Bad file descriptor"
            raise _cannot(target, f"descriptor {number} is not open ({why})", span,
                          f"open it in the shell: {number}>events.jsonl") from exc
        if mode == os.O_RDONLY:
            raise _cannot(target, f"descriptor {number} is open for reading only", span,
                          f"open it for writing in the shell: {number}>events.jsonl")
        return EventStream(int(number), target, owned=False)
    try:  # O_NONBLOCK: a FIFO with no reader is refused, not waited on
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
        os.set_blocking(fd, True)
        _private(fd)
    except OSError as exc:
        why = _why_not(target, exc)
        raise _cannot(target, why, span, "check the directory exists and is writable (or start the FIFO's "
                      "reader first)") from exc
    return EventStream(fd, target, owned=True)


def _why_not(target: str, exc: OSError) -> str:
    """Return why ``target`` cannot be opened for the events: ENXIO is a FIFO with no reader, or a socket."""
    if exc.errno != errno.ENXIO:
        return exc.strerror or str(exc)
    try:
        is_socket = stat.S_ISSOCK(os.stat(target).st_mode)  # pathlib costs start-up
    except OSError:
        is_socket = False
    return "a socket: events go to a file, a FIFO or a descriptor (fd:N)" if is_socket else "a FIFO with no reader"


def _private(fd: int) -> None:
    """Make the opened target 0600 when it is a regular file of this user's (never a device, a FIFO or another's file)."""
    info = os.fstat(fd)
    if stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) != 0o600:  # noqa: PLR2004
        with contextlib.suppress(OSError):  # a file system that keeps its own modes: written as it is
            os.fchmod(fd, 0o600)


def _cannot(target: str, detail: str, span: SourceSpan, hint: str) -> DiagnosticError:
    return DiagnosticError([error("PR113", f"cannot write the events to '{target}'", detail=detail, span=span,
                                  hint=hint)])
