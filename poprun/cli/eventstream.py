"""
``--events FILE|-|fd:N``: a run's events as JSON lines, live, to a file, standard output or an inherited descriptor.

Layer: ``poprun.cli``. The lines are those of the run record's ``events.jsonl``
(:func:`poprun.runs.record.event_line`; the schema is ``docs/events.schema.json``). The target
is opened before planning, so that a wrong one is a diagnostic (PR113) before anything
starts. A stream whose reader goes away (``EPIPE``) or that cannot be written any more (a full
disk) stops being written, with one warning: the run goes on. ``POPRUN_EVENTS`` gives the
target when the command line does not (``poprun apply PLAN.json`` takes no option).
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Mapping

from poprun.core.diagnostic import DiagnosticError, error
from poprun.core.events import Event
from poprun.core.span import SourceSpan
from poprun.planner.spec import Sourced

VARIABLE = "POPRUN_EVENTS"

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from poprun.cli.progress import Console


class EventStream:
    """Writes each event as one line to ``fd`` (through the console when it is standard output)."""

    def __init__(self, fd: int, name: str, *, owned: bool) -> None:
        self.fd, self.name, self._owned = fd, name, owned
        self.console: Console | None = None  # set when the stream is standard output: its lines stay whole
        self.warning: str | None = None

    def event(self, event: Event) -> None:
        """Write ``event`` as one JSON line; on failure stop writing (and keep why, once)."""
        if self.fd < 0:
            return
        from poprun.runs.record import event_line

        data = event_line(event, time.time()).encode(errors="surrogateescape")
        if self.console is not None:
            self.console.write("stdout", data)
            return
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self.fd, view):]
        except OSError as exc:
            if exc.errno not in (errno.EPIPE, errno.ECONNRESET):
                self.warning = f"cannot write the events to {self.name} ({exc.strerror}): they stop there"
            self.close()

    def close(self) -> None:
        """Close the target when poprun opened it."""
        if self._owned and self.fd >= 0:
            os.close(self.fd)
        self.fd = -1


def open_stream(given: Sourced[str] | None, environ: Mapping[str, str]) -> EventStream | None:
    """
    Return the event stream ``--events`` (or ``POPRUN_EVENTS``) names, opened, or None.

    Raises:
        DiagnosticError: PR113 when the target cannot be opened for writing.
    """
    target = given.value if given is not None else environ.get(VARIABLE, "")
    if not target:
        return None
    span = given.origin if given is not None else SourceSpan.environment(VARIABLE)
    if target == "-":
        return EventStream(1, "standard output", owned=False)
    if target.startswith("fd:"):
        number = target[3:]
        if not number.isdigit() or int(number) < 3:  # noqa: PLR2004 - 0-2 are poprun's own streams
            raise _cannot(target, "fd:N takes an inherited descriptor number of 3 or more", span,
                          "write e.g. --events fd:3 and open it in the shell: 3>events.jsonl")
        try:
            os.fstat(int(number))
            os.set_inheritable(int(number), False)  # noqa: FBT003 - the instances do not inherit the events
        except OSError as exc:
            raise _cannot(target, f"descriptor {number} is not open ({exc.strerror})", span,
                          f"open it in the shell: {number}>events.jsonl") from exc
        return EventStream(int(number), target, owned=False)
    try:  # O_NONBLOCK: a FIFO with no reader is refused, not waited on
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
        os.set_blocking(fd, True)
    except OSError as exc:
        why = "a FIFO with no reader" if exc.errno == errno.ENXIO else (exc.strerror or str(exc))
        raise _cannot(target, why, span, "check the directory exists and is writable (or start the FIFO's "
                      "reader first)") from exc
    return EventStream(fd, target, owned=True)


def _cannot(target: str, detail: str, span: SourceSpan, hint: str) -> DiagnosticError:
    return DiagnosticError([error("PR113", f"cannot write the events to '{target}'", detail=detail, span=span,
                                  hint=hint)])
