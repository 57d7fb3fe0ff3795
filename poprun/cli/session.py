"""
One run of the ``poprun`` command: where its diagnostics and warnings go.

Layer: ``poprun.cli``. A :class:`Session` is made by :func:`poprun.cli.main.main` for each
command line and passed to the command; it replaces module-level state: the text behind
spans that are not files (the command line, for the carets of diagnostics) and the console
of a launch being planned (what is written meanwhile clears its status line first).
"""

from __future__ import annotations

import contextlib
import sys
import time
from collections.abc import Iterator

from poprun.core.diagnostic import Diagnostic

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from poprun.cli.progress import Console


class Session:
    """What one command line's commands share: ``sources`` for diagnostics, and the planning console."""

    def __init__(self) -> None:
        self.sources: dict[str, str] = {}  # a span's file (``<command line>``) -> its text
        self.console: Console | None = None  # while planning a launch: the console showing ``planning``
        self.started = time.monotonic()  # when the command began (a run's record times its planning from here)

    def warn(self, diagnostics: tuple[Diagnostic, ...]) -> None:
        """Write ``diagnostics`` (warnings, or errors that end nothing) to stderr."""
        if diagnostics:
            from poprun.render.diagnostics import render_diagnostics

            self.stderr(render_diagnostics(diagnostics, self.sources))

    def report(self, diagnostics: tuple[Diagnostic, ...]) -> None:
        """Write the diagnostics that end the command to stderr (the planning console is closed by then)."""
        from poprun.render.diagnostics import render_diagnostics

        sys.stderr.write(render_diagnostics(diagnostics, self.sources))

    def stderr(self, text: str) -> None:
        """Write ``text`` to stderr, through the planning console when there is one."""
        if self.console is not None:
            self.console.write("stderr", text.encode(errors="replace"))
        else:
            sys.stderr.write(text)

    @contextlib.contextmanager
    def planning(self) -> Iterator[Console]:
        """
        Yield a console that shows ``planning`` on the status line (on a terminal) until the launch takes it over.

        When planning fails, the status line is cleared before the diagnostics are printed.
        """
        from poprun.cli.progress import Console

        console = Console()
        console.status("planning")
        self.console = console
        try:
            yield console
        except BaseException:
            console.close()
            raise
        finally:
            self.console = None
