"""
The metrics file: ``--metrics-file PATH`` kept current as OpenMetrics text (docs/progress.md).

Layer: ``poprun.apply``; imports ``poprun.core`` and :mod:`poprun.planner.observe` (the rule
for a metrics path); imported by :func:`poprun.apply.apply` only for a plan with a metrics file.

:class:`MetricsFile` hears every event the relay tells (the run's state, attempt and restarts)
and reads each instance's progress from the run's board (its ``snapshot()``); a thread of its
own writes the file once a second while the run lives, and :meth:`MetricsFile.close` once more
at its end, with the run's last state. The file is never written in place: each version is
a temporary file made in the same folder by this poprun (``O_EXCL``, ``O_NOFOLLOW``, a name of
its own: a dot, the first :data:`TMP_PREFIX` bytes of the file's name, a random part, not
ending in ``.prom``, so that no textfile collector reads it half-written), written,
``fsync``'d and renamed over the path (a hard link at the path is replaced, never written
through). poprun deletes only the temporary files it made, by record. A write
that fails (a full disk, a folder gone or not writable, something that is not a regular file
put at the path) is a warning (PR240), once per cause, and the last version stays; the next
second tries again. The file is left after the run with its final state.

The text is what both of its readers accept, as checked against the real ones: OpenMetrics
(``# TYPE``, ``# HELP``, ``# UNIT`` for the metrics in seconds, ``# EOF``), which
``prometheus_client``'s OpenMetrics parser reads, within the Prometheus text format that
Debian's node exporter 1.5 textfile collector reads (it skips ``# UNIT`` and ``# EOF`` as
comments but refuses the ``info`` and ``stateset`` types: the run's information and its state
are gauges, the state one-hot over :data:`STATES`). Label values are escaped as both formats
say (backslash, double quote, newline); a value that is not UTF-8 has its bad bytes replaced.
"""

from __future__ import annotations

import contextlib
import os
import threading

from poprun.core.diagnostic import warning
from poprun.core.span import SourceSpan
from poprun.core.threads import spawn

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from poprun.core.diagnostic import Diagnostic
    from poprun.core.events import Event
    from poprun.core.progress import InstanceProgress as Progress

__all__ = ["INTERVAL_S", "STATES", "MetricsFile", "render"]

INTERVAL_S = 1.0  # how often the file is replaced while the run lives
CLOSE_S = 5.0  # the longest the end waits for a version being written
TMP_PREFIX = 64  # bytes of the file's name that begin its temporary file's (which must fit in 255)
STATES = ("starting", "running", "restarting", "stopping", "succeeded", "failed", "stopped")
_STOPPED = (129, 130, 143)  # stopped by SIGHUP, SIGINT, SIGTERM with no instance to blame

# name, type, unit, help; in the order written
_RUN = (
    ("poprun_run_info", "gauge", "", "The run: its id and backend (always 1)."),
    ("poprun_run_state", "gauge", "", "The run's state: 1 for the state it is in, 0 for the others."),
    ("poprun_attempt", "gauge", "", "The attempt running now (0 first, one more with each restart of every instance)."),
    ("poprun_restarts", "counter", "", "Restarts so far in the run (of every instance, or of one)."),
)
_INSTANCE = (
    ("poprun_instance_step", "gauge", "", "The last step the instance reported (popdist.progress)."),
    ("poprun_instance_step_total", "gauge", "", "The number of steps the instance said it will make."),
    ("poprun_instance_step_seconds", "gauge", "seconds", "The instance's median step time over its recent steps."),
    ("poprun_instance_eta_seconds", "gauge", "seconds", "Seconds until the instance reaches its total at its pace."),
    ("poprun_instance_straggler_ratio", "gauge", "",
     "The instance's median step time over the run's median, when it is a straggler."),
    ("poprun_instance_last_heard_seconds", "gauge", "seconds", "Seconds since poprun last heard from the instance."),
)


class MetricsFile:
    """
    Keeps the metrics file of one run (see the module docstring); thread-safe.

    ``snapshot`` returns each instance's progress (the board's), or is None for a run without one.
    """

    def __init__(self, path: str, *, run_id: str, backend: str,
                 snapshot: Callable[[], Sequence[Progress]] | None = None) -> None:
        self.path, self._run_id, self._backend, self._snapshot = path, run_id, backend, snapshot
        self._lock = threading.RLock()  # the run's state; reentrant: a stop signal's handler may tell an event
        self._writing = threading.Lock()  # held while a version is written: never by event(), which must not wait
        self._state, self._attempt, self._restarts = "starting", 0, 0
        self._made: dict[str, tuple[int, int]] = {}  # temporary files made and not renamed yet: path -> (dev, inode)
        self._problems: dict[str, str] = {}  # cause -> what the first failure said (told once)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.writes = 0  # versions written

    def watch(self, snapshot: Callable[[], Sequence[Progress]]) -> None:
        """Read each instance's progress from ``snapshot`` (the run's board) from now on."""
        self._snapshot = snapshot

    def start(self) -> None:
        """Write the file now, then once a second from a thread of its own, until :meth:`close`."""
        self.write()
        self._thread = spawn(self._keep, name="poprun-metrics")

    def event(self, event: Event) -> None:
        """Follow the run's state, attempt and restarts from ``event``; never waits."""
        kind = event.kind
        with self._lock:
            if kind == "attempt-started":
                self._attempt, self._state = event.attempt, "starting"  # type: ignore[union-attr]
            elif kind == "launch-running":
                self._state = "running"
            elif kind == "instance-started" and event.restart:  # type: ignore[union-attr]
                self._restarts += 1  # one instance started again alone (--restart-scope instance)
            elif kind == "attempt-ended" and event.restart:  # type: ignore[union-attr]
                self._state, self._restarts = "restarting", self._restarts + 1
            elif kind == "stopping":
                self._state = "stopping"
            elif kind == "run-ended":
                status, cause = event.status, event.root_cause  # type: ignore[union-attr]
                self._state = ("succeeded" if status == 0 else
                               "stopped" if status in _STOPPED and cause is None else "failed")

    def close(self) -> tuple[Diagnostic, ...]:
        """
        Stop the thread, write the file once more (the run's last state); return the warnings (PR240).

        A write that does not return (a file system that hangs) holds the end at most :data:`CLOSE_S`.
        """
        self._stop.set()
        if self._thread is not None:
            self._thread.join(CLOSE_S)
        if not self._writing.acquire(timeout=CLOSE_S):
            self._note("hang", f"a version of {self.path} was still being written {CLOSE_S:.0f} s after the run "
                               "ended: its file system does not answer, and the last state was not written")
        else:
            try:
                self._write_locked()
                for leftover, made in sorted(self._made.items()):  # a write cut short: by record, not name
                    _unlink_own(leftover, made)
                self._made.clear()
            finally:
                self._writing.release()
        with self._lock:
            return tuple(warning("PR240", "metrics file cannot be written", detail=detail,
                                 span=SourceSpan.environment("the --metrics-file"),
                                 hint="make room, or give a path in a folder this user can write (the last version "
                                      "written stays)")
                         for detail in self._problems.values())

    def _keep(self) -> None:
        while not self._stop.wait(INTERVAL_S):
            self.write()

    def write(self) -> None:
        """Replace the file with the run's state now; a failure is noted (once per cause), never raised."""
        with self._writing:
            self._write_locked()

    def _write_locked(self) -> None:
        try:
            progress = tuple(self._snapshot()) if self._snapshot is not None else ()
        except Exception as exc:  # noqa: BLE001 - the metrics never end the run
            progress = ()
            self._note("snapshot", f"the instances' progress could not be read: {type(exc).__name__}: {exc}")
        with self._lock:  # the state only: the events' thread never waits for the disk
            state, attempt, restarts = self._state, self._attempt, self._restarts
        text = render(run_id=self._run_id, backend=self._backend, state=state, attempt=attempt, restarts=restarts,
                      progress=progress)
        self._replace(text.encode("utf-8"))

    def _replace(self, data: bytes) -> None:
        import errno
        import stat

        folder, name = os.path.split(self.path)
        try:
            found = os.lstat(self.path)
        except FileNotFoundError:
            found = None
        except OSError as exc:
            self._note(f"look-{exc.errno}", f"{self.path} cannot be looked at: {exc.strerror}")
            return
        if found is not None and not stat.S_ISREG(found.st_mode):
            self._note("kind", f"something that is not a regular file is at {self.path}: it is left as it is and no "
                               "metrics are written there")
            return
        short = os.fsdecode(os.fsencode(name)[:TMP_PREFIX])  # a name of 254 bytes leaves no room for more
        tmp = os.path.join(folder, f".{short}.{os.urandom(6).hex()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            cause = "folder" if exc.errno in (errno.ENOENT, errno.ENOTDIR) else f"open-{exc.errno}"
            self._note(cause, f"no file can be made in {folder}: {exc.strerror}")
            return
        self._made[tmp] = _identity(os.fstat(fd))
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
            os.rename(tmp, self.path)
            self._made.pop(tmp, None)
            self.writes += 1
        except OSError as exc:
            _unlink_own(tmp, self._made.pop(tmp))
            why = "the disk is full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else exc.strerror
            self._note(f"write-{exc.errno}", f"{self.path} could not be replaced ({why}): the last version stays")

    def _note(self, cause: str, detail: str) -> None:
        with self._lock:
            self._problems.setdefault(cause, detail)


def _identity(found: os.stat_result) -> tuple[int, int]:
    return found.st_dev, found.st_ino


def _unlink_own(path: str, made: tuple[int, int]) -> None:
    """Remove the temporary file this poprun made at ``path``, only while that name is still that file (never another's)."""
    with contextlib.suppress(OSError):
        if _identity(os.lstat(path)) == made:
            os.unlink(path)


def render(*, run_id: str, backend: str, state: str, attempt: int, restarts: int,
           progress: Sequence[Progress] = ()) -> str:
    """Return the metrics as OpenMetrics text (see the module docstring)."""
    run = f'run_id="{_label(run_id)}"'
    samples: dict[str, list[str]] = {name: [] for name, *_ in (*_RUN, *_INSTANCE)}
    samples["poprun_run_info"].append(f'poprun_run_info{{{run},backend="{_label(backend)}"}} 1')
    samples["poprun_run_state"] += [f'poprun_run_state{{{run},state="{s}"}} {int(s == state)}' for s in STATES]
    samples["poprun_attempt"].append(f"poprun_attempt{{{run}}} {attempt}")
    samples["poprun_restarts"].append(f"poprun_restarts_total{{{run}}} {restarts}")
    for p in sorted(progress, key=lambda p: p.index):
        labels = f'{run},instance="{p.index}",host="{_label(p.host)}"'
        for name, value in (("poprun_instance_step", p.step), ("poprun_instance_step_total", p.total),
                            ("poprun_instance_step_seconds", p.step_time_s), ("poprun_instance_eta_seconds", p.eta_s),
                            ("poprun_instance_straggler_ratio", p.straggler_ratio),
                            ("poprun_instance_last_heard_seconds", p.heard_s)):
            shown = _number(value)
            if shown is not None:
                samples[name].append(f"{name}{{{labels}}} {shown}")
    lines = []
    for name, kind, unit, text in (*_RUN, *_INSTANCE):
        if not samples[name]:
            continue
        lines += [f"# TYPE {name} {kind}", *([f"# UNIT {name} {unit}"] if unit else []), f"# HELP {name} {text}",
                  *samples[name]]
    return "\n".join([*lines, "# EOF"]) + "\n"


def _label(value: str) -> str:
    """Return ``value`` escaped as a label value: backslash, double quote and newline; bad UTF-8 replaced."""
    try:  # a byte that was not UTF-8 (a host name read from a file): U+FFFD, as a UTF-8 reader shows it
        text = value.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
    except UnicodeEncodeError:
        text = value.encode("utf-8", "replace").decode("utf-8")
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float | None) -> str | None:
    """Return ``value`` as the formats write a number, or None for none (and a value that is not finite)."""
    import math

    if value is None or isinstance(value, bool) or not math.isfinite(value):
        return None
    if isinstance(value, int) or (float(value).is_integer() and abs(value) < 2 ** 53):
        return str(int(value))
    return repr(float(value))
