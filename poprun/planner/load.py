"""
Loading a spec file: TOML (``.toml``, ``.conf``, anything else) or the DSL (``.pop``).

Layer: ``poprun.planner``.
"""

from __future__ import annotations

from pathlib import Path

from poprun.core.diagnostic import DiagnosticError, error
from poprun.core.span import SourceSpan
from poprun.planner.spec import Spec

DSL_SUFFIXES = (".pop",)
SPEC_SUFFIXES = (".toml", ".pop", ".conf")


def is_spec_path(word: str) -> bool:
    """Return whether ``word`` names a spec file (an existing file with a spec suffix)."""
    return word.endswith(SPEC_SUFFIXES) and Path(word).is_file()


def read_text(path: str, *, key: str = "SPEC") -> str:
    """
    Return the text of ``path``.

    Diagnostics:
        PR113 when the file cannot be read.
    """
    try:
        return Path(path).read_text(encoding="utf-8")
    except (OSError, ValueError) as exc:  # ValueError: undecodable text, or a NUL in the name
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise DiagnosticError([error("PR113", f"cannot read '{path}'", detail=reason,
                                     span=SourceSpan(file=path, key_path=key),
                                     hint="check the path and its permissions")]) from exc


def load_spec(path: str) -> Spec:
    """
    Return the spec in the file ``path``, choosing the front end by its suffix.

    Diagnostics:
        PR113 (unreadable), and those of the TOML front end or the DSL.
    """
    text = read_text(path)
    if path.endswith(DSL_SUFFIXES):
        from poprun.planner.dsl import parse_dsl

        return parse_dsl(text, file=path)
    from poprun.planner.tomlspec import parse_toml

    return parse_toml(text, file=path)
