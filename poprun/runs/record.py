"""
Writing a run's record as it happens: its directory, plan, events, per-instance logs and report.

Layer: ``poprun.runs``; imports ``poprun.planner.plan`` and ``poprun.core``; no ``json`` (start-up:
:mod:`poprun.runs.jsontext`). The layout is in ``docs/runs.md``:

``RUNS/ID/``, mode 0700, made by this process (``mkdir``, never an existing directory):

- ``.poprun-run``: the mark that poprun made the directory (pruning removes nothing else);
- ``supervisor``: the pid, boot-relative start time and host of the poprun process that
  supervises the run, so that ``poprun ps`` tells a run whose supervisor died (lost) from
  one that runs, and ``poprun stop`` signals the right process;
- ``plan.json``: the plan as applied (the values added at apply time included; forwarded
  values by name only), in the format of ``poprun plan --format json``;
- ``events.jsonl``: one event per line, ``{"v": 1, "event": KIND, "time": UNIX_SECONDS, ...}``;
- ``logs/N.stdout``, ``logs/N.stderr``: instance N's output, whole lines, as it printed them,
  up to ``POPRUN_RUN_LOG_LIMIT`` bytes per instance (64 MiB by default); ``logs/order``: one
  ``N stream bytes`` line per piece written, so that ``poprun logs`` merges the instances'
  output in the order it arrived;
- ``attempts/K/logs/``: with restarts allowed (``--max-restarts``), each attempt's logs apart,
  ``K`` from 0; ``logs`` and ``latest`` are then links to the last attempt's (``attempts/K/logs``,
  ``attempts/K``), so that readers of ``logs/`` see the attempt that counts;
- ``actual.json``: what each instance ran as (:mod:`poprun.runs.verify`);
- ``report.json``: how the run ended (written last).

Nothing here may stop a launch: a record that cannot be made or written (a full disk, a
directory that is not the user's) becomes one warning, and the launch goes on without it.
"""

# ruff: noqa: PTH103, PTH105, PTH112, PTH114, PTH208, PTH211 - os.path, not pathlib: pathlib costs the launch path start-up
from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Mapping

from poprun.core.events import Event
from poprun.core.process import start_time
from poprun.core.record import fields
from poprun.core.secret import mask_text
from poprun.planner.plan import Instance, LaunchPlan
from poprun.runs.jsontext import dumps

RUNS_DIR = "POPRUN_RUNS_DIR"  # where runs are kept
KEEP = "POPRUN_RUNS_KEEP"  # how many runs are kept (100)
LOG_LIMIT = "POPRUN_RUN_LOG_LIMIT"  # bytes of output kept per instance (64 MiB)
RUN_ID = "POPRUN_RUN_ID"  # the run's id, in every instance's environment
DEFAULT_KEEP = 100
DEFAULT_LOG_LIMIT = 64 << 20
MARK = ".poprun-run"


class RecordError(OSError):
    """The run record could not be made: why, in one line."""


def runs_directory(environ: Mapping[str, str]) -> str:
    """Return where runs are kept: ``$POPRUN_RUNS_DIR``, else ``$XDG_STATE_HOME/poprun/runs``, else ``~/.local/state/...``."""
    if environ.get(RUNS_DIR):
        return environ[RUNS_DIR]
    state = environ.get("XDG_STATE_HOME") or os.path.join(environ.get("HOME") or os.path.expanduser("~"),  # noqa: PTH111, PTH118
                                                           ".local", "state")
    return os.path.join(state, "poprun", "runs")  # noqa: PTH118 - pathlib costs start-up


def _count(environ: Mapping[str, str], name: str, default: int) -> int:
    text = environ.get(name, "").strip()
    return int(text) if text.isdigit() else default


def new_id(now: float) -> str:
    """Return a new run id: the UTC time to the second and six random hex digits (ids sort by time)."""
    return time.strftime("%Y%m%d-%H%M%S", time.gmtime(now)) + "-" + os.urandom(3).hex()


def _user_directory(path: str) -> None:
    """Make ``path`` and its missing parents (0o700); refuse a link or another user's directory at its end."""
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
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
        self.warning: str | None = None  # why the record stopped being written, once
        self._log_limit = log_limit
        self._logged: dict[int, int] = {}  # instance -> bytes kept
        self._truncated: dict[int, int] = {}  # instance -> bytes dropped
        self._logs: dict[tuple[int, str], int] = {}  # (instance, stream) -> fd
        self._logs_dir = os.path.join(path, "logs")  # noqa: PTH118
        self._events = os.open(os.path.join(path, "events.jsonl"),  # noqa: PTH118
                               os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o600)
        self._order = -1
        self._closed = False
        self.on_truncated: list[tuple[int, int]] = []  # (instance, bytes kept) not yet told as an event
        self.phases: dict[str, float] = {}  # phase -> seconds (plan, partition, start, run, teardown)
        self.launch_phases: dict[str, float] = {}  # the backend's phases -> seconds (connect, preflight, start, first-output)
        self.slow_hosts: dict[str, tuple[float, int]] = {}  # host -> (seconds to connect, attempts), when slow
        self.observed: dict[int, dict[str, object]] = {}  # instance -> what it ran as (poprun.runs.verify)

    @classmethod
    def create(cls, environ: Mapping[str, str], *, now: float | None = None) -> RunRecord:
        """
        Make a new run directory under :func:`runs_directory`; prune old runs.

        Raises:
            RecordError: when it cannot be made (the caller warns and launches without a record).
        """
        now = time.time() if now is None else now
        root = runs_directory(environ)
        _user_directory(root)
        run_id = new_id(now)
        path = os.path.join(root, run_id)  # noqa: PTH118
        try:
            os.mkdir(path, 0o700)  # noqa: PTH102 - never an existing directory
            _write_new(os.path.join(path, MARK), "")  # noqa: PTH118
            write_supervisor(path)
            os.mkdir(os.path.join(path, "logs"), 0o700)  # noqa: PTH102, PTH118
            record = cls(run_id, path, log_limit=_count(environ, LOG_LIMIT, DEFAULT_LOG_LIMIT), started=now)
        except OSError as exc:
            raise RecordError(exc.errno, f"cannot write the run record in {path}: {exc.strerror}") from exc
        prune(root, keep=max(1, _count(environ, KEEP, DEFAULT_KEEP)), but=run_id)
        return record

    def write_plan(self, plan: LaunchPlan) -> None:
        """Write ``plan.json``: the plan as applied."""
        self._guard(lambda: _write_new(os.path.join(self.path, "plan.json"),  # noqa: PTH118
                                       dumps(plan_data(plan), indent=2, sort_keys=True) + "\n"))

    def event(self, event: Event, data: Mapping[str, object] | None = None) -> None:
        """Append ``event`` (with the time now) to ``events.jsonl``; ``data``: its JSON-ready form, when made already."""
        if self._closed:
            return
        self._time(event)
        line = event_line(event, time.time()) if data is None else mask_text(dumps(dict(data))) + "\n"
        self._guard(lambda: os.write(self._events, line.encode(errors="surrogateescape")))

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
            attempts = os.path.join(self.path, "attempts")  # noqa: PTH118
            if number == 0:
                os.mkdir(attempts, 0o700)  # noqa: PTH102
                os.rmdir(os.path.join(self.path, "logs"))  # noqa: PTH106, PTH118 - made empty by create(): replaced by a link
            os.mkdir(os.path.join(attempts, str(number)), 0o700)  # noqa: PTH102, PTH118
            os.mkdir(os.path.join(attempts, str(number), "logs"), 0o700)  # noqa: PTH102, PTH118
            self._logs_dir = os.path.join(attempts, str(number), "logs")  # noqa: PTH118
            self._logged.clear()
            self._truncated.clear()
            for name, target in (("logs", f"attempts/{number}/logs"), ("latest", f"attempts/{number}")):
                link = os.path.join(self.path, f".{name}.{os.getpid()}")  # noqa: PTH118
                os.symlink(target, link)
                os.replace(link, os.path.join(self.path, name))  # noqa: PTH118

        self._guard(begin)

    def _close_logs(self) -> None:
        for fd in (self._order, *self._logs.values()):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._order = -1
        self._logs.clear()

    def instance_lines(self, index: int, stream: str, data: bytes) -> None:
        """Keep whole lines of instance ``index``'s ``stream``, up to the limit per instance (the backend's thread)."""
        if self._closed:
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
            fd = self._logs[(index, stream)] = os.open(os.path.join(self._logs_dir, f"{index}.{stream}"),  # noqa: PTH118
                                                       os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND
                                                       | os.O_CLOEXEC, 0o600)
        if self._order < 0:
            self._order = os.open(os.path.join(self._logs_dir, "order"),  # noqa: PTH118
                                  os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o600)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.write(self._order, b"%d %s %d\n" % (index, stream.encode(), len(data)))

    def truncation(self) -> dict[int, tuple[int, int]]:
        """Return, for each instance whose log was cut, (bytes kept, bytes dropped)."""
        return {i: (self._logged.get(i, 0), dropped) for i, dropped in self._truncated.items()}

    def finish(self, report: Mapping[str, object]) -> None:
        """Write ``actual.json`` (what the instances ran as), then ``report.json`` (last), and close the record."""
        if not self._closed and self.observed:
            from poprun.runs.verify import actual_data

            self._guard(lambda: _write_new(os.path.join(self.path, "actual.json"),  # noqa: PTH118
                                           dumps(actual_data(self.observed), indent=2, sort_keys=True) + "\n"))
        if not self._closed:
            self._guard(lambda: _write_new(os.path.join(self.path, "report.json"),  # noqa: PTH118
                                           dumps(dict(report), indent=2, sort_keys=True) + "\n"))
        self.close()

    def close(self) -> None:
        """Close every file of the record (idempotent)."""
        self._closed = True
        self._close_logs()
        if self._events >= 0:
            with contextlib.suppress(OSError):
                os.close(self._events)
        self._events = -1

    def _guard(self, write: object) -> None:
        """Run ``write``; on failure (a full disk) stop writing the record and keep why, once."""
        try:
            write()  # type: ignore[operator]
        except OSError as exc:
            if self.warning is None:
                self.warning = f"cannot write the run record {self.path} ({exc.strerror or exc}): it stops here"
            self._closed = True


def _write_new(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        view = memoryview(text.encode(errors="surrogateescape"))
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def event_line(event: Event, at: float) -> str:
    """Return ``event`` as one line of ``events.jsonl``: ``{"v":1,"event":KIND,"time":T,...}`` and a newline."""
    from poprun.core.events import to_dict
    data = to_dict(event)
    data = {"v": data.pop("v"), "event": data.pop("event"), "time": round(at, 6), **data}
    return mask_text(dumps(data)) + "\n"  # a URL's password in a reason or a variable (the pre-restart command)


def plan_data(plan: LaunchPlan) -> object:
    """Return the plan as JSON-ready data, exactly as ``poprun.planner.serde.to_dict`` (a test holds them equal)."""
    from poprun.core.rawbytes import to_json_data

    return to_json_data(_plain(plan))


def _plain(value: object) -> object:
    if isinstance(value, Instance):
        data = {f.name: _plain(getattr(value, f.name)) for f in fields(Instance) if f.name != "env"}
        data["env"] = dict(value.env.set)
        data["env_forward"] = list(value.env.forward)
        data["env_unset"] = list(value.env.unset)
        return data
    if hasattr(type(value), "__record_fields__"):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(type(value))}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def prune(root: str, *, keep: int, but: str) -> None:
    """
    Remove the oldest runs under ``root`` beyond the newest ``keep``: only directories poprun made (its mark) and whose supervisor is gone.

    Run ids sort by time. A directory without the mark, another user's, or a link is never touched.
    """
    try:
        names = sorted((n for n in os.listdir(root) if n != but), reverse=True)
    except OSError:
        return
    uid = os.geteuid()
    for name in names[max(0, keep - 1):]:
        path = os.path.join(root, name)  # noqa: PTH118
        try:
            info = os.lstat(path)
            if not os.path.isdir(path) or os.path.islink(path) or info.st_uid != uid:
                continue
            os.lstat(os.path.join(path, MARK))  # noqa: PTH118 - poprun's mark, or not ours
        except OSError:
            continue
        if supervisor_alive(path):
            continue
        _remove_tree(path)


def _remove_tree(path: str) -> None:
    """
    Remove ``path`` and what it holds (``shutil`` costs the launch path start-up).

    Walked by descriptor, never following a link, the top included: a run directory swapped
    for a link after it was checked removes nothing outside it.
    """
    with contextlib.suppress(OSError):
        for _, dirs, files, fd in os.fwalk(path, topdown=False, follow_symlinks=False):
            for name in files:
                with contextlib.suppress(OSError):
                    os.unlink(name, dir_fd=fd)
            for name in dirs:  # a link to a directory is listed here, and removed as a link
                with contextlib.suppress(OSError):
                    try:
                        os.rmdir(name, dir_fd=fd)
                    except NotADirectoryError:
                        os.unlink(name, dir_fd=fd)
    with contextlib.suppress(OSError):
        os.rmdir(path)  # noqa: PTH106


def supervisor_alive(path: str) -> bool:
    """
    Return whether the process that supervises the run in ``path`` still runs (same pid, same start time).

    A run supervised on another host (a shared home) cannot be told from here: it counts as alive.
    """
    try:
        with open(os.path.join(path, "supervisor"), encoding="utf-8") as file:  # noqa: PTH118, PTH123
            pid_text, started, host = file.read().split()
    except (OSError, ValueError):
        return False
    if host != os.uname().nodename:
        return True
    return pid_text.isdigit() and str(start_time(int(pid_text))) == started


def write_supervisor(path: str) -> None:
    """Record this process as the run's supervisor (after ``--detach`` forked it off)."""
    tmp = os.path.join(path, f".supervisor.{os.getpid()}")  # noqa: PTH118
    _write_new(tmp, f"{os.getpid()} {start_time(os.getpid())} {os.uname().nodename}\n")
    os.replace(tmp, os.path.join(path, "supervisor"))  # noqa: PTH118
