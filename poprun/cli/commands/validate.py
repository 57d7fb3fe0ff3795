"""
``poprun validate``: check a spec; print nothing but problems and ``ok``.

Layer: ``poprun.cli``.
"""

from __future__ import annotations

import sys

from poprun.cli import exitcode
from poprun.cli.commands.common import solve_spec
from poprun.cli.session import Session
from poprun.core.diagnostic import DiagnosticError, error
from poprun.core.span import COMMAND_LINE, SourceSpan
from poprun.planner.context import Context
from poprun.planner.flags import parse_flags
from poprun.planner.load import load_spec
from poprun.planner.spec import overlay


def validate(args: list[str], session: Session) -> int:
    """``poprun validate SPEC [options]``: check a spec; print nothing but problems and 'ok'."""
    ctx = Context.from_process()
    if not args or args[0].startswith("-"):
        raise DiagnosticError([error("PR113", "no spec file", detail="'poprun validate' checks a spec file",
                                     span=SourceSpan.flag("SPEC"), hint="write 'poprun validate train.toml'")])
    path = args[0]
    spec = load_spec(path)
    command = parse_flags(args[1:], environ=ctx.environ, prog=f"poprun validate {path}")
    session.sources[COMMAND_LINE] = command.text
    solve_spec(session, overlay(spec, command.spec), ctx, require_program=False)
    sys.stdout.write(f"{path}: ok\n")
    return exitcode.OK
