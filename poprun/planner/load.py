"""
Loading a spec file: TOML (``.toml``, ``.conf``, anything else) or the DSL (``.pop``).

Layer: ``poprun.planner``. This module chooses the front end by the file's suffix and
imports it on use; the front ends (:mod:`poprun.planner.tomlspec`,
:mod:`poprun.planner.dsl`) never import this module (they read files through
:mod:`poprun.core.textfile` themselves), so the choice sits above both.
"""

from __future__ import annotations

import os

from poprun.core.diagnostic import DiagnosticError, error
from poprun.core.span import SourceSpan
from poprun.planner.spec import Spec

DSL_SUFFIXES = (".pop",)
SPEC_SUFFIXES = (".toml", ".pop", ".conf")
PLAN_SUFFIXES = (".json",)


def is_spec_path(word: str) -> bool:
    """Return whether ``word`` names a spec file: it ends with a spec suffix, in any case (the file may be missing)."""
    return word.lower().endswith(SPEC_SUFFIXES) and not word.startswith("-")


def is_plan_path(word: str) -> bool:
    """Return whether ``word`` names a saved plan: it ends with ``.json``, in any case (the file may be missing)."""
    return word.lower().endswith(PLAN_SUFFIXES) and not word.startswith("-")


def read_text(path: str, *, key: str = "SPEC") -> str:
    """
    Return the text of ``path``.

    Diagnostics:
        PR113 when the file cannot be read, PR116-PR118 when it is not a regular file, too
        large, or not UTF-8 text (:func:`poprun.core.textfile.read_text_file`).
    """
    from poprun.core.textfile import read_text_file

    return read_text_file(path, key=key)


def load_spec(path: str) -> Spec:
    """
    Return the spec in the file ``path``, choosing the front end by its suffix.

    Diagnostics:
        PR113 (missing: "spec file not found", or unreadable), PR116-PR118 (not a regular file,
        too large, not UTF-8 text), and those of the TOML front end or the DSL.
    """
    if not os.path.lexists(path):
        raise DiagnosticError([error("PR113", f"spec file '{path}' not found", detail="No such file or directory",
                                     span=SourceSpan(file=path, key_path="SPEC"),
                                     hint="check the path; a spec file is read from the current directory")])
    text = read_text(path)
    if path.lower().endswith(DSL_SUFFIXES):
        from poprun.planner.dsl.read import parse_dsl

        return parse_dsl(text, file=path)
    from poprun.planner.tomlspec import parse_toml

    return parse_toml(text, file=path)
