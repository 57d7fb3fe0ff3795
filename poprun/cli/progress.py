"""
poprun's console while a launch runs: forwarded output, log lines and a live status line.

Layer: ``poprun.cli``; imports :mod:`poprun.backends.base` (the sink protocol and its events).

:class:`Console` is the output sink the backend writes to (from its one thread), and the place
log lines and the status line go (from the main thread and a ticker thread); a reentrant lock
keeps every write whole. Output is written straight to file descriptors 1 and 2 (``os.write``,
no Python buffering: the backend already hands over large batches of whole lines).

On a terminal (stderr is a tty and ``TERM`` is not ``dumb``) a status line lives on stderr:
``poprun: running 4 instances for 12 s``. It is drawn as ``CR`` + text + ``ESC[K``, cleared with
``CR ESC[K`` before anything else is written to either stream, and at the end, and redrawn
by the ticker at most :data:`REDRAW_S` apart. When stderr is not a terminal, none of it is ever
written (changelog 2.0). A command may make the console before planning, show ``planning``
with :meth:`Console.status`, and hand it to :func:`poprun.cli.run.run_plan`.

A stream whose reader is gone (``EPIPE``: ``poprun ... | head -1``) is dropped and
``on_broken`` hears of it once, so that the launch can be stopped as a tool that SIGPIPE kills
would be. A stream that fails otherwise (``ENOSPC``: stdout on a full disk, ``EIO``) is dropped
with a one-line warning on stderr (while it works); :attr:`Console.failed` keeps why, so that
the exit status can say the output was lost.
"""

from __future__ import annotations

import errno
import os
import select
import sys
import threading
import time
from collections.abc import Callable

from poprun.backends.base import Event, Stream

REDRAW_S = 0.25  # the status line is redrawn at most this often
_CLEAR = b"\r\x1b[K"
_FDS: dict[Stream, int] = {"stdout": 1, "stderr": 2}
_GONE = (errno.EPIPE, errno.ECONNRESET)  # nobody reads the stream any more


def status_wanted() -> bool:
    """Return whether a status line belongs on stderr: it is a terminal, and not a dumb one."""
    try:
        return os.isatty(2) and os.environ.get("TERM", "") != "dumb"
    except OSError:
        return False


class Console:
    """
    poprun's stdout and stderr during a launch; an :class:`~poprun.backends.base.EventSink`.

    ``status`` None decides by :func:`status_wanted`. ``on_event`` hears the backend's events.
    A stream that is closed (a broken pipe) is dropped and ``on_broken`` is told, once per
    stream; one that fails otherwise (a full disk) is dropped with a warning, and ``failed``
    maps it to why. Neither is an error.
    """

    def __init__(self, *, status: bool | None = None, on_event: Callable[[Event], None] | None = None) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        self.on_event = on_event
        self.on_broken: Callable[[Stream], None] | None = None
        self.failed: dict[Stream, str] = {}  # stream -> why it could not be written (not a broken pipe)
        self._broken: list[Stream] = []  # streams found broken, not yet told to on_broken
        self._lock = threading.RLock()  # reentrant: a signal handler may log while the main thread writes
        self._closed: set[Stream] = set()
        self._midline: set[Stream] = set()  # streams where an instance's long line has begun and not ended
        self._enabled = status_wanted() if status is None else status
        self._stdout_on_terminal = self._enabled and os.isatty(1)  # else stdout output cannot disturb the line
        self._text, self._since = "", None  # type: tuple[str, float | None]
        self._shown, self._drawn_at, self._drawn = False, 0.0, ""
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def write(self, stream: Stream, data: bytes) -> None:
        """Write whole lines of forwarded output, after clearing the status line where it is in the way."""
        with self._lock:
            if stream == "stderr" or self._stdout_on_terminal:
                self._clear()
            self._write(stream, data)
            if data.endswith(b"\n"):
                self._midline.discard(stream)
            elif data:
                self._midline.add(stream)  # a long line passes in parts: no status line until it ends
        self._tell_broken()

    def event(self, event: Event) -> None:
        """Pass a backend event on to ``on_event``."""
        if self.on_event is not None:
            self.on_event(event)

    def log(self, line: str) -> None:
        """Write one line (with its newline) to stderr, after clearing the status line (on a line of its own)."""
        with self._lock:
            data = line.encode(errors="replace")
            self.write("stderr", b"\n" + data if "stderr" in self._midline else data)

    def status(self, text: str, *, since: float | None = None) -> None:
        """Show ``text`` on the status line, followed by `` for T s`` counted from ``since`` (monotonic)."""
        if not self._enabled:
            return
        with self._lock:
            self._text, self._since = text, since
            if not self._shown or time.monotonic() - self._drawn_at >= REDRAW_S:
                self._draw()
        self._tell_broken()
        if self._ticker is None:
            self._ticker = threading.Thread(target=self._tick, name="poprun-status", daemon=True)
            self._ticker.start()

    def close(self) -> None:
        """Stop the ticker and clear the status line for good."""
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
        with self._lock:
            self._clear()
            self._enabled = False

    def _tick(self) -> None:
        while not self._stop.wait(REDRAW_S):
            with self._lock:
                if self._enabled and (not self._shown or self._line() != self._drawn):
                    self._draw()
            self._tell_broken()

    def _line(self) -> str:
        text = f"poprun: {self._text}"
        if self._since is not None:
            text += f" for {int(time.monotonic() - self._since)} s"
        try:
            width = os.get_terminal_size(2).columns or 80  # a new pty says 0
        except OSError:
            width = 80
        return text[: max(width - 1, 0)]  # never wrap: \r would not reach the first row

    def _draw(self) -> None:
        if not self._enabled or "stderr" in self._closed or "stderr" in self._midline \
                or (self._stdout_on_terminal and "stdout" in self._midline):
            return
        self._drawn = self._line()
        self._write("stderr", b"\r" + self._drawn.encode(errors="replace") + b"\x1b[K")
        self._shown, self._drawn_at = True, time.monotonic()

    def _clear(self) -> None:
        if self._shown:
            self._shown = False
            self._write("stderr", _CLEAR)

    def _write(self, stream: Stream, data: bytes) -> None:
        if stream in self._closed:
            return
        fd, view = _FDS[stream], memoryview(data)
        try:
            while view:
                try:
                    view = view[os.write(fd, view):]
                except BlockingIOError:  # an inherited non-blocking descriptor: wait until writable
                    select.select([], [fd], [])
        except OSError as exc:
            self._closed.add(stream)
            self._lost(stream, exc)

    def _tell_broken(self) -> None:
        """Tell ``on_broken`` of each stream found broken, outside the lock (from whichever thread comes first)."""
        while True:
            try:
                stream = self._broken.pop(0)  # atomic: two threads never both take one
            except IndexError:
                return
            if self.on_broken is not None:
                self.on_broken(stream)

    def _lost(self, stream: Stream, exc: OSError) -> None:
        """``stream`` cannot be written any more: tell ``on_broken``, or warn on stderr."""
        if exc.errno in _GONE:
            self._broken.append(stream)  # told once the lock is released: the listener takes locks of its own
            return
        self.failed[stream] = why = exc.strerror or str(exc)
        if stream == "stdout":
            self._clear()
            self._write("stderr", f"poprun: warning: cannot write to stdout ({why}): the rest of the "
                                  "instances' output to it is lost\n".encode(errors="replace"))
