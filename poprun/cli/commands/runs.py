"""
``poprun ps``, ``logs``, ``report``, ``stop`` and ``attach``: commands over the records of runs.

Layer: ``poprun.cli``. These only parse and print: the words are read against the command's rows
of the command table (:func:`poprun.planner.flags.parse_arguments`), the runs are found, read,
followed and stopped by :mod:`poprun.runs.api` (untrusted input: every problem is a diagnostic),
and drawn by :mod:`poprun.render.runs`. RUN is a run id, a unique prefix of one, or ``last``
(the newest run). Exit statuses: 0; 2 for a command-line error or a record that cannot be read
(PR600-PR602, PR605, PR609); 1 when the run is not in a state the command can act on (PR603,
PR604, PR607, PR608, PR618); ``attach`` ends with the run's own status, or 130 when detached
with Ctrl-C; 141 when stdout was closed (``poprun logs RUN | head``).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

from poprun.cli import exitcode
from poprun.cli.session import Session
from poprun.core.diagnostic import DiagnosticError, error
from poprun.core.exitstatus import BROKEN_PIPE as BROKEN
from poprun.core.exitstatus import NOT_NOW
from poprun.core.span import SourceSpan
from poprun.runs import api

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (see poprun.core.record)
if TYPE_CHECKING:
    from collections.abc import Iterable

    from poprun.backends.base import Stream
    from poprun.planner.flags import Arguments



def _arguments(command: str, args: list[str], *, run: bool) -> tuple[str | None, Arguments]:
    """
    Return RUN (None when ``--help`` was asked for) and the command's words and options.

    Diagnostics:
        PR101 (unknown option or extra word), PR104 (option without its value), PR112 (a value
        for an option without one), PR600 (no RUN).
    """
    from poprun.cli.commands import BY_NAME, read_arguments

    given = read_arguments(command, args, words=int(run))
    if given.help:
        return None, given
    if run and not given.words:
        raise DiagnosticError([error("PR600", "no run named", detail=f"usage: {BY_NAME[command].synopsis}",
                                     span=SourceSpan(file="<command line>", key_path="RUN"),
                                     hint="name a run: its id, a unique prefix of it, or 'last' ('poprun ps' lists them)")])
    return (given.words[0] if given.words else ""), given


def _count(given: Arguments, name: str, flag: str, *, least: int = 0) -> int | None:
    """Return the whole number given for ``flag`` (None when not given); PR105 when it is not one."""
    from poprun.render.runs import printable

    text = given.value(name)
    if text is None:
        return None
    digits = text.strip()
    if not (digits.isascii() and digits.isdigit()) or int(digits[:19]) < least:
        raise DiagnosticError([error("PR105", f"invalid value for {flag}", detail=f"'{printable(text[:40])}' is not "
                                     "a whole number" + (f" of {least} or more" if least else ""),
                                     span=SourceSpan.flag(flag), hint=f"write e.g. {flag}=10")])
    return int(digits) if len(digits) < 19 else 10 ** 18  # noqa: PLR2004 - beyond any count or time: no int of a megabyte


def _help(command: str) -> int:
    from poprun.cli.commands import BY_NAME
    from poprun.cli.helptext import render_command_help

    sys.stdout.write(render_command_help(BY_NAME[command]))
    return exitcode.OK


def _run_state_command(body: Callable[[], int]) -> Callable[[Session], int]:
    """Return ``body`` as a command that ends with status 1 on a :class:`~poprun.runs.api.RunStateError`."""
    def run(session: Session) -> int:
        try:
            return body()
        except api.RunStateError as exc:
            session.report(exc.diagnostics)
            return NOT_NOW
    return run


def _write(stream: Stream, data: bytes) -> None:
    fd, view = (1 if stream == "stdout" else 2), memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _copy(pieces: Iterable[api.Piece], *, tag: bool, write: Callable[[Stream, bytes], None] = _write) -> None:
    """Write a run's output to fds 1 and 2 (``write``), tagged like mpirun's --tag-output when asked."""
    from poprun.render.runs import Tagger

    tagger = Tagger(tag=tag)
    for index, stream, data in pieces:
        write("stdout" if stream == "stdout" else "stderr", tagger.piece(index, stream, data))


# ---------------------------------------------------------------- ps


def ps(args: list[str], _session: Session) -> int:
    """``poprun ps [--all] [--json]``: the running runs and the last ended ones (every run with --all), newest first."""
    _, given = _arguments("ps", args, run=False)
    if given.help:
        return _help("ps")
    from poprun.render.runs import render_ps, render_ps_json

    runs = api.list_runs(every=given.has("all"))
    now = time.time()
    sys.stdout.write(render_ps_json(runs, now) if given.has("json") else render_ps(runs, now))
    return exitcode.OK


# ---------------------------------------------------------------- logs and attach


def logs(args: list[str], _session: Session) -> int:
    """``poprun logs RUN [--instance N] [--attempt K] [-f] [--tail N] [--tag]``: the run's output, merged in arrival order or one instance's."""
    given_run, given = _arguments("logs", args, run=True)
    if given_run is None:
        return _help("logs")
    instance, tail = _count(given, "instance", "--instance"), _count(given, "tail", "--tail")
    attempt = _count(given, "attempt", "--attempt")
    run = api.locate(given_run)
    api.check_instance(run, instance)
    api.check_attempt(run, attempt)
    from poprun.render.runs import render_incomplete, render_truncation

    try:
        _copy(api.follow(run, instance=instance, attempt=attempt, tail=tail, until_over=given.has("follow")),
              tag=given.has("tag"))
        if not given.has("follow"):
            sys.stderr.write(render_truncation(api.report_json(run), instance))
        why = api.info(run).incomplete
        if why:
            sys.stderr.write(f"poprun: {render_incomplete(why)}\n")
    except BrokenPipeError:
        return BROKEN
    return exitcode.OK


def attach(args: list[str], session: Session) -> int:
    """``poprun attach RUN``: follow a running run's output with a status line; Ctrl-C detaches (130), the run goes on."""
    given_run, _ = _arguments("attach", args, run=True)
    if given_run is None:
        return _help("attach")
    run = api.locate(given_run)
    return _run_state_command(lambda: _attach(run))(session)


def _attach(run: api.Run) -> int:
    pieces = api.attach(run, tick=lambda: console.status(text, since=since))  # PR603 now, before any output
    from poprun.cli.progress import Console

    info = api.info(run)
    console = Console()
    took = info.duration(time.time())
    since = time.monotonic() - took if took is not None else None
    count = f"{info.instances} instance{'' if info.instances == 1 else 's'}" if info.instances else "its instances"
    text = f"attached to {run.id}: running {count}"
    console.status(text, since=since)
    try:
        _copy(pieces, tag=False, write=console.write)
    except KeyboardInterrupt:
        console.close()
        sys.stderr.write(f"poprun: detached from {run.id}: it goes on running ('poprun attach {run.id}' "
                         f"to come back, 'poprun stop {run.id}' to stop it)\n")
        return exitcode.INTERRUPTED
    finally:
        console.close()
    status = api.ended_with(run)
    if status is None:
        sys.stderr.write(f"poprun: run {run.id} was lost: its supervisor ended without a report\n")
        return exitcode.LAUNCH
    return status


# ---------------------------------------------------------------- report


def report(args: list[str], session: Session) -> int:
    """``poprun report RUN [--json]``: how the run ended (the failure report again), its phases and truncation."""
    given_run, given = _arguments("report", args, run=True)
    if given_run is None:
        return _help("report")
    run = api.locate(given_run)
    return _run_state_command(lambda: _report(run, as_json=given.has("json")))(session)


def _report(run: api.Run, *, as_json: bool) -> int:
    from poprun.render.runs import render_report, render_report_header, render_verified

    found = api.read_report(run, raw=as_json)
    if as_json:
        import json

        sys.stdout.write(json.dumps(found.data, indent=2, sort_keys=True) + "\n")
        return exitcode.OK
    assert found.info is not None
    if found.data is None:
        sys.stdout.write(render_report_header(found.info, None, time.time()))
        return exitcode.OK
    assert found.result is not None
    sys.stdout.write(render_report_header(found.info, found.data, time.time()) + render_report(found.data, found.result)
                     + render_verified(found.actual))
    return exitcode.OK


# ---------------------------------------------------------------- stop


def stop(args: list[str], session: Session) -> int:
    """``poprun stop RUN [--timeout S]``: stop every instance of the run as Ctrl-C would (SIGTERM, grace, SIGKILL)."""
    given_run, given = _arguments("stop", args, run=True)
    if given_run is None:
        return _help("stop")
    timeout = _count(given, "timeout", "--timeout")
    run = api.locate(given_run)
    return _run_state_command(lambda: _stop(run, api.STOP_WAIT_S if timeout is None else timeout))(session)


def _stop(run: api.Run, timeout: float) -> int:
    stopped = api.stop(run, timeout)
    how = f"it ended with status {stopped.status}" if stopped.reported else "its supervisor is gone"
    sys.stderr.write(f"poprun: stopped run {run.id}: {how}\n")
    return exitcode.OK
