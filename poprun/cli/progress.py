"""
poprun's console while a launch runs: forwarded output, log lines and a live status line.

Layer: ``poprun.cli``; imports :mod:`poprun.backends.base` (the sink protocol and its events), and
:mod:`poprun.render.runs` when a run reports progress (:class:`ProgressLine`).

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

A reader that is merely slow holds the writer up (the instances wait for it: no line is lost),
but never poprun's signals: a stop (:meth:`Console.stopped`, called first by the signal
handler, taking no lock) bounds every write from then on. A stream that takes nothing for
:data:`STALL_S` seconds after a stop (at once after a second stop) is abandoned for the rest of
the run, with a warning on stderr where stderr still works, so the stop reaches the instances
and poprun exits with its status even while nobody reads its output.

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
import stat
import sys
import threading
import time
from collections.abc import Callable

from poprun.backends.base import Event, Stream
from poprun.core.threads import spawn

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from poprun.core.events import InstanceProgressed

REDRAW_S = 0.25  # the status line is redrawn at most this often
STALL_S = 5.0  # after a stop, a stream that takes nothing for this long is abandoned
EVENTS_HELD = 8 << 20  # bytes of event lines held for stdout while an instance's long line passes there
_POLL_MS = 100  # how often a blocked write looks whether a stop has come
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
        self._stops: list[float] = []  # (monotonic) when each stop came: appended without a lock (a signal handler)
        self.abandoned: set[Stream] = set()  # streams that took nothing for STALL_S s after a stop
        self._held = bytearray()  # event lines for stdout, held while an instance's long line passes there
        self.events_dropped: str | None = None  # why the event lines on stdout stopped (a reader too slow)
        self._direct = {stream: _never_blocks(fd) for stream, fd in _FDS.items()}

    def stopped(self) -> None:
        """
        Bound every write from now on, a stop having come (SIGINT, SIGTERM, SIGHUP); safe in a signal handler.

        Takes no lock, so that it never waits on a writer that a stalled reader holds up.
        """
        self._stops.append(time.monotonic())

    def write(self, stream: Stream, data: bytes) -> None:
        """Write whole lines of forwarded output, after clearing the status line where it is in the way."""
        with self._lock:
            if stream == "stderr" or self._stdout_on_terminal:
                self._clear()
            self._write(stream, data)
            if data.endswith(b"\n"):
                self._midline.discard(stream)
                if stream == "stdout" and self._held:  # the long line has ended: the events held behind it
                    held, self._held = bytes(self._held), bytearray()
                    self._write_events(held)
            elif data:
                self._midline.add(stream)  # a long line passes in parts: no status line until it ends
        self._tell_broken()

    def write_event(self, data: bytes) -> None:
        """
        Write event lines (``--events -``) to stdout, between the instances' lines, never inside one.

        Events are held while an instance's long line passes (at most :data:`EVENTS_HELD` bytes);
        unlike the instances' output they may be dropped: a stdout that takes nothing for
        :data:`STALL_S` s during an event's write, or too many held, ends the events there
        (:attr:`events_dropped`), and the run goes on.
        """
        with self._lock:
            if self.events_dropped is not None:
                return
            if "stdout" in self._midline:
                if len(self._held) + len(data) > EVENTS_HELD:
                    self.events_dropped = (f"more than {EVENTS_HELD} bytes of events waited on stdout behind an "
                                           "instance's long line: the events stop there")
                    self._held.clear()
                    return
                self._held += data
                return
            self._write_events(data)
        self._tell_broken()

    def _write_events(self, data: bytes) -> None:
        if self._write("stdout", data, bound_s=STALL_S) is False:
            self.events_dropped = f"stdout took nothing for {STALL_S:g} s: the events on it stop there"

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
            self._ticker = spawn(self._tick, name="poprun-status")

    @property
    def stops(self) -> int:
        """Return how many stops have come (:meth:`stopped`)."""
        return len(self._stops)

    def final(self, text: str) -> None:
        """Write ``text`` to stderr once the run has ended (its outcome), bounded after a stop as every write is."""
        with self._lock:
            self._clear()
            self._write("stderr", text.encode(errors="replace"))

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

    def _write(self, stream: Stream, data: bytes, *, bound_s: float | None = None) -> bool | None:
        """Write ``data`` to ``stream``; with ``bound_s``, return False (nothing written) if it takes nothing that long."""
        if stream in self._closed:
            return None
        fd, view = _FDS[stream], memoryview(data)
        try:
            if self._direct[stream]:  # a regular file or a block device: a write never waits on a reader
                while view:
                    view = view[os.write(fd, view):]
                return None
            writable = select.poll()  # not select(): the descriptor is 1 or 2, but poll() is what waits with a bound
            writable.register(fd, select.POLLOUT)
            taken = time.monotonic()
            while view:
                if not writable.poll(_POLL_MS):
                    if self._stalled(taken):
                        self._abandon(stream)
                        return None
                    if bound_s is not None and len(view) == len(data) and time.monotonic() - taken >= bound_s:
                        return False  # nothing of it written: the line can be left out whole
                    continue
                try:  # at most PIPE_BUF bytes once writable: a pipe takes them without waiting
                    view = view[os.write(fd, view[:select.PIPE_BUF]):]
                except BlockingIOError:  # an inherited non-blocking descriptor: poll again
                    continue
                taken = time.monotonic()
        except OSError as exc:
            self._closed.add(stream)
            self._lost(stream, exc)
        return None

    def _stalled(self, taken: float) -> bool:
        """Return whether a write that last made progress at ``taken`` (monotonic) is to be abandoned: after a stop only."""
        stops = list(self._stops)
        if not stops:
            return False
        if len(stops) > 1:  # a second stop: poprun is to end now
            return True
        return time.monotonic() - max(taken, stops[0]) >= STALL_S

    def _abandon(self, stream: Stream) -> None:
        """Write nothing more to ``stream``, whose reader stopped reading after a stop; say so on stderr if it works."""
        self._closed.add(stream)
        self.abandoned.add(stream)
        if stream == "stdout" and "stderr" not in self._closed:
            self._clear()
            self._write("stderr", f"poprun: warning: stdout took nothing for {STALL_S:g} s after the stop: the rest "
                                  "of the instances' output to it is dropped\n".encode())

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


def _never_blocks(fd: int) -> bool:
    """Return whether writing to ``fd`` never waits on a reader: a regular file or a block device (or a closed descriptor)."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return True  # the write fails at once, as before
    return stat.S_ISREG(mode) or stat.S_ISBLK(mode)


PROGRESS_S = 10.0  # the -v progress line at most this often


class ProgressLine:
    """
    The ``-v`` line of the instances' progress (``instance-progress`` events): at most every :data:`PROGRESS_S` seconds.

    ``Progress: step 120/200, ETA 35 s (slowest: instance 3 on h3)``: the least advanced
    instance's step and total, the largest ETA, and the instance it is; the first line as soon as
    progress is heard, the next ones no sooner than :data:`PROGRESS_S` after the last.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._latest: dict[int, InstanceProgressed] = {}
        self._shown: float | None = None

    def line(self, event: InstanceProgressed) -> str | None:
        """Take ``event``; return the line to log now, or None (too soon, or no step yet)."""
        known = self._latest.get(event.index)
        if known is None or event.attempt >= known.attempt:
            self._latest[event.index] = event
        now = self._clock()
        if self._shown is not None and now - self._shown < PROGRESS_S:
            return None
        stepped = [e for e in self._latest.values() if e.step is not None and e.attempt == event.attempt]
        if not stepped:
            return None
        from poprun.render.runs import printable, render_eta, render_step

        least = min(stepped, key=lambda e: (e.step, e.index))
        timed = [e for e in stepped if e.eta_ms is not None]
        slowest = max(timed, key=lambda e: (e.eta_ms, -e.index)) if timed else least
        self._shown = now
        text = f"Progress: step {render_step(float(least.step or 0))}" + (f"/{least.total}" if least.total is not None else "")
        if slowest.eta_ms is not None:
            text += f", ETA {render_eta(slowest.eta_ms / 1000)}"
        return text + f" (slowest: instance {slowest.index} on {printable(slowest.host)})"
