"""
Finding and reading run records: what ``poprun ps``, ``logs``, ``report``, ``stop`` and ``attach`` read.

Layer: ``poprun.runs``; imports ``poprun.core`` (its :class:`~poprun.core.runinfo.RunInfo`, what the views draw) and
:mod:`poprun.runs.record`. Not on the launch
path: ``json`` is used freely here.

A record is untrusted input (another process wrote it, or someone planted it): every file is
opened without following a symbolic link and without blocking (a FIFO is refused, never waited
on), only a regular file of this user is read, and no more than a bound of it; a file that is
not what poprun writes (bad JSON, the wrong shape) is a PR602 diagnostic naming the file, never
a traceback. A run directory is one that poprun made (its mark, ``.poprun-run``), of this user,
not a link.
"""

from __future__ import annotations

import calendar
import json
import math
import os
import stat
import time
from collections.abc import Iterator, Mapping

from poprun.core.diagnostic import DiagnosticError, error
from poprun.core.process import start_time
from poprun.core.record import record
from poprun.core.runinfo import RunInfo, network_lines
from poprun.core.span import SourceSpan
from poprun.runs.record import run_order, runs_directory

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see poprun.core.record)
if TYPE_CHECKING:
    from typing import Any

JSON_LIMIT = 64 << 20  # plan.json of a large launch, report.json with every failed instance's tail
SMALL_LIMIT = 64 << 10  # the supervisor file, the first line of events.jsonl
LAST = "last"  # the RUN that names the newest run
CANDIDATES = 5  # how many run ids a diagnostic lists
LATEST = 253402300799  # 9999-12-31 23:59:59 UTC: a time in a record after it is not one


@record
class Supervisor:
    """The process that supervises a run: its pid, its start time (clock ticks since boot) and its host."""

    pid: int
    started: int
    host: str

    def alive(self) -> bool:
        """
        Return whether it still runs here (the same pid with the same start time); False on another host.

        A supervisor that has ended but is not reaped yet (a zombie: killed, its parent busy) runs no more.
        """
        return self.host == os.uname().nodename and start_time(self.pid, zombie=False) == self.started


def damaged(path: str, why: str, *, hint: str = "") -> DiagnosticError:
    """Return the PR602 error for a record file ``path`` that cannot be read (``why``, one line)."""
    return DiagnosticError([error(
        "PR602", "run record unreadable", detail=why, span=SourceSpan(file=path, key_path="$"),
        hint=hint or "the record was not written by poprun, or was changed since: remove the run's directory "
                     "(poprun keeps the others)")])


def open_record_file(path: str) -> int:
    """
    Return a descriptor of the record file ``path``: a regular file of this user, not a link, opened without blocking.

    Raises:
        FileNotFoundError: when it does not exist (yet).
        DiagnosticError: PR602 for anything else.
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as exc:
        why = "a symbolic link (poprun never follows one in a record)" if os.path.islink(path) else exc.strerror
        raise damaged(path, str(why)) from exc
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid():
        os.close(fd)
        raise damaged(path, "not a regular file" if not stat.S_ISREG(info.st_mode) else "it belongs to another user")
    return fd


def read_bytes(path: str, *, limit: int) -> bytes | None:
    """Return the bytes of the record file ``path`` (None when it does not exist); PR602 beyond ``limit`` bytes."""
    try:
        fd = open_record_file(path)
    except FileNotFoundError:
        return None
    try:
        chunks, size = [], 0
        while chunk := os.read(fd, min(1 << 20, limit + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > limit:
                raise damaged(path, f"larger than {limit >> 20 or limit} {'MiB' if limit >> 20 else 'bytes'}")
    except OSError as exc:
        raise damaged(path, exc.strerror or str(exc)) from exc
    finally:
        os.close(fd)
    return b"".join(chunks)


def read_json(path: str, *, limit: int = JSON_LIMIT) -> Any:
    """Return the JSON object in the record file ``path``, or None when it does not exist; PR602 when it is not one."""
    data = read_bytes(path, limit=limit)
    if data is None:
        return None
    try:
        value = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise damaged(path, "not UTF-8 text") from exc
    except ValueError as exc:
        raise damaged(path, f"not JSON ({exc})") from exc
    except RecursionError as exc:
        raise damaged(path, "JSON nested too deeply") from exc
    if not isinstance(value, dict):
        raise damaged(path, f"a JSON {type(value).__name__}, not an object")
    return value


def runs_root(environ: Mapping[str, str]) -> str:
    """Return where runs are kept (:func:`~poprun.runs.record.runs_directory`); PR602 when it is a link or not this user's."""
    root = runs_directory(environ)
    try:
        info = os.lstat(root)
    except FileNotFoundError:
        return root
    except OSError as exc:
        raise damaged(root, exc.strerror or str(exc)) from exc
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise damaged(root, "not a directory of its own (a symbolic link, or a file)",
                      hint="set POPRUN_RUNS_DIR to a directory of your own")
    if info.st_uid != os.geteuid():
        raise damaged(root, "it belongs to another user", hint="set POPRUN_RUNS_DIR to a directory of your own")
    return root


def run_ids(root: str) -> list[str]:
    """
    Return the ids of the runs under ``root``, oldest first: poprun's directories of this user.

    The order of :func:`poprun.runs.record.run_order`, which pruning keeps too: ids sort by the
    second they began; runs of one second by when their mark was made.
    """
    try:
        names = os.listdir(root)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise damaged(root, exc.strerror or str(exc)) from exc
    return run_order(root, names)


def find_run(root: str, given: str) -> str:
    """
    Return the id of the run ``given`` names: an id, a unique prefix of one, or ``last`` (the newest).

    Diagnostics:
        PR600 (no run matches, the newest ids listed), PR601 (a prefix of several, listed).
    """
    ids = run_ids(root)
    span = SourceSpan(file="<command line>", key_path="RUN")
    newest = ", ".join(reversed(ids[-CANDIDATES:]))
    if given == LAST and ids:
        return ids[-1]
    if given in ids:
        return given
    matches = [i for i in ids if i.startswith(given)] if given else []
    if len(matches) == 1:
        return matches[0]
    if matches:
        shown = ", ".join(matches[:CANDIDATES]) + (f" and {len(matches) - CANDIDATES} more" if len(matches) > CANDIDATES
                                                   else "")
        raise DiagnosticError([error("PR601", f"ambiguous run '{given}'", detail=f"'{given}' begins {len(matches)} run "
                                     f"ids: {shown}", span=span, hint="give more of the id")])
    detail = f"no run under {root} is '{given}'" if ids else f"no run is recorded under {root}"
    hint = (f"the newest: {newest} ('poprun ps --all' lists them all)" if ids
            else "launch one first; runs are kept under $POPRUN_RUNS_DIR, else $XDG_STATE_HOME/poprun/runs")
    raise DiagnosticError([error("PR600", f"no such run '{given}'", detail=detail, span=span, hint=hint)])


def read_supervisor(path: str) -> Supervisor | None:
    """Return the run's supervisor (its ``supervisor`` file), or None when the file is missing; PR602 when malformed."""
    name = os.path.join(path, "supervisor")
    data = read_bytes(name, limit=SMALL_LIMIT)
    if data is None:
        return None
    words = data.decode("utf-8", "replace").split()
    if len(words) != 3 or not all(w.isascii() and w.isdigit() and len(w) < 19 for w in words[:2]):  # noqa: PLR2004
        raise damaged(name, "not 'PID START HOST'")  # pid, start, host: the numbers in ASCII digits, in 64 bits
    return Supervisor(pid=int(words[0]), started=int(words[1]), host=words[2])


def supervised_here(supervisor: Supervisor | None) -> bool:
    """Return whether the supervisor runs on this host (a missing one is counted as here: it is gone)."""
    return supervisor is None or supervisor.host == os.uname().nodename


def ended(path: str) -> bool:
    """Return whether the run has written its report (it is over)."""
    return os.path.lexists(os.path.join(path, "report.json"))


def state_of(path: str) -> str:
    """Return ``ended``, ``running`` or ``lost`` (PR602 when the supervisor file is malformed)."""
    if ended(path):
        return "ended"
    supervisor = read_supervisor(path)
    if supervisor is not None and (supervisor.alive() or not supervised_here(supervisor)):
        return "running"
    return "lost"


def run_info(root: str, run_id: str) -> RunInfo:
    """Return what ``poprun ps`` shows of run ``run_id``; a record that cannot be read is ``damaged``, not an error."""
    path = os.path.join(root, run_id)
    try:
        return _info(run_id, path)
    except DiagnosticError as exc:
        problem = f"{exc.diagnostics[0].span.file}: {exc.diagnostics[0].detail}"
        return RunInfo(id=run_id, path=path, state="damaged", started=_id_time(run_id), problem=problem)


def _info(run_id: str, path: str) -> RunInfo:
    state = state_of(path)
    report = read_json(os.path.join(path, "report.json")) if state == "ended" else None
    plan = read_json(os.path.join(path, "plan.json"))
    status = _typed(report, "status", int, path) if report is not None else None
    finished = _typed(report, "ended", (int, float), path) if report is not None else None
    if finished is not None and not _a_time(finished):
        raise damaged(os.path.join(path, "report.json"), "'ended' is not a time")
    started = report.get("started") if report is not None else None
    if not _a_time(started):
        started = _first_event_time(path)
    if state == "lost":
        finished = _mtime(os.path.join(path, "events.jsonl"))
    incomplete = report.get("incomplete", "") if report is not None else ""
    if not isinstance(incomplete, str):
        raise damaged(os.path.join(path, "report.json"), "'incomplete' is not text")
    instances, hosts, argv, backend = _plan_summary(plan, os.path.join(path, "plan.json"))
    step, total, eta = read_progress(path) if state == "running" else (None, None, None)
    return RunInfo(id=run_id, path=path, state=state, status=status, started=started if started is not None
                   else _id_time(run_id), ended=finished, instances=instances, hosts=hosts, argv=argv,
                   backend=backend, incomplete=incomplete, step=step, total=total, eta_s=eta,
                   network=network_lines(plan))


PROGRESS_LIMIT = 4 << 20  # progress.json of some ten thousand instances


def read_progress(path: str) -> tuple[float | None, int | None, float | None]:
    """
    Return a running run's progress from its ``progress.json``: the least advanced step, its total, the largest ETA (s).

    Untrusted input, read as every record file is (no link, no FIFO, this user's, at most
    :data:`PROGRESS_LIMIT` bytes): anything that is not what poprun writes is no progress at all
    (None, None, None), never an error: the run is still listed.
    """
    try:
        data = read_json(os.path.join(path, "progress.json"), limit=PROGRESS_LIMIT)
    except DiagnosticError:
        return None, None, None
    instances = data.get("instances") if isinstance(data, dict) and data.get("v") == 1 else None
    if not isinstance(instances, list):
        return None, None, None
    steps: list[tuple[float, int | None]] = []
    etas: list[float] = []
    for item in instances:
        if not isinstance(item, dict):
            return None, None, None
        step, total, eta = item.get("step"), item.get("total"), item.get("eta_ms")
        if not (_finite(step) or step is None) or not (total is None or (type(total) is int and total >= 0)) \
                or not (eta is None or (_finite(eta) and eta >= 0)):
            return None, None, None
        if step is not None:
            steps.append((float(step), total))
        if eta is not None:
            etas.append(eta / 1000)
    if not steps:
        return None, None, None
    least = min(steps, key=lambda pair: pair[0])
    return least[0], least[1], max(etas) if etas else None


def _finite(value: object) -> bool:
    """Return whether ``value`` is a finite number a float holds (an int of 400 digits is not: no OverflowError)."""
    try:
        return type(value) in (int, float) and math.isfinite(value)  # type: ignore[arg-type] # a number, as checked
    except OverflowError:
        return False


def _a_time(value: object) -> bool:
    """Return whether ``value`` is a time (UNIX seconds) a record can hold: a finite number from 1970 to 9999."""
    return (isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= LATEST
            and math.isfinite(value))  # the range first: an int of 400 digits is out of it, not an OverflowError


def _typed(data: Mapping[str, Any], key: str, kind: type | tuple[type, ...], path: str) -> Any:
    value = data.get(key)
    if value is None or isinstance(value, bool) or not isinstance(value, kind):
        raise damaged(os.path.join(path, "report.json"), f"'{key}' is missing or of the wrong type")
    return value


def _plan_summary(plan: Any, name: str) -> tuple[int | None, tuple[str, ...], tuple[str, ...], str]:
    """Return the instances, hosts, instance 0's argv and the backend of ``plan.json`` (empty when it is missing)."""
    if plan is None:
        return None, (), (), ""
    from poprun.core.rawbytes import RawBytesError, from_json_data

    try:
        plan = from_json_data(plan)  # argv words that are not UTF-8 are {"$bytes": ...}
    except RawBytesError as exc:
        raise damaged(name, str(exc)) from exc
    try:
        instances = plan["instances"]
        hosts = tuple(plan["topology"]["hosts"])
        argv = tuple(instances[0]["argv"]) if instances else ()
        backend = plan["backend"]["name"]
        valid = (isinstance(instances, list) and isinstance(backend, str)
                 and all(isinstance(w, str) for w in (*hosts, *argv)))
    except (KeyError, TypeError, IndexError):
        valid = False
    if not valid:
        raise damaged(name, "not a plan poprun wrote (its instances, hosts or backend are missing)")
    return len(instances), hosts, argv, backend


def _first_event_time(path: str) -> float | None:
    """Return the time of the run's first event (``run-started``), or None."""
    name = os.path.join(path, "events.jsonl")
    try:
        fd = open_record_file(name)
    except FileNotFoundError:
        return None
    try:
        line = os.read(fd, SMALL_LIMIT).split(b"\n", 1)[0]
    except OSError:
        return None
    finally:
        os.close(fd)
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):
        return None
    at = value.get("time") if isinstance(value, dict) else None
    return float(at) if isinstance(at, int | float) and _a_time(at) else None


def _mtime(path: str) -> float | None:
    try:
        return os.lstat(path).st_mtime
    except OSError:
        return None


def _id_time(run_id: str) -> float | None:
    """Return the time a run id was made (to the second), or None when it is not poprun's form."""
    try:
        return float(calendar.timegm(time.strptime(run_id[:15], "%Y%m%d-%H%M%S")))
    except ValueError:
        return None


def list_runs(root: str) -> Iterator[RunInfo]:
    """Yield every run under ``root``, newest first."""
    for run_id in reversed(run_ids(root)):
        yield run_info(root, run_id)


_INT = (int,)
_OPT_INT = (int, type(None))
_REPORT_SHAPE: dict[str, tuple[type, ...]] = {
    "status": _INT, "statuses": (list,), "failures": (list,), "root_cause": _OPT_INT, "signals": (list,),
    "error": (dict, type(None)), "phases": (dict,), "truncated": (dict,), "run": (str, type(None)),
}
_FAILURE_SHAPE: dict[str, tuple[type, ...]] = {
    "index": _INT, "host": (str,), "pid": _OPT_INT, "exit_code": _OPT_INT, "signal": _OPT_INT, "stopped": (bool,),
    "lost": (bool,), "tail": (list,),
}


def checked_report(data: dict[str, Any], name: str) -> dict[str, Any]:
    """
    Return ``data`` (a ``report.json``) when it has the shape :func:`poprun.runs.report.report_data` writes.

    Diagnostics:
        PR602 naming the first key of the wrong type.
    """
    _check(data, _REPORT_SHAPE, name, "$")
    _each(data["statuses"], int, name, "$.statuses")
    _each(data["signals"], int, name, "$.signals")
    for i, failure in enumerate(data["failures"]):
        where = f"$.failures[{i}]"
        if not isinstance(failure, dict):
            raise damaged(name, f"{where} is not an object")
        _check(failure, _FAILURE_SHAPE, name, where)
        _each(failure["tail"], str, name, f"{where}.tail")
    error_ = data["error"]
    if error_ is not None:
        _check(error_, {"status": _INT, "message": (str,), "signal": _OPT_INT, "diagnostics": (list,)}, name, "$.error")
        for i, diagnostic in enumerate(error_["diagnostics"]):
            if not (isinstance(diagnostic, dict) and isinstance(diagnostic.get("code"), str)
                    and isinstance(diagnostic.get("summary"), str)):
                raise damaged(name, f"$.error.diagnostics[{i}] is not a code and a summary")
    for phase, seconds in data["phases"].items():
        if not isinstance(seconds, int | float) or isinstance(seconds, bool):
            raise damaged(name, f"$.phases.{phase} is not a number")
    launch = data.get("launch_phases", {})
    if not isinstance(launch, dict):
        raise damaged(name, "$.launch_phases is not an object")
    for phase, seconds in launch.items():
        if not isinstance(seconds, int | float) or isinstance(seconds, bool):
            raise damaged(name, f"$.launch_phases.{phase} is not a number")
    slow = data.get("slow_hosts", [])
    if not isinstance(slow, list):
        raise damaged(name, "$.slow_hosts is not a list")
    for i, host in enumerate(slow):
        if not (isinstance(host, dict) and isinstance(host.get("host"), str) and isinstance(host.get("attempts"), int)
                and isinstance(host.get("seconds"), int | float) and not isinstance(host.get("seconds"), bool)):
            raise damaged(name, f"$.slow_hosts[{i}] is not a host, its seconds and attempts")
    for index, sizes in data["truncated"].items():
        if not (isinstance(sizes, dict) and all(isinstance(sizes.get(k), int) for k in ("kept", "dropped"))):
            raise damaged(name, f"$.truncated.{index} is not kept and dropped bytes")
    _check_recovery(data, name)
    return data


_ATTEMPT_SHAPE: dict[str, tuple[type, ...]] = {"number": _INT, "status": _INT, "root_cause": _OPT_INT,
                                               "seconds": (int, float), "master_port": _INT, "next": (str,),
                                               "cause": (str,)}


def _check_recovery(data: dict[str, Any], name: str) -> None:
    """PR602 for the keys restarts and time limits added (optional: older reports lack them) of the wrong shape."""
    for key in ("gave_up", "limit", "limit_text"):
        if key in data and not isinstance(data[key], str):
            raise damaged(name, f"$.{key} is not text")
    attempts = data.get("attempts", [])
    if not isinstance(attempts, list):
        raise damaged(name, "$.attempts is not a list")
    for i, attempt in enumerate(attempts):
        if not isinstance(attempt, dict):
            raise damaged(name, f"$.attempts[{i}] is not an object")
        _check(attempt, _ATTEMPT_SHAPE, name, f"$.attempts[{i}]")
    stacks = data.get("stacks", {})
    if not isinstance(stacks, dict) or not all(k.isascii() and k.isdigit() and len(k) < 10 and isinstance(v, str)  # noqa: PLR2004
                                               for k, v in stacks.items()):
        raise damaged(name, "$.stacks is not an object of instance indices and text")
    if not isinstance(data.get("incomplete", ""), str):
        raise damaged(name, "$.incomplete is not text")


def _check(data: dict[str, Any], shape: dict[str, tuple[type, ...]], name: str, where: str) -> None:
    for key, kinds in shape.items():
        value = data.get(key)
        bad_bool = isinstance(value, bool) and bool not in kinds
        if key not in data or bad_bool or not isinstance(value, kinds):
            raise damaged(name, f"{where}.{key} is missing or of the wrong type")


def _each(values: list[Any], kind: type, name: str, where: str) -> None:
    if not all(isinstance(v, kind) and not (isinstance(v, bool) and kind is not bool) for v in values):
        raise damaged(name, f"{where} holds a value that is not {'a number' if kind is int else 'text'}")


_ORDER_LINE = 64  # a line of logs/order: "INDEX STREAM BYTES"
_PIECE = 1 << 20  # output is handed on in pieces of at most this many bytes
_STREAMS = ("stdout", "stderr")


class LogReader:
    """
    A run's output in the order it arrived, read from ``logs/order`` and the instances' files.

    Each call of :meth:`pieces` yields what was written since the last one, so that it also
    follows a run as it goes (``poprun logs -f``). Only ``instance``'s pieces when given. The
    record writes a piece's bytes before its line in ``logs/order``, so a piece that is listed is
    whole. A listing that names more bytes than a file holds, or a line that is not
    ``INDEX STREAM BYTES``, is PR602.
    """

    def __init__(self, path: str, *, instance: int | None = None, attempt: int | None = None) -> None:
        # attempt K of a run that could restart: attempts/K/logs; else logs (the last attempt's, a link then)
        self._path, self._instance = path if attempt is None else os.path.join(path, "attempts", str(attempt)), instance
        self._run = path
        self.instance = instance
        self._order: int | None = None
        self._pending = b""
        self._line = 0
        self._files: dict[tuple[int, str], int] = {}

    def pieces(self) -> Iterator[tuple[int, str, bytes]]:
        """Yield (instance, stream, bytes) for each piece listed since the last call, in order."""
        for index, stream, size in self._listed():
            if self._instance is not None and index != self._instance:
                continue
            yield from self._read(index, stream, size)

    def last_lines(self, count: int) -> list[tuple[int, str, bytes]]:
        """
        Return the last ``count`` lines (each with its newline) of what :meth:`pieces` yields now.

        Lines of any length come back whole: while reading, only where each line starts and
        ends in its file is kept; the last ``count`` lines are read again at the end.
        """
        import collections
        import itertools

        if not count:
            return []
        kept: collections.deque[tuple[int, str, int, int]] = collections.deque(maxlen=count)
        at: dict[tuple[int, str], int] = {}  # where in its file the next piece starts
        starts: dict[tuple[int, str], int] = {}  # where the line not ended yet starts
        for index, stream, data in self.pieces():
            key = (index, stream)
            offset = at.get(key, 0)
            at[key] = offset + len(data)
            newlines: list[int] = []  # the piece's last count + 1 newlines at most, from the last
            found = len(data)
            while len(newlines) <= count and (found := data.rfind(b"\n", 0, found)) >= 0:
                newlines.append(offset + found + 1)
            if not newlines:
                continue
            newlines.reverse()
            if len(newlines) <= count:  # every newline of the piece: its first line began before it
                newlines.insert(0, starts.get(key, 0))
            kept.extend((index, stream, start, end) for start, end in itertools.pairwise(newlines))
            starts[key] = newlines[-1]
        return [(index, stream, os.pread(self._files[(index, stream)], end - start, start))
                for index, stream, start, end in kept]

    def close(self) -> None:
        """Close every file (idempotent)."""
        for fd in [self._order, *self._files.values()]:
            if fd is not None:
                os.close(fd)
        self._order = None
        self._files.clear()

    def _listed(self) -> Iterator[tuple[int, str, int]]:
        name = os.path.join(self._path, "logs", "order")
        if self._order is None:
            self._inside()
            try:
                self._order = open_record_file(name)
            except FileNotFoundError:
                return
        while chunk := os.read(self._order, _PIECE):
            lines = (self._pending + chunk).split(b"\n")
            self._pending = lines.pop()
            if len(self._pending) > _ORDER_LINE:
                raise damaged(name, f"line {self._line + len(lines) + 1} is not 'INDEX STREAM BYTES'")
            for line in lines:
                self._line += 1
                yield self._entry(name, line)

    def _inside(self) -> None:
        """PR602 when the logs read (``logs``, a link to the last attempt's, or ``attempts/K``) lead out of the run."""
        logs = os.path.join(self._path, "logs")
        run = os.path.realpath(self._run)
        if not os.path.realpath(logs).startswith(run + os.sep):
            raise damaged(logs, "a link out of the run's directory (poprun reads a run's logs only within it)")

    def _entry(self, name: str, line: bytes) -> tuple[int, str, int]:
        words = line.decode("ascii", "replace").split()
        if len(words) != 3 or not words[0].isdigit() or words[1] not in _STREAMS or not words[2].isdigit():  # noqa: PLR2004
            raise damaged(name, f"line {self._line} is not 'INDEX STREAM BYTES'")
        return int(words[0]), words[1], int(words[2])

    def _read(self, index: int, stream: str, size: int) -> Iterator[tuple[int, str, bytes]]:
        name = os.path.join(self._path, "logs", f"{index}.{stream}")
        fd = self._files.get((index, stream))
        if fd is None:
            try:
                fd = self._files[(index, stream)] = open_record_file(name)
            except FileNotFoundError:
                raise damaged(name, "missing, though logs/order lists its output") from None
        while size > 0:
            data = os.read(fd, min(size, _PIECE))
            if not data:
                raise damaged(name, "shorter than logs/order says")
            size -= len(data)
            yield index, stream, data
