"""
Writing a run's record as it happens: its directory, plan, events, per-instance logs and report.

Layer: ``poprun.runs``; imports ``poprun.planner.plan`` and ``poprun.core``; no ``json`` (start-up:
:mod:`poprun.runs.jsontext`). Length: one writer of one directory; every file of it is made, kept
within its limits and ended here, so that what a full disk or a stop leaves behind is decided in
one place. The layout is in ``docs/runs.md``:

``RUNS/ID/``, mode 0700, made by this process (``mkdir``, never an existing directory):

- ``supervisor``: the pid, boot-relative start time and host of the poprun process that
  supervises the run, so that ``poprun ps`` tells a run whose supervisor died (lost) from
  one that runs, and ``poprun stop`` signals the right process;
- ``.reserve``: room kept for ``report.json`` should the disk fill up (removed at the end);
- ``.poprun-run``: the mark that poprun made the directory (pruning removes nothing else), made
  after the supervisor file, so that a marked run always names its supervisor; its mtime is
  when the run began, to the nanosecond (runs of one second are ordered by it);
- ``plan.json``: the plan as applied (the values added at apply time included; forwarded
  values by name only), in the format of ``poprun plan --format json``;
- ``events.jsonl``: one event per line, ``{"v": 1, "event": KIND, "time": UNIX_SECONDS, ...}``;
  an instance's ``instance-progress`` lines (one a second) up to :data:`PROGRESS_EVENTS_LIMIT`
  bytes, then one every :data:`PROGRESS_EVENTS_THIN_S` seconds (a long run's record stays small;
  ``--events`` still gets every one, and ``progress.json`` and the report stay exact);
- ``logs/N.stdout``, ``logs/N.stderr``: instance N's output, whole lines, as it printed them,
  up to ``POPRUN_RUN_LOG_LIMIT`` bytes per instance (64 MiB by default); ``logs/order``: one
  ``N stream bytes`` line per piece written, so that ``poprun logs`` merges the instances'
  output in the order it arrived;
- ``attempts/K/logs/``: with restarts allowed (``--max-restarts``), each attempt's logs apart,
  ``K`` from 0; ``logs`` and ``latest`` are then links to the last attempt's (``attempts/K/logs``,
  ``attempts/K``), so that readers of ``logs/`` see the attempt that counts;
- ``actual.json``: what each instance ran as (:mod:`poprun.runs.verify`);
- ``progress.json``: the instances' progress (``popdist.progress``), replaced at most once a
  second while the run listens (docs/progress.md);
- ``report.json``: how the run ended (written last).

Nothing here may stop a launch: a record that cannot be made or written (a full disk, a
directory that is not the user's) becomes one warning, and the launch goes on without it. A
record cut short by a full disk still ends with a ``report.json``, written into the room
``.reserve`` kept (in place: no new blocks), that says so (``incomplete``) and keeps the status.
Every file is whole or absent: ``plan.json``, ``actual.json`` and ``report.json`` are written
under another name and renamed; a line that did not fit is cut back off.

Pruning reads other runs' records as untrusted input, as ``poprun ps`` does: through a
descriptor of the run's directory, never following a link, a regular file of the user's own,
never a FIFO, at most a few KiB; it removes a run by descriptor, never following a link, never
leaving its file system, at a bounded depth.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
import time
from collections.abc import Iterable, Mapping

from popdist import env as names
from poprun.core.events import Event
from poprun.core.private import make_directories
from poprun.core.process import start_time
from poprun.core.record import fields
from poprun.core.secret import mask_text
from poprun.planner.plan import NO_RANK_ORDER, Instance, LaunchPlan
from poprun.runs.jsontext import dumps

RUNS_DIR = "POPRUN_RUNS_DIR"  # where runs are kept
KEEP = "POPRUN_RUNS_KEEP"  # how many runs are kept (100)
LOG_LIMIT = "POPRUN_RUN_LOG_LIMIT"  # bytes of output kept per instance (64 MiB)
RUN_ID = names.RUN_ID  # the run's id, in every instance's environment (popdist's contract)
DEFAULT_KEEP = 100
DEFAULT_LOG_LIMIT = 64 << 20
PROGRESS_EVENTS_LIMIT = 16 << 20  # bytes of one instance's instance-progress lines kept in events.jsonl at one a second
PROGRESS_EVENTS_THIN_S = 60.0  # beyond them, one of its lines kept at most this often
MARK = ".poprun-run"
RESERVE = ".reserve"  # room kept for report.json should the disk fill up
RESERVE_BYTES = 16 << 10  # a report without the failures' tails, for a few hundred instances
SMALL = 4 << 10  # the most pruning reads of a record file (the supervisor's line)
DEPTH = 16  # the deepest pruning goes into a run's directory (a record is 4 deep: attempts/K/logs/N.stdout)
_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_DIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class RecordError(OSError):
    """The run record could not be made: why, in one line."""


def runs_directory(environ: Mapping[str, str]) -> str:
    """Return where runs are kept: ``$POPRUN_RUNS_DIR``, else ``$XDG_STATE_HOME/poprun/runs``, else ``~/.local/state/...``."""
    if environ.get(RUNS_DIR):
        return environ[RUNS_DIR]
    state = environ.get("XDG_STATE_HOME") or os.path.join(environ.get("HOME") or os.path.expanduser("~"),
                                                           ".local", "state")
    return os.path.join(state, "poprun", "runs")  # pathlib costs start-up


def _count(environ: Mapping[str, str], name: str, default: int, notes: list[str]) -> int:
    """Return the whole number the setting ``name`` holds, else ``default`` (and a note in ``notes`` when it is set)."""
    text = environ.get(name, "").strip()
    if text.isascii() and text.isdigit():
        return int(text) if len(text) < 19 else 10 ** 18  # noqa: PLR2004 - beyond any count: no int of a megabyte
    if text:
        notes.append(f"{name} is {text[:40]!r}, not a whole number: {default} is used")
    return default


def new_id(now: float) -> str:
    """Return a new run id: the UTC time to the second and six random hex digits (ids sort by time)."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime(now)) + "-" + os.urandom(3).hex()


def _user_directory(path: str) -> None:
    """Make ``path`` and its missing parents (each 0o700, whatever the umask); refuse a link or another user's directory at its end."""
    try:
        make_directories(path, exist_ok=True)
        info = os.lstat(path)
    except OSError as exc:
        raise RecordError(exc.errno, f"cannot make {path}: {exc.strerror}") from exc
    if not os.path.isdir(path) or os.path.islink(path):
        raise RecordError(0, f"{path} is not a directory")
    if info.st_uid != os.geteuid():
        raise RecordError(0, f"{path} belongs to another user")


class RunRecord:
    """
    The record of one run, written as it happens (see the module docstring).

    Made by :meth:`create`; the apply step feeds it the plan, events and the instances' lines
    (:meth:`instance_lines` is called from the backend's output thread), then :meth:`finish`.
    Every write failure ends the record quietly but for one warning (:attr:`warning`).
    """

    def __init__(self, run_id: str, path: str, *, log_limit: int, started: float = 0.0) -> None:
        self.id, self.path, self.started = run_id, path, started
        self.incomplete: str | None = None  # why the record stopped being written (a full disk), once
        self.notes: list[str] = []  # what to warn of the settings (a POPRUN_RUNS_KEEP that is no number)
        self.reported = False  # report.json was written (whole, or the short form in the reserved room)
        self._log_limit = log_limit
        self._logged: dict[int, int] = {}  # instance -> bytes kept
        self._truncated: dict[int, int] = {}  # instance -> bytes dropped
        self._logs: dict[tuple[int, str], int] = {}  # (instance, stream) -> fd
        self._logs_dir = os.path.join(path, "logs")
        self._events = os.open(os.path.join(path, "events.jsonl"),
                               os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o600)
        self._order = -1
        self._sizes: dict[int, int] = {}  # fd -> bytes written whole (a write cut short is cut back to it)
        self._lock = threading.Lock()  # the backend's output thread and the events' writers
        self._stopped = False  # nothing more is written: cut short, or closed
        self._closed = False
        self.on_truncated: list[tuple[int, int]] = []  # (instance, bytes kept) not yet told as an event
        self.phases: dict[str, float] = {}  # phase -> seconds (plan, partition, start, run, teardown)
        self.launch_phases: dict[str, float] = {}  # the backend's phases -> seconds (connect, preflight, start, first-output)
        self.slow_hosts: dict[str, tuple[float, int]] = {}  # host -> (seconds to connect, attempts), when slow
        self.observed: dict[int, dict[str, object]] = {}  # instance -> what it ran as (poprun.runs.verify)
        self._pruning: tuple[str, int] | None = None  # (the runs' directory, runs kept): old runs not pruned yet
        self.progress: dict[str, object] | None = None  # report.json's progress (each instance's steps), when it listened
        self._progress_kept: dict[int, tuple[int, float]] = {}  # instance -> (progress-event bytes kept, when last)

    @classmethod
    def create(cls, environ: Mapping[str, str], *, now: float | None = None, prune: bool = True) -> RunRecord:
        """
        Make a new run directory under :func:`runs_directory`; prune old runs.

        With ``prune=False`` old runs are pruned later, off a launch's start-up: by
        :meth:`prune_old`, which the apply step calls once the instances started, else as the
        record closes.

        Raises:
            RecordError: when it cannot be made (the caller warns and launches without a record).
        """
        now = time.time() if now is None else now
        root = runs_directory(environ)
        _user_directory(root)
        run_id = new_id(now)
        path = os.path.join(root, run_id)
        try:
            os.mkdir(path, 0o700)  # never an existing directory
        except OSError as exc:
            raise RecordError(exc.errno, f"cannot write the run record in {path}: {exc.strerror}") from exc
        try:  # the supervisor before the mark: a run that is marked names a supervisor, so it is never pruned as gone
            write_supervisor(path)
            _write_new(os.path.join(path, RESERVE), " " * RESERVE_BYTES)
            mark = os.path.join(path, MARK)
            _write_new(mark, "")
            made = time.time_ns()  # the order of runs of one second (file times are as coarse as the kernel's tick)
            os.utime(mark, ns=(made, made))
            os.mkdir(os.path.join(path, "logs"), 0o700)
            notes: list[str] = []
            record = cls(run_id, path, log_limit=_count(environ, LOG_LIMIT, DEFAULT_LOG_LIMIT, notes), started=now)
        except OSError as exc:
            _remove_tree(path)  # made by this process a moment ago: nothing of it is left
            raise RecordError(exc.errno, f"cannot write the run record in {path}: {exc.strerror}") from exc
        record._pruning = (root, max(1, _count(environ, KEEP, DEFAULT_KEEP, notes)))
        if prune:
            record.prune_old()
        record.notes = notes
        return record

    def prune_old(self) -> None:
        """Remove the oldest runs beyond those kept (:func:`prune`; this one never), once: later calls do nothing."""
        pruning, self._pruning = self._pruning, None
        if pruning is not None:
            prune(pruning[0], keep=pruning[1], but=self.id)

    @property
    def warning(self) -> str | None:
        """Why the record stopped being written (once), and whether its report could still say how the run ended."""
        if self.incomplete is None:
            return None
        ended = ("its report.json keeps how the run ended" if self.reported else
                 "no report could be written either (poprun ps will show the run as lost)")
        return f"cannot write the run record {self.path} ({self.incomplete}): it stops here, incomplete; {ended}"

    def write_plan(self, plan: LaunchPlan, *, attempt: int | None = None) -> None:
        """Write ``plan.json``: the plan as applied; with ``attempt``, ``attempts/N/plan.json``: that attempt's plan (its hosts)."""
        where = self.path if attempt is None else os.path.join(self.path, "attempts", str(attempt))
        self._guard(lambda: _write_whole(os.path.join(where, "plan.json"),
                                         dumps(plan_data(plan), indent=2, sort_keys=True) + "\n"))

    def write_progress(self, data: Mapping[str, object]) -> None:
        """Replace ``progress.json``: the instances' progress now (docs/progress.md), whole, 0600, never through a link."""
        if self._stopped:
            return
        text = dumps(dict(data), sort_keys=True) + "\n"
        self._guard(lambda: _write_whole(os.path.join(self.path, "progress.json"), text))

    def event(self, event: Event, data: Mapping[str, object] | None = None) -> None:
        """Append ``event`` (with the time now) to ``events.jsonl``; ``data``: its JSON-ready form, when made already."""
        if self._stopped:
            return
        self._time(event)
        line = event_line(event, time.time()) if data is None else mask_text(dumps(dict(data))) + "\n"
        if event.kind == "instance-progress" and not self._progress_line(event.index, len(line)):  # type: ignore[union-attr]
            return
        self._guard(lambda: self._write_all(self._events, line.encode(errors="surrogateescape")))

    def _progress_line(self, index: int, size: int) -> bool:
        """Return whether instance ``index``'s progress line of ``size`` bytes is kept (see the module docstring)."""
        now = time.monotonic()
        with self._lock:
            kept, last = self._progress_kept.get(index, (0, float("-inf")))
            if kept >= PROGRESS_EVENTS_LIMIT and now - last < PROGRESS_EVENTS_THIN_S:
                return False
            self._progress_kept[index] = (kept + size, now)
            return True

    def _time(self, event: Event) -> None:
        """Keep what ``event`` says of the launch's phases (summed over the attempts) and slow hosts, for the report."""
        from poprun.core.events import HostConnected, PhaseEnded

        if isinstance(event, PhaseEnded):
            self.launch_phases[event.phase] = round(self.launch_phases.get(event.phase, 0.0) + event.ms / 1000, 3)
        elif isinstance(event, HostConnected) and event.slow:
            self.slow_hosts[event.host] = (event.ms / 1000, event.attempts)

    def begin_attempt(self, number: int) -> None:
        """Keep the logs of attempt ``number`` apart from here on: ``attempts/N/logs``, linked as ``logs`` and ``latest``."""

        def begin() -> None:
            self._close_logs()
            attempts = os.path.join(self.path, "attempts")
            if number == 0:
                os.mkdir(attempts, 0o700)
                os.rmdir(os.path.join(self.path, "logs"))  # made empty by create(): replaced by a link
            os.mkdir(os.path.join(attempts, str(number)), 0o700)
            os.mkdir(os.path.join(attempts, str(number), "logs"), 0o700)
            self._logs_dir = os.path.join(attempts, str(number), "logs")
            self._logged.clear()
            self._truncated.clear()
            for name, target in (("logs", f"attempts/{number}/logs"), ("latest", f"attempts/{number}")):
                link = os.path.join(self.path, f".{name}.{os.getpid()}")
                os.symlink(target, link)
                os.replace(link, os.path.join(self.path, name))

        self._guard(begin)

    def _close_logs(self) -> None:
        for fd in (self._order, *self._logs.values()):
            if fd >= 0:
                self._sizes.pop(fd, None)
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._order = -1
        self._logs.clear()

    def instance_lines(self, index: int, stream: str, data: bytes) -> None:
        """Keep whole lines of instance ``index``'s ``stream``, up to the limit per instance (the backend's thread)."""
        if self._stopped:
            return
        if index in self._truncated:  # cut already: nothing more is kept of it
            self._truncated[index] += len(data)
            return
        kept = self._logged.get(index, 0)
        room = self._log_limit - kept
        if len(data) > room:  # keep whole lines only
            cut = data.rfind(b"\n", 0, max(room, 0)) + 1
            self._truncated[index] = len(data) - cut
            self.on_truncated.append((index, kept + cut))
            data = data[:cut]
            if not data:
                return
        self._logged[index] = kept + len(data)
        self._guard(lambda: self._append(index, stream, data))

    def _append(self, index: int, stream: str, data: bytes) -> None:
        fd = self._logs.get((index, stream))
        if fd is None:
            fd = self._logs[(index, stream)] = os.open(os.path.join(self._logs_dir, f"{index}.{stream}"),
                                                       os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND
                                                       | os.O_CLOEXEC, 0o600)
        if self._order < 0:
            self._order = os.open(os.path.join(self._logs_dir, "order"),
                                  os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o600)
        self._write_all(fd, data)
        self._write_all(self._order, b"%d %s %d\n" % (index, stream.encode(), len(data)))

    def _write_all(self, fd: int, data: bytes) -> None:
        """Append all of ``data`` to ``fd``, or nothing: what a full disk cut short is cut back off (lines stay whole)."""
        size = self._sizes.get(fd, 0)
        view = memoryview(data)
        try:
            while view:
                written = os.write(fd, view)
                if not written:
                    raise OSError(28, os.strerror(28))  # noqa: TRY301 - ENOSPC, as a full disk says it
                view = view[written:]
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, size)
            raise
        self._sizes[fd] = size + len(data)

    def truncation(self) -> dict[int, tuple[int, int]]:
        """Return, for each instance whose log was cut, (bytes kept, bytes dropped)."""
        return {i: (self._logged.get(i, 0), dropped) for i, dropped in self._truncated.items()}

    def finish(self, report: Mapping[str, object]) -> None:
        """
        Write ``actual.json`` (what the instances ran as), then ``report.json`` (last), and close the record.

        The report is written even when the record was cut short (a full disk): then it says so
        (``incomplete``), in the room kept for it when no more can be had.
        """
        if self._closed:
            return
        if not self._stopped and self.observed:
            from poprun.runs.verify import actual_data

            self._guard(lambda: _write_whole(os.path.join(self.path, "actual.json"),
                                             dumps(actual_data(self.observed), indent=2, sort_keys=True) + "\n"))
        with self._lock:
            self._stopped = True
            self.reported = self._report(dict(report))
        self.close()

    def _report(self, data: dict[str, object]) -> bool:
        """Write ``report.json`` whole, else its short form in the reserved room; return whether either was written."""
        name, reserve = os.path.join(self.path, "report.json"), os.path.join(self.path, RESERVE)
        if self.incomplete is not None:
            data["incomplete"] = self.incomplete
        try:  # whole, when the disk has room (again)
            _write_whole(name, dumps(data, indent=2, sort_keys=True) + "\n")
        except OSError as exc:
            self.incomplete = self.incomplete or exc.strerror or str(exc)
            data["incomplete"] = self.incomplete
        else:
            with contextlib.suppress(OSError):
                os.unlink(reserve)
            return True
        for text in _short_reports(data):
            encoded = text.encode(errors="surrogateescape")
            if len(encoded) <= RESERVE_BYTES:
                try:
                    _overwrite(reserve, encoded)
                    os.replace(reserve, name)
                except OSError:
                    return False
                return True
        return False

    def close(self) -> None:
        """Close every file of the record (idempotent); prune old runs if that is still to do (:meth:`prune_old`)."""
        self._closed = self._stopped = True
        self._close_logs()
        if self._events >= 0:
            with contextlib.suppress(OSError):
                os.close(self._events)
        self._events = -1
        self.prune_old()

    def _guard(self, write: object) -> None:
        """Run ``write``; on failure (a full disk) stop writing the record and keep why, once."""
        with self._lock:
            if self._stopped:
                return
            try:
                write()  # type: ignore[operator]
            except OSError as exc:
                self.incomplete = exc.strerror or str(exc)
                self._stopped = True


def _short_reports(data: dict[str, object]) -> Iterable[str]:
    """Yield ``data`` ever shorter: without the instances' tails and stacks, with the root cause's failure only, bare."""
    failures = data.get("failures")
    failures = failures if isinstance(failures, list) else []
    untailed = [{**f, "tail": []} for f in failures if isinstance(f, dict)]
    yield dumps({**data, "failures": untailed, "stacks": {}}, sort_keys=True) + "\n"
    root = [f for f in untailed if f.get("index") == data.get("root_cause")]
    yield dumps({**data, "failures": root, "stacks": {}, "attempts": [], "truncated": {}, "slow_hosts": []},
                sort_keys=True) + "\n"
    error = data.get("error")
    if isinstance(error, dict):
        error = {**error, "message": str(error.get("message"))[:500], "diagnostics": []}
    yield dumps({**data, "failures": root[:1], "statuses": [], "stacks": {}, "attempts": [], "truncated": {},
                 "slow_hosts": [], "phases": {}, "launch_phases": {}, "error": error, "gave_up": "", "limit_text": ""},
                sort_keys=True) + "\n"


def _overwrite(path: str, data: bytes) -> None:
    """Write ``data`` over the start of the existing file ``path`` (its blocks are had already) and cut it there."""
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1 or info.st_uid != os.geteuid():
            raise OSError(1, "the room kept for the report is no longer the record's own file")  # EPERM
        done = 0
        while done < len(data):
            done += os.pwrite(fd, data[done:], done)
        os.ftruncate(fd, len(data))
    finally:
        os.close(fd)


def _write_new(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(text.encode(errors="surrogateescape"))
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def _write_whole(path: str, text: str) -> None:
    """Write the new file ``path`` whole, or not at all: under another name first, renamed once written."""
    folder, name = os.path.split(path)
    tmp = os.path.join(folder, f".{name}.{os.getpid()}")
    try:
        _write_new(tmp, text)
        os.replace(tmp, path)
    except FileExistsError:  # O_EXCL: a file already at that name is not ours, and stays
        raise
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)  # made by _write_new above (a full disk cut it short)
        raise


def event_line(event: Event, at: float) -> str:
    """Return ``event`` as one line of ``events.jsonl``: ``{"v":1,"event":KIND,"time":T,...}`` and a newline."""
    from poprun.core.events import to_dict
    data = to_dict(event)
    data = {"v": data.pop("v"), "event": data.pop("event"), "time": round(at, 6), **data}
    return mask_text(dumps(data)) + "\n"  # a URL's password in a reason or a variable (the pre-restart command)


def plan_data(plan: LaunchPlan) -> object:
    """Return the plan as JSON-ready data, exactly as ``poprun.planner.serde.to_dict`` (a test holds them equal)."""
    from poprun.core.rawbytes import to_json_data
    from poprun.planner.plan import leave_out_defaults

    data = _plain(plan)
    assert isinstance(data, dict)
    return to_json_data(leave_out_defaults(plan, data))


def _plain(value: object) -> object:
    if isinstance(value, Instance):
        data = {f.name: _plain(getattr(value, f.name)) for f in fields(Instance)
                if f.name != "env" and (f.name != "group" or value.group)}  # as serde: a group only under topology
        data["env"] = dict(value.env.set)
        data["env_forward"] = list(value.env.forward)
        data["env_unset"] = list(value.env.unset)
        return data
    if isinstance(value, LaunchPlan):  # as serde: the rank order only when it is not the given one
        return {f.name: _plain(getattr(value, f.name)) for f in fields(LaunchPlan)
                if f.name != "rank_order" or value.rank_order != NO_RANK_ORDER}
    if hasattr(type(value), "__record_fields__"):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(type(value))}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def run_order(root: str, names: Iterable[str]) -> list[str]:
    """
    Return the runs among ``names`` under ``root``, oldest first: poprun's directories (its mark) of this user.

    A name of other than printable ASCII (control characters, bytes that are not UTF-8) is none:
    poprun's ids are digits, letters and dashes.

    Ids sort by the second they began; runs of one second by when their mark was made (its
    mtime, set to the nanosecond: the random end of two ids says nothing of which began first).
    This is the order of ``poprun ps``, of ``last`` and of pruning.
    """
    uid = os.geteuid()
    found: list[tuple[str, int, str]] = []
    for name in names:
        if not (name.isascii() and name.isprintable()):  # never an id poprun made: not shown, not removed
            continue
        path = os.path.join(root, name)
        try:
            info = os.lstat(path)
            mark = os.lstat(os.path.join(path, MARK))
        except (OSError, ValueError):  # ValueError: a name with a NUL cannot be one
            continue
        if stat.S_ISDIR(info.st_mode) and info.st_uid == uid and stat.S_ISREG(mark.st_mode):
            found.append((name[:15], mark.st_mtime_ns, name))
    return [name for _, _, name in sorted(found)]


def prune(root: str, *, keep: int, but: str) -> None:
    """
    Remove the oldest runs under ``root`` beyond the newest ``keep``: only directories poprun made (its mark) and whose supervisor is gone.

    The order is :func:`run_order`'s (``poprun ps``'s). A directory without the mark (a run being
    made has none yet), another user's, or a link is never touched; a run's files are read as
    untrusted input (:func:`_gone`).
    """
    try:
        names = [n for n in os.listdir(root) if n != but]
    except OSError:
        return
    if len(names) < keep:  # fewer than keep, whatever they are: nothing to read
        return
    runs = run_order(root, names)
    for name in runs[:max(0, len(runs) - (keep - 1))]:
        _prune(root, name)


def _prune(root: str, name: str) -> None:
    """Remove the run ``name`` under ``root`` if it is still poprun's, this user's and its supervisor is gone."""
    path = os.path.join(root, name)
    try:
        fd = os.open(path, _DIRECTORY)  # never through a link
    except OSError:
        return
    try:
        info = os.fstat(fd)
        mark = os.stat(MARK, dir_fd=fd, follow_symlinks=False)
        if info.st_uid != os.geteuid() or not stat.S_ISREG(mark.st_mode) or not _gone(fd):
            return
        _empty(fd, info.st_dev)
    except OSError:
        return
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        os.rmdir(path)  # a link put there since is no directory: left as it is


def _gone(run: int) -> bool:
    """
    Return whether the run open as ``run`` is over: its supervisor is gone, or (on another host) its report is written.

    A supervisor file that is not a regular file of this user, not ``PID START HOST`` or
    larger than a line counts as gone: poprun always writes one before its mark.
    """
    data = _read_small(run, "supervisor")
    words = data.split() if data is not None else []
    if len(words) != 3 or not all(w.isdigit() and len(w) < 19 for w in words[:2]):  # noqa: PLR2004 - bytes: ASCII digits
        return True
    if words[2] != os.uname().nodename.encode():
        return _regular(run, "report.json")  # a shared home: over once its report is written
    return start_time(int(words[0])) != int(words[1])


def _read_small(run: int, name: str) -> bytes | None:
    """Return the bytes of ``name`` in the directory open as ``run``: a regular file of this user of at most a few KiB, or None."""
    try:
        fd = os.open(name, _READ, dir_fd=run)  # no link, no waiting on a FIFO
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_size > SMALL:
            return None
        return os.read(fd, SMALL)
    except OSError:
        return None
    finally:
        os.close(fd)


def _regular(run: int, name: str) -> bool:
    """Return whether ``name`` in the directory open as ``run`` is a regular file (not a link to one)."""
    try:
        return stat.S_ISREG(os.stat(name, dir_fd=run, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _remove_tree(path: str) -> None:
    """
    Remove the directory ``path`` and what it holds (``shutil`` costs the launch path start-up).

    Walked by descriptor, never following a link, the top included: a run directory swapped
    for a link after it was checked removes nothing outside it (:func:`_empty`).
    """
    try:
        fd = os.open(path, _DIRECTORY)
    except OSError:
        return
    try:
        _empty(fd, os.fstat(fd).st_dev)
    except OSError:
        pass
    finally:
        os.close(fd)
    with contextlib.suppress(OSError):
        os.rmdir(path)


def _empty(top: int, device: int) -> None:
    """
    Remove what the directory open as ``top`` holds, by descriptor, without recursion.

    A link is removed as a link; a directory on another file system (a mount) or deeper than
    :data:`DEPTH` is left as it is, and so are the directories holding it.
    """
    levels: list[tuple[int, str, set[str]]] = [(top, "", set())]  # (descriptor, name, subdirectories left alone)
    try:
        while levels:
            fd, name, kept = levels[-1]
            below = _unlink_files(fd, kept)
            if below is None:  # empty but for what is left alone: remove it from its parent
                levels.pop()
                if not levels:
                    return
                os.close(fd)
                parent, _, parent_kept = levels[-1]
                try:
                    os.rmdir(name, dir_fd=parent)
                except OSError:
                    parent_kept.add(name)
                continue
            try:
                child = os.open(below, _DIRECTORY, dir_fd=fd)
            except OSError:
                kept.add(below)
                continue
            if len(levels) >= DEPTH or os.fstat(child).st_dev != device:
                os.close(child)
                kept.add(below)
                continue
            levels.append((child, below, set()))
    finally:
        for fd, _, _ in levels[1:]:
            os.close(fd)


def _unlink_files(fd: int, kept: set[str]) -> str | None:
    """Unlink every entry of the directory open as ``fd`` that is no directory; return a subdirectory's name, or None."""
    below = None
    with os.scandir(fd) as entries:
        for entry in entries:
            if entry.name in kept:
                continue
            try:
                directory = entry.is_dir(follow_symlinks=False)
            except OSError:
                directory = False
            if directory:
                below = below or entry.name
                continue
            with contextlib.suppress(OSError):
                os.unlink(entry.name, dir_fd=fd)
    return below


def write_supervisor(path: str) -> None:
    """Record this process as the run's supervisor (after ``--detach`` forked it off): whole, replacing the last."""
    _write_whole(os.path.join(path, "supervisor"), f"{os.getpid()} {start_time(os.getpid())} {os.uname().nodename}\n")
