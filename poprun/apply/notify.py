"""
The notifier: ``--notify CMD`` run on this machine for the events the user chose (docs/progress.md).

Layer: ``poprun.apply``; imports ``poprun.process.watchdog``, ``poprun.runs.record`` (the event's
line), ``poprun.core`` and the plan model; imported by :func:`poprun.apply.apply` only for a plan
with a notifier.

The relay hands every event to :meth:`Notifier.event`, as it does to the run record; an event
whose kind is chosen (``--notify-on``) is made into its line at once (exactly the line
``--events`` writes: ``{"v":1,"event":KIND,"time":T,...}``) and put in a bounded queue
(:data:`QUEUE`; when it is full the oldest waiting line is dropped, and counted): the relay
never waits. One worker thread runs the command for each line, one at a time, in order:

- with ``/bin/sh``, the command itself only in the child's environment
  (``POPRUN_NOTIFY_COMMAND``, removed before it runs), never in an argument that ``ps`` shows;
- the line on its standard input, its standard output and error read into a bounded tail (at
  a bounded rate past :data:`FREE_OUTPUT`: a command that writes without end costs no core);
- in a process group of its own led by a watchdog (:mod:`poprun.process.watchdog`), in its
  cgroup where cgroup v2 can be written: the group is killed when the command ends or at its
  deadline (``--notify-timeout``), whichever is first, and nothing of it is left should poprun
  die meanwhile;
- with ``POPRUN_RUN_ID`` and ``POPRUN_NOTIFY_EVENT`` (the kind) set.

:meth:`Notifier.close` (at the run's end, after run-ended was told) waits for the queue at most
one deadline in all, then kills what still runs and drops what waits. A notifier that fails,
hangs or cannot start is a warning (PR467), once per kind of failure with how often it happened
and the last lines of its output, and never changes the run or its status.
"""

from __future__ import annotations

import collections
import contextlib
import os
import subprocess
import threading
import time

from poprun.core.diagnostic import warning
from poprun.core.span import SourceSpan
from poprun.core.threads import spawn

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from poprun.core.diagnostic import Diagnostic
    from poprun.core.events import Event
    from poprun.planner.plan import Observe

__all__ = ["COMMAND", "QUEUE", "Notifier"]

QUEUE = 100  # lines waiting for the command at most; beyond, the oldest is dropped
COMMAND = "POPRUN_NOTIFY_COMMAND"  # the command, in its shell's environment only
EVENT = "POPRUN_NOTIFY_EVENT"  # the kind of the event on its standard input
TAIL = 2048  # bytes of the command's output kept for a warning
FREE_OUTPUT = 16 << 20  # bytes of its output read as fast as it writes; beyond, at most 20 MiB a second
_TURN = 1 << 20  # ... read in turns of 1 MiB, 50 ms apart
_TAIL_LINES = 5
# The shell moves itself into the watchdog's cgroup (when given one), takes the command out of its environment
# (what it starts does not inherit it) and runs it: the command is in no argument.
_SCRIPT = ('[ -n "$1" ] && { echo "$$" >"$1/cgroup.procs"; } 2>/dev/null; __poprun_notify=$' + COMMAND
           + "; unset " + COMMAND + '; eval "$__poprun_notify"')
_MARK = "POPRUN_NOTIFY_MARK"  # a value of each run's own: what the command left out of its group is found by it


class Notifier:
    """
    Runs the notify command for each chosen event (see the module docstring); thread-safe.

    ``environ`` is the launching environment the command runs in; ``run_id`` the run's id.
    """

    def __init__(self, observe: Observe, environ: Mapping[str, str], run_id: str) -> None:
        self._command, self._kinds = observe.notify, frozenset(observe.notify_on)
        self.timeout_s = observe.notify_timeout_ms / 1000
        self._env = {k: v for k, v in environ.items() if k not in (COMMAND, EVENT, _MARK)}
        self._run_id = run_id
        self._cond = threading.Condition(threading.RLock())  # reentrant: a stop signal's handler may tell an event
        self._queue: collections.deque[tuple[str, bytes]] = collections.deque()
        self._busy = False  # a command runs now
        self._closing = False  # no more lines; the worker ends when the queue is empty
        self._cancel = threading.Event()  # kill what runs now, run nothing more
        self._counts: dict[str, int] = {}  # kind of failure -> how often (in the order they first happened)
        self._details: dict[str, tuple[str, str]] = {}  # kind of failure -> what the last one said, its last output
        self._events: dict[str, tuple[str, ...]] = {}  # kind of failure -> the kinds of the events it happened for
        self.sent = 0  # notifications whose command ran and succeeded
        self._worker: threading.Thread | None = None

    def event(self, event: Event) -> None:
        """Queue ``event``'s line when its kind is chosen; never waits (the relay calls it)."""
        if event.kind not in self._kinds:
            return
        from poprun.runs.record import event_line

        line = event_line(event, time.time()).encode(errors="surrogateescape")
        with self._cond:
            if self._closing:
                return
            if len(self._queue) >= QUEUE:
                self._queue.popleft()
                self._fail("dropped", f"the queue of {QUEUE} notifications was full: the oldest waiting was dropped",
                           b"")
            self._queue.append((event.kind, line))
            if self._worker is None:
                self._worker = spawn(self._work, name="poprun-notify")
            self._cond.notify_all()

    def close(self, *, interrupted: Callable[[], bool] = lambda: False) -> tuple[Diagnostic, ...]:
        """
        Wait for the notifications queued at most one deadline, then kill what runs and drop what waits.

        ``interrupted`` ends the wait sooner when it turns true (a stop signal meanwhile). Return
        the warnings (PR467), one per kind of failure.
        """
        deadline = time.monotonic() + self.timeout_s
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            while (self._queue or self._busy) and (left := deadline - time.monotonic()) > 0 and not interrupted():
                self._cond.wait(min(left, 0.1))
            if self._queue or self._busy:
                waiting = len(self._queue)
                self._queue.clear()
                self._cancel.set()
                if waiting:
                    self._fail("left", f"{waiting} notification{'s' * (waiting != 1)} still waiting when poprun "
                               "ended were not sent", b"")
            worker = self._worker
        if worker is not None:
            worker.join(5.0)  # the command is killed at once: this is the time to reap it
        return self.warnings()

    def warnings(self) -> tuple[Diagnostic, ...]:
        """Return a PR467 warning for each kind of failure so far, in the order they first happened."""
        with self._cond:
            found = [(kind, count, *self._details[kind], self._events.get(kind, ()))
                     for kind, count in self._counts.items()]
        return tuple(warning("PR467", "notifier failed",
                             detail=detail + _how_often(count, events)
                             + (f"; its last output: {output}" if output else ""),
                             span=SourceSpan.environment("the --notify command"),
                             hint=_HINTS.get(kind, _HINT)) for kind, count, detail, output, events in found)

    def _fail(self, kind: str, detail: str, tail: bytes, event: str = "") -> None:
        """Note a failure of ``kind`` (for an ``event`` of that kind), under the lock or not: the lock is reentrant."""
        text = _last_lines(tail)
        with self._cond:
            self._counts[kind] = self._counts.get(kind, 0) + 1
            self._details[kind] = (detail, text)
            if event:
                self._events[kind] = tuple(dict.fromkeys((*self._events.get(kind, ()), event)))

    def _work(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closing:
                    self._cond.wait()
                if not self._queue or self._cancel.is_set():
                    self._busy = False
                    self._cond.notify_all()
                    return
                kind, line = self._queue.popleft()
                self._busy = True
            try:
                self._notify(kind, line)
            except Exception as exc:  # noqa: BLE001 - a notifier never ends the run, nor this thread
                self._fail("error", f"the notify command could not be run: {type(exc).__name__}: {exc}", b"")
            with self._cond:
                self._busy = False
                self._cond.notify_all()

    def _notify(self, kind: str, line: bytes) -> None:
        """Run the command once with ``line`` on its standard input; note how it failed, if it did."""
        from poprun.process.cgroup import outside
        from poprun.process.watchdog import Watchdog, WatchdogError, forget_own, kill_adopted_carrying, starting_own

        mark = os.urandom(8).hex()
        env = self._env | {COMMAND: self._command, EVENT: kind, "POPRUN_RUN_ID": self._run_id, _MARK: mark}
        proc: subprocess.Popen[bytes] | None = None
        unstarted: OSError | None = None
        # born outside any launch's cgroup (a launch's end kills what is in it), and never taken by a
        # launch's end for what it left behind
        with outside(), starting_own() as own:
            try:
                watchdog = Watchdog(env=self._env, launch=False)
            except WatchdogError as exc:
                self._fail("start", f"the notify command could not start ({exc.strerror})", b"")
                return
            own(watchdog.pid)
            argv = ["/bin/sh", "-c", _SCRIPT, "poprun-notify", watchdog.cgroup.path if watchdog.cgroup else ""]
            try:
                proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,  # noqa: S603
                                        stderr=subprocess.STDOUT, process_group=watchdog.group)
                own(proc.pid)
            except OSError as exc:
                unstarted = exc
        try:
            try:
                if unstarted is not None or proc is None:
                    raise unstarted or OSError(0, "no process")
                watchdog.await_ready()
            except (OSError, WatchdogError) as exc:
                self._fail("start", f"the notify command could not start ({exc.strerror})", b"")
                return
            status, tail = _talk(proc, line, time.monotonic() + self.timeout_s, self._cancel)
        finally:
            watchdog.close()  # the group and the cgroup: what the command left behind too
            if proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(5.0)  # killed with its group just now: reaped at once
            forget_own(watchdog.pid, *((proc.pid,) if proc is not None else ()))
            kill_adopted_carrying(f"{_MARK}={mark}".encode(), watchdog.group, within_s=0.5)
        self._judge(kind, status, tail)

    def _judge(self, kind: str, status: int | None, tail: bytes) -> None:
        if status == 0:
            with self._cond:
                self.sent += 1
            return
        if status is None:
            if self._cancel.is_set():
                self._fail("cut", "the notify command was still running when poprun ended "
                           f"(at most {_seconds(self.timeout_s)} after the run): it was killed", tail, kind)
            else:
                self._fail("timeout", f"the notify command did not end within {_seconds(self.timeout_s)}: it was "
                           "killed", tail, kind)
        elif status == 127:  # noqa: PLR2004 - the shell's "command not found"
            self._fail("missing", "the notify command was not found: status 127", tail, kind)
        elif status < 0:
            from poprun.core.outcome import signal_name

            self._fail("signal", f"the notify command was killed by {signal_name(-status)}", tail, kind)
        else:
            self._fail("status", f"the notify command failed with status {status}", tail, kind)


def _talk(proc: subprocess.Popen[bytes], line: bytes, deadline: float,
          cancel: threading.Event) -> tuple[int | None, bytes]:
    """
    Give ``line`` to ``proc`` and read its output until it exits, the deadline or a cancel; return (status, tail).

    The status is None when it was still running (its group is then killed by the caller). Once the
    shell has exited, output still coming from what it left behind is not waited for.
    """
    import selectors

    assert proc.stdin is not None
    assert proc.stdout is not None
    tail = bytearray()
    os.set_blocking(proc.stdin.fileno(), False)
    os.set_blocking(proc.stdout.fileno(), False)
    pending = memoryview(line)
    read = 0  # bytes of its output read: past FREE_OUTPUT, at a bounded rate (a flood costs poprun no core)
    turn = 0  # bytes read since the last pause (a pipe gives 64 KiB a read: a turn is 1 MiB of reads)
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        selector.register(proc.stdin, selectors.EVENT_WRITE)
        try:
            while proc.poll() is None:
                left = deadline - time.monotonic()
                if left <= 0 or cancel.is_set():
                    return None, bytes(tail)
                for key, _ in selector.select(min(left, 0.05)):
                    if key.fileobj is proc.stdin:
                        pending = _write(proc, selector, pending)
                        continue
                    got = _read(proc.stdout.fileno(), tail)
                    if got is None:
                        selector.unregister(proc.stdout)
                    else:
                        read, turn = read + got, turn + got
                    if read >= FREE_OUTPUT and turn >= _TURN:
                        turn = 0
                        cancel.wait(0.05)  # a command that writes without end: 1 MiB a turn, 20 turns a second
            with contextlib.suppress(OSError):
                _read(proc.stdout.fileno(), tail)  # what it wrote last, without waiting for what it left behind
            return proc.returncode, bytes(tail)
        finally:
            for stream in (proc.stdin, proc.stdout):
                with contextlib.suppress(OSError):
                    stream.close()


def _write(proc: subprocess.Popen[bytes], selector: object, pending: memoryview) -> memoryview:
    """Write what fits of ``pending`` to the command's standard input; close it once all is written (or refused)."""
    assert proc.stdin is not None
    try:
        pending = pending[os.write(proc.stdin.fileno(), pending):]
    except BlockingIOError:
        return pending
    except OSError:  # EPIPE: it does not read its standard input
        pending = pending[len(pending):]
    if not pending:
        selector.unregister(proc.stdin)  # type: ignore[attr-defined]
        proc.stdin.close()
    return pending


def _read(fd: int, tail: bytearray) -> int | None:
    """Read what the command wrote into ``tail`` (its last :data:`TAIL` bytes), 1 MiB at most; return how much, None at its end."""
    got = 0
    for _ in range(16):  # a command that writes without end is read again at the next turn, after the deadline check
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            return got
        except OSError:
            return None
        if not data:
            return None
        got += len(data)
        tail += data
        del tail[:-TAIL]
    return got


def _how_often(count: int, events: tuple[str, ...]) -> str:
    """Return `` (3 times, for attempt-ended and run-ended)``, `` (for run-ended)`` or ""."""
    times = f"{count} times" if count > 1 else ""
    kinds = f"for {' and '.join(events)}" if events else ""
    return f" ({', '.join(p for p in (times, kinds) if p)})" if times or kinds else ""


def _last_lines(tail: bytes) -> str:
    """Return the last lines of a command's output in one line: `` | ``-joined, control characters escaped."""
    from poprun.core.secret import printable

    lines = [printable(line.decode(errors="replace")).strip() for line in tail.splitlines()]
    return " | ".join([line for line in lines if line][-_TAIL_LINES:])


def _seconds(s: float) -> str:
    return f"{s:.3f}".rstrip("0").rstrip(".") + " s"


_HINT = ("run the command by hand with a line of the run's events (events.jsonl in its run record, or --events) on its "
         "standard input")
_HINTS = {
    "timeout": "make the command end sooner (send in the background what may take long), or give a longer "
               "--notify-timeout",
    "cut": "make the command end sooner, or give a longer --notify-timeout: poprun waits for notifications at most "
           "that long once the run has ended",
    "left": "make the command end sooner, or choose fewer events (--notify-on)",
    "dropped": "make the command end sooner, or choose fewer events (--notify-on)",
    "missing": "give a command that exists on this machine (its path, or one on PATH)",
}
