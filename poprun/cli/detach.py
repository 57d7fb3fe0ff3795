"""
``--detach``: a launch whose supervisor goes on without a terminal.

Layer: ``poprun.cli``. :func:`detach` forks before the apply step. The child is the run's
supervisor: it leaves the terminal's session (``setsid``), puts ``/dev/null`` on its standard
descriptors and closes the others it inherited (the instances' output then reaches only the run
record's logs, and nothing of the launch holds the terminal or the pipes of whoever started
poprun), records itself as the run's
supervisor (:func:`poprun.runs.record.write_supervisor`, so that ``poprun stop`` signals it) and
runs the plan as the foreground does, Ctrl-C's teardown on SIGTERM included. It tells the
parent through a pipe once the launch is running (every instance started) or, when it could
not start, how it ended: the status and what poprun said (its diagnostics, warnings and, with
``-v``, its log lines, which it keeps until then). The parent prints the run id on stdout and
exits 0, or says what the child said and exits with its status.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import sys
from collections.abc import Callable

from poprun.cli import exitcode
from poprun.cli.progress import Console
from poprun.core.events import LaunchRunning
from poprun.runs.record import RunRecord, write_supervisor

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from typing import NoReturn

    from poprun.backends.base import Event, Stream

_RUNNING = b"running\n"  # the child's word once every instance has started; else b"ended STATUS\n"


class _Word:
    """The child's end of the pipe: what poprun says before the launch runs is kept, then told once."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self.said = io.StringIO()  # the child's sys.stderr until it has told

    def tell(self, head: bytes) -> None:
        """Tell the parent ``head`` and what was said so far, once; then nothing more is kept."""
        if self._fd < 0:
            return
        data = memoryview(head + self.said.getvalue().encode(errors="replace"))
        with contextlib.suppress(OSError):  # the parent is gone (killed): the run goes on
            while data:
                data = data[os.write(self._fd, data):]
        os.close(self._fd)
        self._fd = -1
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 - for the rest of the supervisor's life


class _DetachedConsole(Console):
    """The supervisor's console: no terminal; poprun's log lines are kept for the parent until the launch runs."""

    def __init__(self, word: _Word) -> None:
        super().__init__(status=False)
        self._word = word

    def write(self, stream: Stream, data: bytes) -> None:
        """Drop the instances' output: it reaches the run record's logs only."""

    def log(self, line: str) -> None:
        """Keep ``line`` for the parent until the launch runs."""
        sys.stderr.write(line)

    def event(self, event: Event) -> None:
        """Pass ``event`` on; tell the parent once every instance has started."""
        super().event(event)
        if isinstance(event, LaunchRunning):
            self._word.tell(_RUNNING)


def detach(record: RunRecord | None, console: Console, run: Callable[[Console, RunRecord], int]) -> int:
    """
    Run ``run(console, record)`` in a supervisor of its own (see the module docstring); return the parent's status.

    Diagnostics:
        PR606 when there is no ``record`` (``POPRUN_RECORD=0``, or it could not be made): a
        detached run without one could not be found again.
    """
    console.close()
    if record is None:
        from poprun.core.diagnostic import DiagnosticError, error
        from poprun.core.span import SourceSpan

        raise DiagnosticError([error("PR606", "--detach without a run record",
                                     detail="a detached run is found again by its record, and this launch keeps none "
                                     "(POPRUN_RECORD=0, or the runs directory cannot be written)",
                                     span=SourceSpan.flag("--detach"),
                                     hint="unset POPRUN_RECORD (or set POPRUN_RUNS_DIR to a directory of your own), "
                                          "or launch in the foreground")])
    sys.stdout.flush()
    sys.stderr.flush()
    read, write = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(read)
        _supervise(record, _Word(write), run)
    os.close(write)
    record.close()  # the child writes the record from now on
    return _await(read, child, record.id)


def _supervise(record: RunRecord, word: _Word, run: Callable[[Console, RunRecord], int]) -> NoReturn:
    """Leave the terminal, become the run's supervisor and run the plan (the child); never return."""
    status = exitcode.LAUNCH
    try:
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)
        _close_inherited()
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115
        sys.stderr = word.said
        if _recorded_as_supervisor(record):
            status = run(_DetachedConsole(word), record)
    except BaseException as exc:  # noqa: BLE001 - the supervisor must end here, whatever happened
        with contextlib.suppress(Exception):
            sys.stderr.write(f"poprun: internal error: {type(exc).__name__}: {exc}\n")
    word.tell(b"ended %d\n" % status)
    os._exit(status)


def _recorded_as_supervisor(record: RunRecord) -> bool:
    """
    Record this process as the run's supervisor; return whether it could be.

    When it cannot (a full disk), the run is not started: nothing could find and stop it again. That
    is said, and the record ends with it (status 125), from the room it keeps for its report.
    """
    try:
        write_supervisor(record.path)
    except OSError as exc:
        from poprun.core.outcome import ApplyError, ApplyResult
        from poprun.runs.report import report_data

        why = (f"cannot record the supervisor of run {record.id} ({exc.strerror or exc}): a detached run that could "
               "not be found again is not started")
        sys.stderr.write(f"poprun: {why}\n")
        record.finish(report_data(record, ApplyResult(statuses=(), error=ApplyError(status=exitcode.LAUNCH,
                                                                                       message=why)), exitcode.LAUNCH))
        return False
    return True


def _close_inherited() -> None:
    """
    Close every descriptor above 2 that the supervisor inherited from its caller (``3>&1`` in a script).

    Those are the inheritable ones: poprun opens its own close-on-exec (``--events fd:N`` made
    it so), and a caller's pipe held by the run would keep the caller waiting for its end.
    """
    for name in os.listdir("/proc/self/fd"):  # names only
        fd = int(name)
        with contextlib.suppress(OSError):  # the directory's own descriptor, closed by now
            if fd > 2 and os.get_inheritable(fd):  # noqa: PLR2004 - 0-2 are /dev/null by now
                os.close(fd)


def _await(read: int, child: int, run_id: str) -> int:
    """Wait for the child's word (the parent); print the run id (0), or what it said (its status)."""
    chunks: list[bytes] = []
    interrupted = False
    while True:
        try:
            chunk = os.read(read, 1 << 16)
        except KeyboardInterrupt:  # Ctrl-C while it starts: stop it, as the foreground would
            interrupted = True
            with contextlib.suppress(OSError):
                os.kill(child, signal.SIGTERM)
            continue
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read)
    head, _, said = b"".join(chunks).partition(b"\n")
    sys.stderr.write(said.decode(errors="replace"))
    words = head.split()
    if interrupted and words:  # it was told to stop (SIGTERM), as Ctrl-C stops a launch in the foreground
        sys.stderr.write(f"poprun: interrupted: run {run_id} is being stopped\n")
        return exitcode.INTERRUPTED
    if head + b"\n" == _RUNNING:
        sys.stdout.write(f"{run_id}\n")
        return exitcode.OK
    if len(words) == 2 and words[0] == b"ended" and words[1].isdigit():  # noqa: PLR2004
        return int(words[1])
    sys.stderr.write(f"poprun: the supervisor of run {run_id} ended before its instances started "
                     f"('poprun report {run_id}' may say more)\n")
    return exitcode.LAUNCH
