"""
``--export-config``: write the command line's spec as a TOML spec file (seed section 2.9).

Layer: ``poprun.cli`` (it writes files).
"""

from __future__ import annotations

import time
from pathlib import Path

from poprun.core.diagnostic import Diagnostic, DiagnosticError, error, warning
from poprun.planner.spec import Sourced, Spec


def export_config(spec: Spec, target: Sourced[str], *, overwrite: bool) -> tuple[Diagnostic, ...]:
    """
    Write ``spec`` to ``target``; when the file exists and ``overwrite`` is false, append a
    time stamp to the name instead (PopRun's rule). Return a PR214 warning in that case.
    """
    from poprun.planner.tomlspec import to_toml  # noqa: PLC0415

    path = Path(target.value)
    notes: tuple[Diagnostic, ...] = ()
    if path.exists() and not overwrite:
        stamped = path.with_name(f"{path.name}.{time.strftime('%Y%m%d-%H%M%S')}")
        notes = (warning("PR214", "configuration file exists", detail=f"'{path}' exists; wrote '{stamped}'",
                         span=target.origin, hint="add --overwrite-config=yes to replace the file"),)
        path = stamped
    try:
        path.write_text(to_toml(spec), encoding="utf-8")
    except OSError as exc:
        raise DiagnosticError([error("PR113", f"cannot write '{path}'", detail=exc.strerror or str(exc),
                                     span=target.origin, hint="check the directory exists and is writable")]) from exc
    return notes
