"""
``poprun render``: the plan's topology as a graph, in DOT, SVG or PNG.

Layer: ``poprun.cli``.
"""

from __future__ import annotations

from pathlib import Path

from poprun.cli import exitcode
from poprun.cli.commands.common import (
    check_format,
    emit,
    given,
    read_command,
    reject_plan_options,
    show_help,
    solve_spec,
)
from poprun.cli.session import Session
from poprun.core.diagnostic import DiagnosticError, error
from poprun.core.span import SourceSpan
from poprun.planner.context import Context
from poprun.planner.flags import CommandLine

RENDER_FORMATS = ("dot", "svg", "png")
SUFFIXES = {".dot": "dot", ".gv": "dot", ".svg": "svg", ".png": "png"}


def render(args: list[str], session: Session) -> int:
    """
    ``poprun render [SPEC] [options] [-o FILE]``: the plan's topology as a graph, DOT, SVG or PNG.

    The format is ``--format``'s, else the -o file's suffix, else DOT on standard output.
    SVG and PNG are drawn by Graphviz's ``dot``; without it, exit 125 with PR410.
    """
    ctx = Context.from_process()
    command, spec = read_command(session, list(args), ctx, prog="poprun render", allow_spec_file=True)
    reject_plan_options(command, "'poprun render'", allowed=("--format", "--output", "--expand"))
    if command.help:
        return show_help()
    fmt = _render_format(command)
    from poprun.render.graph import render_dot

    plan = solve_spec(session, spec, ctx, require_program=False, ignore=("PR209",)).plan  # a graph needs no program
    dot = render_dot(plan, expand=command.expand)
    if fmt == "dot":
        emit(dot, command)
        return exitcode.OK
    try:
        image = _image(dot, fmt)
    except DiagnosticError as exc:  # the environment lacks Graphviz: poprun could not do its work
        session.warn(exc.diagnostics)
        return exitcode.LAUNCH
    emit(image, command)
    return exitcode.OK


def _render_format(command: CommandLine) -> str:
    """
    Return the format ``poprun render`` writes: ``--format``'s, else the -o file's suffix's, else dot.

    Diagnostics:
        PR115 (a format render does not write, a suffix it does not know, PNG to standard output).
    """
    check_format(command, RENDER_FORMATS, "'poprun render'")
    fmt = command.format if given(command, "--format") else "dot"
    if command.output is not None and not given(command, "--format"):
        suffix = Path(command.output.value).suffix.lower()
        if suffix not in SUFFIXES:
            raise DiagnosticError([error("PR115", f"cannot tell the format of '{command.output.value}'",
                                         detail=f"'{suffix or '(no suffix)'}' is none of {', '.join(SUFFIXES)}",
                                         span=command.output.origin,
                                         hint="name the file with one of these suffixes, or give --format dot, "
                                              "svg or png")])
        fmt = SUFFIXES[suffix]
    if fmt == "png" and command.output is None:
        raise DiagnosticError([error("PR115", "'poprun render' cannot write png to standard output",
                                     detail="a PNG image is binary; only DOT and SVG go to standard output",
                                     span=given(command, "--format") or SourceSpan.flag("--format"),
                                     hint="add -o topology.png")])
    return fmt


def _image(dot: str, fmt: str) -> bytes:
    """
    Return ``dot`` drawn by Graphviz's ``dot`` program as ``fmt`` (svg or png).

    Diagnostics:
        PR410 when ``dot`` is not on PATH, or fails.
    """
    import graphviz  # type: ignore[import-untyped]  # graphviz ships no type information

    try:
        image: bytes = graphviz.pipe("dot", fmt, dot.encode())
    except graphviz.ExecutableNotFound as exc:
        raise DiagnosticError([error(
            "PR410", "Graphviz's 'dot' program not found",
            detail=f"drawing {fmt.upper()} runs Graphviz's 'dot', which is not on PATH",
            span=SourceSpan.environment("dot"),
            hint="install Graphviz ('apt-get install graphviz' on Debian and Ubuntu, 'dnf install graphviz', "
                 "'brew install graphviz'), or write DOT with -o topology.dot and draw it elsewhere")]) from exc
    except graphviz.CalledProcessError as exc:
        reason = (exc.stderr or b"").decode(errors="replace").strip() or f"exit status {exc.returncode}"
        raise DiagnosticError([error("PR410", "Graphviz's 'dot' failed", detail=reason,
                                     span=SourceSpan.environment("dot"),
                                     hint="check 'dot -V' and that it can write " + fmt)]) from exc
    return image
