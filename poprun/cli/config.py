"""
``--export-config``: write the command line's spec as a TOML spec file (seed section 2.9).

Layer: ``poprun.cli`` (it writes files).
"""

from __future__ import annotations

import contextlib
import os
import stat
import time

from poprun.core.diagnostic import Diagnostic, DiagnosticError, error, warning
from poprun.core.rawbytes import check_exact
from poprun.planner.spec import Sourced, Spec


def export_config(spec: Spec, target: Sourced[str], *, overwrite: bool) -> tuple[Diagnostic, ...]:
    """
    Write ``spec`` to ``target`` as a TOML spec.

    When the file exists and ``overwrite`` is false, a time stamp is appended to the name
    instead (PopRun's rule), and a PR214 warning is returned.
    """
    from pathlib import Path  # here, not at the top: only --export-config needs it (start-up stays lean)

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
        write_private(str(path), check_exact(to_toml(spec), what="a TOML spec", span=target.origin,
                                             hint="rename the file or directory to a UTF-8 name").encode())
    except OSError as exc:
        raise DiagnosticError([error("PR113", f"cannot write '{path}'", detail=exc.strerror or str(exc),
                                     span=target.origin, hint="check the directory exists and is writable")]) from exc
    return notes


def write_private(path: str, data: bytes) -> None:
    """
    Write ``data`` to ``path``, created (or truncated) 0600 whatever the umask: it may hold the values the plan sets.

    An existing regular file of this user's is made 0600 too; a device, a FIFO or another
    user's file keeps its mode (as ``--events FILE``). Raises OSError.
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as file:
        info = os.fstat(fd)
        if stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid() and stat.S_IMODE(info.st_mode) != 0o600:  # noqa: PLR2004
            with contextlib.suppress(OSError):  # a file system that keeps its own modes: written as it is
                os.fchmod(fd, 0o600)
        file.write(data)
