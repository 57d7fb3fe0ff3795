"""
Where a value came from: a file and line, a flag, an environment variable or a default.

Layer: ``poprun.core``; imports only ``poprun.core.record``.
"""

from __future__ import annotations

from poprun.core.record import record

COMMAND_LINE = "<command line>"
DEFAULT = "<default>"
DERIVED = "<derived>"
ENVIRONMENT = "<environment>"


@record
class SourceSpan:
    """
    A place in the user's input.

    ``key_path`` is always set (``--num-replicas``, ``$.topology.replicas``); ``line`` and
    ``column`` are 1-based and best-effort: a span without them still says where.
    """

    file: str
    key_path: str
    line: int | None = None
    column: int | None = None
    end_line: int | None = None
    end_column: int | None = None

    @classmethod
    def flag(cls, name: str) -> SourceSpan:
        """Return the span of a command-line flag."""
        return cls(file=COMMAND_LINE, key_path=name)

    @classmethod
    def env(cls, name: str) -> SourceSpan:
        """Return the span of an environment variable of the planning shell."""
        return cls(file=f"<env {name}>", key_path=name)

    @classmethod
    def default(cls, key: str) -> SourceSpan:
        """Return the span of a built-in default."""
        return cls(file=DEFAULT, key_path=key)

    @classmethod
    def derived(cls, key: str) -> SourceSpan:
        """Return the span of a value the solver derived from others."""
        return cls(file=DERIVED, key_path=key)

    @classmethod
    def environment(cls, what: str) -> SourceSpan:
        """Return the span of an operational fact (a host, a binary): no user input."""
        return cls(file=ENVIRONMENT, key_path=what)

    @property
    def is_file(self) -> bool:
        """Whether the span points into a file (and so can carry a caret)."""
        return not self.file.startswith("<")

    def describe(self) -> str:
        """Return a short human form: ``job.toml:7:12``, ``--num-replicas``, ``default``."""
        if self.file == COMMAND_LINE:
            return self.key_path
        if self.file in (DEFAULT, DERIVED):
            return self.file.strip("<>")
        if self.file.startswith("<env "):
            return f"environment variable {self.key_path}"
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        return where
