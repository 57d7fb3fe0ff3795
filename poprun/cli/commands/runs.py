"""
``poprun ps``, ``logs``, ``report``, ``stop`` and ``attach``: commands over the records of runs.

Layer: ``poprun.cli``. The records are read by :mod:`poprun.runs.store` (untrusted input: every
problem is a diagnostic). RUN is a run id, a unique prefix of one, or ``last`` (the newest run).
Exit statuses: 0; 2 for a command-line error or a record that cannot be read (PR600-PR602,
PR605); 1 when the run is not in a state the command can act on (PR603, PR604, PR607, PR608, PR618);
``attach`` ends with the run's own status, or 130 when detached with Ctrl-C; 141 when stdout
was closed (``poprun logs RUN | head``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Iterable

from poprun.cli import exitcode
from poprun.cli.session import Session
from poprun.core.diagnostic import Diagnostic, DiagnosticError, error
from poprun.core.exitstatus import BROKEN_PIPE as BROKEN
from poprun.core.exitstatus import NOT_NOW
from poprun.core.hint import did_you_mean
from poprun.core.rawbytes import shell_join
from poprun.core.secret import mask_text
from poprun.core.span import SourceSpan
from poprun.runs import store

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see poprun.core.record)
if TYPE_CHECKING:
    from poprun.backends.base import Stream

RECENT = 10  # ended runs that ``poprun ps`` shows without --all
POLL_S = 0.1  # how often ``logs -f`` and ``attach`` look for more output
STOP_WAIT_S = 15.0  # how long ``poprun stop`` waits for the run to end: poprun's grace period (5 s) and some
_USAGE = {
    "ps": "poprun ps [--all] [--json]",
    "logs": "poprun logs RUN [--instance N] [--attempt K] [-f] [--tail N] [--tag]",
    "report": "poprun report RUN [--json]",
    "stop": "poprun stop RUN [--timeout SECONDS]",
    "attach": "poprun attach RUN",
}


def _arguments(command: str, args: list[str], flags: dict[str, str], values: dict[str, str], *,
               run: bool) -> tuple[str | None, dict[str, str]]:
    """
    Return RUN and the options given (``flags`` and ``values`` map each spelling to its name).

    Diagnostics:
        PR101 (unknown option or extra word), PR104 (option without its value), PR600 (no RUN).
    """
    known = {**flags, **values, "--help": "help", "-h": "help"}
    given: dict[str, str] = {}
    words: list[str] = []
    i = 0
    while i < len(args):
        word = args[i]
        name, eq, attached = word.partition("=") if word.startswith("--") else (word, "", "")
        if not word.startswith("-") or word == "-":
            words.append(word)
        elif name in values:
            if not eq and i + 1 >= len(args):
                raise _usage("PR104", f"option '{name}' needs a value", command, f"'{name}' is the last word",
                             f"write {name}=VALUE")
            given[values[name]] = attached if eq else args[i + 1]
            i += 0 if eq else 1
        elif name in known:
            given[known[name]] = ""
        else:
            guess = did_you_mean(name, [k for k in known if k.startswith("--")])
            raise _usage("PR101", f"unknown option '{name}'", command, f"'poprun {command}' has no option '{name}'",
                         f"did you mean '{guess}'?" if guess else f"usage: {_USAGE[command]}")
        i += 1
    if "help" in given:
        return None, given
    if len(words) > int(run):
        raise _usage("PR101", f"unexpected word '{words[int(run)]}'", command, f"usage: {_USAGE[command]}",
                     f"usage: {_USAGE[command]}")
    if run and not words:
        raise DiagnosticError([error("PR600", "no run named", detail=f"usage: {_USAGE[command]}",
                                     span=SourceSpan(file="<command line>", key_path="RUN"),
                                     hint="name a run: its id, a unique prefix of it, or 'last' ('poprun ps' lists them)")])
    return (words[0] if words else None), given


def _usage(code: str, summary: str, command: str, detail: str, hint: str) -> DiagnosticError:
    return DiagnosticError([error(code, summary, detail=detail, span=SourceSpan.flag(command), hint=hint)])


def _count(given: dict[str, str], name: str, flag: str, *, least: int = 0) -> int | None:
    """Return the whole number given for ``flag`` (None when not given); PR105 when it is not one."""
    text = given.get(name)
    if text is None:
        return None
    digits = text.strip()
    if not (digits.isascii() and digits.isdigit()) or int(digits[:19]) < least:
        raise DiagnosticError([error("PR105", f"invalid value for {flag}", detail=f"'{_printable(text[:40])}' is not "
                                     "a whole number" + (f" of {least} or more" if least else ""),
                                     span=SourceSpan.flag(flag), hint=f"write e.g. {flag}=10")])
    return int(digits) if len(digits) < 19 else 10 ** 18  # noqa: PLR2004 - beyond any count or time: no int of a megabyte


def _help(command: str) -> int:
    sys.stdout.write(f"usage: {_USAGE[command]}\n")
    return exitcode.OK


def _found(given: str) -> tuple[str, str]:
    """Return the id and directory of the run ``given`` names (PR600, PR601, PR602)."""
    root = store.runs_root(os.environ)
    run_id = store.find_run(root, given)
    return run_id, os.path.join(root, run_id)  # noqa: PTH118


def _printable(text: str) -> str:
    """Return ``text`` with control characters escaped, so that a record cannot rewrite the terminal."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


# ---------------------------------------------------------------- ps


def ps(args: list[str], _session: Session) -> int:
    """``poprun ps [--all] [--json]``: the running runs and the last ended ones (every run with --all), newest first."""
    _, given = _arguments("ps", args, {"--all": "all", "-a": "all", "--json": "json"}, {}, run=False)
    if "help" in given:
        return _help("ps")
    runs = list(store.list_runs(store.runs_root(os.environ)))
    if "all" not in given:
        ended = [r for r in runs if r.state != "running"][:RECENT]
        runs = [r for r in runs if r.state == "running" or r in ended]
    now = time.time()
    if "json" in given:
        import json

        rows = [{"id": r.id, "state": r.state, "status": r.status, "started": r.started, "ended": r.ended,
                 "duration": r.duration(now), "instances": r.instances, "hosts": list(r.hosts), "argv": list(r.argv),
                 "backend": r.backend, "path": r.path, "problem": r.problem or None,
                 "incomplete": r.incomplete or None} for r in runs]
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return exitcode.OK
    sys.stdout.write(render_ps(runs, now))
    return exitcode.OK


def render_ps(runs: Iterable[store.RunInfo], now: float) -> str:
    """Return the ``poprun ps`` table: id, state, start, duration, instances, hosts, program."""
    from poprun.core.hostlist import compress

    rows = [("RUN", "STATE", "STARTED", "DURATION", "INSTANCES", "HOSTS", "PROGRAM")]
    for run in runs:
        state = f"ended {run.status}" if run.state == "ended" else run.state
        state += ", record incomplete" if run.incomplete else ""
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.started)) if run.started else "-"
        program = mask_text(shell_join(run.argv)) if run.argv else (run.problem or "-")
        rows.append((run.id, state, started, _duration(run.duration(now)),
                     "-" if run.instances is None else str(run.instances),
                     _printable(_hosts(run.hosts, compress)) if run.hosts else "-", _printable(program)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return "".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1] + "\n"
                   for row in rows)


def _hosts(hosts: tuple[str, ...], compress: Callable[[Iterable[str]], str]) -> str:
    """Return ``hosts`` as a host list (``pod[1-4]``), or listed as they are when they are no host names (a record changed)."""
    try:
        return compress(hosts)
    except ValueError:  # HostlistError
        return ",".join(hosts)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 60:  # noqa: PLR2004
        return f"{seconds:.1f} s"
    minutes, second = divmod(int(seconds), 60)
    hours, minute = divmod(minutes, 60)
    return f"{hours} h {minute} min" if hours else f"{minute} min {second} s"


# ---------------------------------------------------------------- logs and attach


class _Out:
    """Writes a run's output to fds 1 and 2 (``write``), tagged like mpirun's --tag-output when asked."""

    def __init__(self, *, tag: bool, write: Callable[[Stream, bytes], None] | None = None) -> None:
        self._tag = tag
        self._at_start: dict[tuple[int, str], bool] = {}
        self.write = write or _write

    def piece(self, index: int, stream: str, data: bytes) -> None:
        if self._tag and data:
            prefix = b"[1,%d]<%s>:" % (index, stream.encode())
            start = self._at_start.get((index, stream), True)
            body = data[:-1].replace(b"\n", b"\n" + prefix) + data[-1:]
            data = (prefix if start else b"") + body
            self._at_start[(index, stream)] = data.endswith(b"\n")
        self.write("stdout" if stream == "stdout" else "stderr", data)


def _write(stream: Stream, data: bytes) -> None:
    fd, view = (1 if stream == "stdout" else 2), memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def logs(args: list[str], _session: Session) -> int:
    """``poprun logs RUN [--instance N] [-f] [--tail N] [--tag]``: the run's output, merged in arrival order or one instance's."""
    given_run, given = _arguments("logs", args, {"-f": "follow", "--follow": "follow", "--tag": "tag"},
                                  {"--instance": "instance", "-i": "instance", "--tail": "tail", "-n": "tail",
                                   "--attempt": "attempt"}, run=True)
    if given_run is None:
        return _help("logs")
    instance, tail = _count(given, "instance", "--instance"), _count(given, "tail", "--tail")
    attempt = _count(given, "attempt", "--attempt")
    _, path = _found(given_run)
    _check_instance(path, instance)
    _check_attempt(path, attempt)
    reader = store.LogReader(path, instance=instance, attempt=attempt)
    out = _Out(tag="tag" in given)
    try:
        _show(reader, out, tail=tail)
        if "follow" in given:
            _follow(reader, out, path)
        else:
            _note_truncation(path, instance)
        _note_incomplete(path)
    except BrokenPipeError:
        return BROKEN
    return exitcode.OK


def _check_attempt(path: str, attempt: int | None) -> None:
    """PR609 when the run has no attempt ``attempt`` (it could not restart, or did not that often)."""
    if attempt is None or os.path.isdir(os.path.join(path, "attempts", str(attempt))):  # noqa: PTH112, PTH118
        return
    try:
        kept = sorted(int(n) for n in os.listdir(os.path.join(path, "attempts")) if n.isdigit())  # noqa: PTH118, PTH208
    except OSError:
        kept = []
    have = f"attempts 0 to {kept[-1]}" if kept else "no attempts kept apart (it could not restart)"
    raise DiagnosticError([error("PR609", f"no attempt {attempt} in the run",
                                 detail=f"run {os.path.basename(path)} has {have}",  # noqa: PTH119
                                 span=SourceSpan.flag("--attempt"),
                                 hint=f"give --attempt a number from 0 to {kept[-1]}" if kept
                                 else "drop --attempt: the run's logs are its only attempt's")])


def _check_instance(path: str, instance: int | None) -> None:
    """PR605 when ``instance`` is not an instance of the run's plan."""
    if instance is None:
        return
    count = store.run_info(os.path.dirname(path), os.path.basename(path)).instances  # noqa: PTH119, PTH120
    if count is not None and instance >= count:
        raise DiagnosticError([error("PR605", f"no instance {instance} in the run",
                                     detail=f"run {os.path.basename(path)} has {count} instance"  # noqa: PTH119
                                     f"{'' if count == 1 else 's'}, 0 to {count - 1}",
                                     span=SourceSpan.flag("--instance"),
                                     hint=f"give --instance a number from 0 to {count - 1}")])


def _show(reader: store.LogReader, out: _Out, *, tail: int | None) -> None:
    """Write what the record holds now: everything, or the last ``tail`` lines."""
    if tail is None:
        for index, stream, data in reader.pieces():
            out.piece(index, stream, data)
        return
    for index, stream, line in reader.last_lines(tail):
        out.piece(index, stream, line)


def _follow(reader: store.LogReader, out: _Out, path: str, *, tick: Callable[[], None] | None = None) -> None:
    """Write the output as it arrives until the run is over (its report written, or its supervisor gone)."""
    attempt = _attempt_link(path)
    while True:
        over = store.state_of(path) != "running"
        for index, stream, data in reader.pieces():
            out.piece(index, stream, data)
        now = _attempt_link(path)
        if now != attempt:  # the run restarted: follow the new attempt's logs from their start
            attempt, reader = now, store.LogReader(path, instance=reader.instance)
            continue
        if over:
            return
        if tick is not None:
            tick()
        time.sleep(POLL_S)


def _attempt_link(path: str) -> str:
    """Return where the run's ``logs`` link points (the current attempt's logs), or "" when it is no link."""
    try:
        return os.readlink(os.path.join(path, "logs"))  # noqa: PTH115, PTH118
    except OSError:
        return ""


def _note_truncation(path: str, instance: int | None) -> None:
    """Say on stderr which instances' output the record cut (POPRUN_RUN_LOG_LIMIT)."""
    report = store.read_json(os.path.join(path, "report.json"))  # noqa: PTH118
    cut = report.get("truncated") if report is not None else None
    if not isinstance(cut, dict):
        return
    for key, sizes in sorted(cut.items()):
        if (instance is None or key == str(instance)) and isinstance(sizes, dict):
            sys.stderr.write(f"poprun: instance {_printable(key)}'s output was cut at {sizes.get('kept')} bytes "
                             f"(POPRUN_RUN_LOG_LIMIT): {sizes.get('dropped')} bytes are not in the record\n")


def _note_incomplete(path: str) -> None:
    """Say on stderr when the record stops short of the run's end (a full disk): the output after that is not in it."""
    why = store.run_info(os.path.dirname(path), os.path.basename(path)).incomplete  # noqa: PTH119, PTH120
    if why:
        sys.stderr.write(f"poprun: {_incomplete(why)}\n")


def _incomplete(why: str) -> str:
    return (f"record incomplete ({_printable(why)}): it stops where it could no longer be written; what came after "
            "is not in it, but the report keeps how the run ended")


def attach(args: list[str], session: Session) -> int:
    """``poprun attach RUN``: follow a running run's output with a status line; Ctrl-C detaches (130), the run goes on."""
    given_run, _ = _arguments("attach", args, {}, {}, run=True)
    if given_run is None:
        return _help("attach")
    run_id, path = _found(given_run)
    return _run_state_command(lambda: _attach(run_id, path))(session)


def _attach(run_id: str, path: str) -> int:
    _require_running(run_id, path, "attach")
    from poprun.cli.progress import Console

    info = store.run_info(os.path.dirname(path), run_id)  # noqa: PTH120
    console = Console()
    took = info.duration(time.time())
    since = time.monotonic() - took if took is not None else None
    count = f"{info.instances} instance{'' if info.instances == 1 else 's'}" if info.instances else "its instances"
    text = f"attached to {run_id}: running {count}"
    console.status(text, since=since)
    reader = store.LogReader(path)
    try:
        _show(reader, _Out(tag=False, write=console.write), tail=None)
        _follow(reader, _Out(tag=False, write=console.write), path, tick=lambda: console.status(text, since=since))
    except KeyboardInterrupt:
        console.close()
        sys.stderr.write(f"poprun: detached from {run_id}: it goes on running ('poprun attach {run_id}' "
                         f"to come back, 'poprun stop {run_id}' to stop it)\n")
        return exitcode.INTERRUPTED
    finally:
        console.close()
    return _ending_status(run_id, path)


def _ending_status(run_id: str, path: str) -> int:
    """Return the status the run ended with (its report), saying so when its supervisor was lost."""
    report = store.read_json(os.path.join(path, "report.json"))  # noqa: PTH118
    if report is None:
        sys.stderr.write(f"poprun: run {run_id} was lost: its supervisor ended without a report\n")
        return exitcode.LAUNCH
    status = report.get("status")
    return status if isinstance(status, int) and not isinstance(status, bool) and 0 <= status <= 255 else 1  # noqa: PLR2004


def _require_running(run_id: str, path: str, command: str) -> store.Supervisor | None:
    """Return the run's supervisor; PR603 when the run has ended or was lost."""
    state = store.state_of(path)
    if state == "running":
        return store.read_supervisor(path)
    if state == "ended":
        report = store.read_json(os.path.join(path, "report.json"))  # noqa: PTH118
        detail = f"run {run_id} has ended with status {report.get('status')}"
    else:
        detail = f"run {run_id} was lost: its supervisor ended without writing a report"
    raise _not_now([error("PR603", "run is not running", detail=detail, span=SourceSpan.flag("RUN"),
                          hint=f"'poprun report {run_id}' tells how it ended, 'poprun logs {run_id}' shows its output"
                          if command != "report" else "")])


class _NotNowError(DiagnosticError):
    """A diagnostic that ends the command with status 1: the run is not in a state the command can act on."""


def _not_now(diagnostics: list[Diagnostic]) -> _NotNowError:
    return _NotNowError(diagnostics)


def _run_state_command(body: Callable[[], int]) -> Callable[[Session], int]:
    def run(session: Session) -> int:
        try:
            return body()
        except _NotNowError as exc:
            session.report(exc.diagnostics)
            return NOT_NOW
    return run


# ---------------------------------------------------------------- report


def report(args: list[str], session: Session) -> int:
    """``poprun report RUN [--json]``: how the run ended (the failure report again), its phases and truncation."""
    given_run, given = _arguments("report", args, {"--json": "json"}, {}, run=True)
    if given_run is None:
        return _help("report")
    run_id, path = _found(given_run)
    return _run_state_command(lambda: _report(run_id, path, as_json="json" in given))(session)


def _report(run_id: str, path: str, *, as_json: bool) -> int:
    name = os.path.join(path, "report.json")  # noqa: PTH118
    data = store.read_json(name)
    if data is None:
        state = store.state_of(path)
        if as_json:
            raise _not_now([error("PR608", "run has no report yet", detail=f"run {run_id} is {state}: its report is "
                                  "written when it ends" if state == "running" else f"run {run_id} was lost: its "
                                  "supervisor ended without writing a report", span=SourceSpan.flag("RUN"),
                                  hint=f"'poprun ps' shows its state; 'poprun logs {run_id}' its output")])
        sys.stdout.write(_header(run_id, path, None))
        return exitcode.OK
    checked = store.checked_report(data, name)
    if as_json:
        import json

        sys.stdout.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
        return exitcode.OK
    sys.stdout.write(_header(run_id, path, checked) + render_report(checked) + _verified(path))
    return exitcode.OK


def _verified(path: str) -> str:
    """
    Return what ``actual.json`` says of each instance against the plan: one line when all is as planned.

    ``verified: 4 of 4 instances as planned (argv, environment, CPUs)``, else a line per
    instance that differs (the names of variables, never their values) and how many were not
    read back (other hosts, or ended before they could be).
    """
    data = store.read_json(os.path.join(path, "actual.json"))  # noqa: PTH118
    instances = data.get("instances") if isinstance(data, dict) else None
    if not isinstance(instances, dict) or not instances:
        return ""
    lines, same, unread = [], 0, 0
    def number(item: tuple[str, object]) -> int:
        return int(item[0]) if item[0].isascii() and item[0].isdigit() and len(item[0]) < 10 else -1  # noqa: PLR2004

    for index, seen in sorted(instances.items(), key=number):
        if not isinstance(seen, dict) or seen.get("verified") is not True:
            unread += 1
            continue
        wrong = [what for what, key in (("argv", "argv_as_planned"), ("environment", "env_as_planned"),
                                        ("CPUs", "cpus_as_planned")) if seen.get(key) is not True]
        if not wrong:
            same += 1
            continue
        differ = seen.get("env_differs")
        names = f" ({', '.join(_printable(str(n)) for n in differ)})" if isinstance(differ, list) and differ else ""
        lines.append(f"  instance {_printable(str(index))} on {_printable(str(seen.get('host')))}: "
                     f"{', '.join(wrong)} not as planned{names if 'environment' in wrong else ''}\n")
    total = len(instances)
    head = f"verified: {same} of {total} instance{'' if total == 1 else 's'} as planned (argv, environment, CPUs)"
    if unread:
        head += f"; {unread} not read back (on other hosts, or ended before they could be)"
    return head + "\n" + "".join(lines)


def _header(run_id: str, path: str, data: dict[str, object] | None) -> str:
    info = store.run_info(os.path.dirname(path), run_id)  # noqa: PTH120
    state = f"ended with status {data.get('status')}" if data is not None else info.state
    if info.state == "lost":
        state = "lost: its supervisor ended without writing a report"
    lines = [f"run {run_id}: {state}"]
    if info.started is not None:
        took = _duration(info.duration(time.time()))
        lines.append(f"started {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(info.started))}, "
                     f"{'running' if info.state == 'running' else 'ran'} {took}")
    if info.incomplete:
        lines.append(_incomplete(info.incomplete))
    if info.instances is not None:
        hosts = ", ".join(info.hosts) or "-"
        lines.append(f"{info.instances} instance{'' if info.instances == 1 else 's'} on {_printable(hosts)} "
                     f"({info.backend} backend): {_printable(mask_text(shell_join(info.argv)))}")
    return "".join(f"{line}\n" for line in lines)


def render_report(data: dict[str, object]) -> str:
    """Return the report of a run that ended: the failure report (as poprun printed it), the phases, truncation."""
    from poprun.render.outcome import render_outcome
    from poprun.runs.report import result_of

    result = result_of(data)
    error_ = data.get("error")
    if isinstance(error_, dict) and not error_.get("message") and error_.get("diagnostics"):
        from poprun.core.outcome import ApplyError
        from poprun.core.record import evolve

        told = "; ".join(f"error[{d['code']}]: {d['summary']}" for d in error_["diagnostics"])
        assert result.error is not None
        result = evolve(result, error=ApplyError(status=result.error.status, message=told, signal=result.error.signal))
    parts = [render_outcome(result)]
    phases = data.get("phases")
    if isinstance(phases, dict) and phases:
        order = ("plan", "partition", "start", "run", "teardown")
        named = sorted(phases, key=lambda p: (order.index(p) if p in order else len(order), p))
        parts.append("phases: " + ", ".join(f"{_printable(p)} {phases[p]:.3f} s" for p in named) + "\n")
    launch = data.get("launch_phases")
    if isinstance(launch, dict) and launch:
        parts.append("launch: " + ", ".join(f"{_printable(p)} {launch[p]:.3f} s" for p in launch) + "\n")
    slow = data.get("slow_hosts")
    if isinstance(slow, list) and slow:
        parts.append("slow hosts: " + ", ".join(f"{_printable(h['host'])} {h['seconds']:.2f} s" for h in slow) + "\n")
    truncated = data.get("truncated")
    if isinstance(truncated, dict):
        parts.extend(f"instance {_printable(i)}: output cut at {v['kept']} bytes, {v['dropped']} bytes not kept "
                     "(POPRUN_RUN_LOG_LIMIT)\n" for i, v in sorted(truncated.items()))
    return "".join(parts)


# ---------------------------------------------------------------- stop


def stop(args: list[str], session: Session) -> int:
    """``poprun stop RUN [--timeout S]``: stop every instance of the run as Ctrl-C would (SIGTERM, grace, SIGKILL)."""
    given_run, given = _arguments("stop", args, {}, {"--timeout": "timeout"}, run=True)
    if given_run is None:
        return _help("stop")
    timeout = _count(given, "timeout", "--timeout")
    run_id, path = _found(given_run)
    return _run_state_command(lambda: _stop(run_id, path, STOP_WAIT_S if timeout is None else timeout))(session)


def _stop(run_id: str, path: str, timeout: float) -> int:
    supervisor = _require_running(run_id, path, "stop")
    if supervisor is None or not store.supervised_here(supervisor):
        where = supervisor.host if supervisor is not None else "another host"
        raise _not_now([error("PR604", "run supervised on another host",
                              detail=f"run {run_id} is supervised by poprun (PID {supervisor.pid if supervisor else '?'})"
                              f" on {where}: poprun signals only processes of its own host", span=SourceSpan.flag("RUN"),
                              hint=f"run 'poprun stop {run_id}' on {where}")])
    if _ignores(supervisor.pid, signal.SIGTERM):
        raise _not_now([error("PR618", "run's supervisor ignores SIGTERM",
                              detail=f"run {run_id}'s supervisor (PID {supervisor.pid}) was started with SIGTERM "
                              "ignored, and keeps it so: nothing was sent", span=SourceSpan.flag("RUN"),
                              hint=f"'kill -KILL {supervisor.pid}' ends it, and its watchdog every instance (the run "
                              "is then lost, without a report)")])
    if not _signal(supervisor, signal.SIGTERM):
        return _stopped(run_id, path)  # it ended in the meantime
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if store.state_of(path) != "running":
            return _stopped(run_id, path)
        time.sleep(0.05)
    if store.state_of(path) != "running":
        return _stopped(run_id, path)
    raise _not_now([error("PR607", "run did not stop in time",
                          detail=f"run {run_id}'s supervisor (PID {supervisor.pid}) was sent SIGTERM, but the run had "
                          f"not ended {timeout:g} s later", span=SourceSpan.flag("--timeout"),
                          hint=f"wait, then 'poprun ps'; 'poprun stop {run_id}' again kills every instance at once")])


def _ignores(pid: int, sig: int) -> bool:
    """Return whether process ``pid`` ignores ``sig`` (``SigIgn`` of ``/proc/PID/status``); False when unknown."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as file:  # noqa: PTH123
            mask = next((line.split(":", 1)[1] for line in file if line.startswith("SigIgn:")), "0")
        return bool(int(mask.strip(), 16) >> (sig - 1) & 1)
    except (OSError, ValueError):
        return False


def _signal(supervisor: store.Supervisor, sig: int) -> bool:
    """
    Send ``sig``, then SIGCONT, to the supervisor if it is still the process the record names (pid and start time).

    A pidfd holds the process while its start time is checked, so a reused pid is never signalled.
    SIGCONT follows, as kill(1) and a shell's ``kill`` do for a stopped job: a supervisor
    suspended (Ctrl-Z, SIGSTOP) would otherwise hold ``sig`` pending until someone continued
    it; it then continues its instances and stops them. Return False when it is gone.
    """
    try:
        handle = os.pidfd_open(supervisor.pid)
    except ProcessLookupError:
        return False
    try:
        if not supervisor.alive():
            return False
        signal.pidfd_send_signal(handle, sig)
        signal.pidfd_send_signal(handle, signal.SIGCONT)
    except ProcessLookupError:
        return False
    finally:
        os.close(handle)
    return True


def _stopped(run_id: str, path: str) -> int:
    report = None
    with contextlib.suppress(DiagnosticError):
        report = store.read_json(os.path.join(path, "report.json"))  # noqa: PTH118
    how = f"it ended with status {report.get('status')}" if report is not None else "its supervisor is gone"
    sys.stderr.write(f"poprun: stopped run {run_id}: {how}\n")
    return exitcode.OK
