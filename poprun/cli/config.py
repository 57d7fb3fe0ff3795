"""
``--export-config``: write the command line's spec as a TOML spec file (seed section 2.9).

Layer: ``poprun.cli`` (it writes files).
"""

from __future__ import annotations

import time
from pathlib import Path

from poprun.core.diagnostic import Diagnostic, DiagnosticError, error, warning
from poprun.core.rawbytes import check_exact
from poprun.planner.spec import Sourced, Spec


def export_config(spec: Spec, target: Sourced[str], *, overwrite: bool) -> tuple[Diagnostic, ...]:
    """
    Write ``spec`` to ``target`` as a TOML spec.

    When the file exists and ``overwrite`` is false, a time stamp is appended to the name
    instead (PopRun's rule), and a PR214 warning is returned.
    """
    from poprun.planner.tomlspec import to_toml

    path = Path(target.value)
    if not target.value.strip() or path.is_dir():
        raise DiagnosticError([error("PR113", f"cannot write '{target.value}'", detail="not a file name",
                                     span=target.origin, hint="name a file, e.g. --export-config=training.conf")])
    notes: tuple[Diagnostic, ...] = ()
    if path.exists() and not overwrite:
        stamped = path.with_name(f"{path.name}.{time.strftime('%Y%m%d-%H%M%S')}")
        notes = (warning("PR214", "configuration file exists", detail=f"'{path}' exists; wrote '{stamped}'",
                         span=target.origin, hint="add --overwrite-config=yes to replace the file"),)
        path = stamped
    try:
        path.write_text(check_exact(to_toml(spec), what="a TOML spec", span=target.origin,
                                    hint="rename the file or directory to a UTF-8 name"), encoding="utf-8")
    except OSError as exc:
        raise DiagnosticError([error("PR113", f"cannot write '{path}'", detail=exc.strerror or str(exc),
                                     span=target.origin, hint="check the directory exists and is writable")]) from exc
    return notes
