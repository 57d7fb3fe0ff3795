"""
poprun's log lines, in real poprun's format: ``HH:MM:SS.mmm PID POPRUN [I] message``.

Layer: ``poprun.cli``; the standard library and ``poprun.core.secret``. ``-v`` (verbosity 1, the plan's
``output.verbosity``) shows ``[I]`` lines, ``-vv`` (2) also ``[D]`` lines; verbosity 0 shows
none. Lines go to the ``write`` function given (the console's stderr, which clears the status
line first), each written whole.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

INFO = 1  # the verbosity at which [I] lines show
DEBUG = 2  # the verbosity at which [D] lines show too


def format_line(level: str, message: str, *, now: float, pid: int) -> str:
    """Return one log line (with its newline): ``04:22:59.948 3905692 POPRUN [I] message`` (URLs' passwords masked)."""
    from poprun.core.secret import mask_text

    message = mask_text(message)
    clock = time.localtime(now)
    millis = int(now * 1000) % 1000
    return f"{clock.tm_hour:02d}:{clock.tm_min:02d}:{clock.tm_sec:02d}.{millis:03d} {pid} POPRUN [{level}] {message}\n"


class Log:
    """Writes the log lines that ``verbosity`` asks for, through ``write``."""

    def __init__(self, verbosity: int, write: Callable[[str], None], *,
                 clock: Callable[[], float] = time.time) -> None:
        self.verbosity = verbosity
        self._write, self._clock, self._pid = write, clock, os.getpid()

    @property
    def debugging(self) -> bool:
        """Whether ``[D]`` lines show (so that callers skip building them otherwise)."""
        return self.verbosity >= DEBUG

    def info(self, message: str) -> None:
        """Write an ``[I]`` line at verbosity 1 and up."""
        if self.verbosity >= INFO:
            self._write(format_line("I", message, now=self._clock(), pid=self._pid))

    def debug(self, message: str) -> None:
        """Write a ``[D]`` line at verbosity 2 and up."""
        if self.verbosity >= DEBUG:
            self._write(format_line("D", message, now=self._clock(), pid=self._pid))
