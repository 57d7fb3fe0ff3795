"""
What the commands share: reading a command line into a spec, solving it, checking formats, writing views.

Layer: ``poprun.cli``.
"""

from __future__ import annotations

import sys

from poprun import __version__
from poprun.cli import exitcode
from poprun.cli.config import export_config, write_private
from poprun.cli.session import Session
from poprun.core.diagnostic import DiagnosticError, error
from poprun.core.record import evolve
from poprun.core.span import COMMAND_LINE, SourceSpan
from poprun.planner.context import Context
from poprun.planner.flags import CommandLine, parse_flags
from poprun.planner.load import is_spec_path, load_spec
from poprun.planner.option import BACKENDS
from poprun.planner.plan import LaunchPlan
from poprun.planner.solve import Solution, solve
from poprun.planner.spec import Spec, overlay

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from collections.abc import Callable

    from poprun.backends.registry import BackendRegistry

IMAGE_FORMATS = ("svg", "png")


def read_command(session: Session, args: list[str], ctx: Context, *, prog: str, allow_spec_file: bool,
                 launch: bool = False) -> tuple[CommandLine, Spec]:
    """Return the command line and the spec it describes (spec file and imported config under it); PR101 for --detach but in a ``launch``."""
    spec_path = args.pop(0) if allow_spec_file and args and is_spec_path(args[0]) else None
    if spec_path is not None:
        prog = f"{prog} {spec_path}"
    command = parse_flags(args, environ=ctx.environ, prog=prog)
    if command.detach and not launch:
        raise DiagnosticError([error("PR101", "'--detach' is an option of a launch", detail=f"'{prog}' does not take it",
                                     span=SourceSpan.flag("--detach"),
                                     hint="launch with 'poprun --detach [options] PROGRAM' or 'poprun apply --detach ...'")])
    session.sources[COMMAND_LINE] = command.text
    session.warn(command.warnings)
    spec = command.spec
    if command.import_config is not None and command.export_config is not None:
        raise DiagnosticError([error("PR201", "--export-config and --import-config together",
                                     detail="a configuration cannot be imported and exported in one launch",
                                     span=command.export_config.origin,
                                     hint="export with one command, import with the next")])
    if command.import_config is not None:
        spec = overlay(load_spec(command.import_config.value), spec)
    if spec_path is not None:
        spec = overlay(load_spec(spec_path), spec)
    if command.export_config is not None:
        session.warn(export_config(command.spec, command.export_config,
                            overwrite=bool(command.overwrite_config and command.overwrite_config.value)))
    return command, spec


def reject_plan_options(command: CommandLine, where: str, *, allowed: tuple[str, ...] = ()) -> None:
    """Raise PR101 for an option of ``poprun plan`` given to ``where``, unless ``allowed``."""
    rejected = [o for o in command.plan_options if o.value not in allowed]
    if rejected:
        first = rejected[0]
        raise DiagnosticError([error("PR101", f"'{first.value}' is an option of 'poprun plan'",
                                     detail=f"{where} does not take it", span=first.origin,
                                     hint=f"use 'poprun plan {first.value} ...' to see the plan")])


def solve_spec(session: Session, spec: Spec, ctx: Context, *, require_program: bool, ignore: tuple[str, ...] = (),
               explain_cases: bool = False) -> Solution:
    """
    Solve ``spec`` and print its warnings, but those whose codes are in ``ignore``.

    ``explain_cases``: explain what a membership policy's plan becomes in each case (``poprun
    plan``: each case is a plan solved again; a launch does not spend that time on it).
    """
    solution = solve(spec, ctx, require_program=require_program, explain_cases=explain_cases)
    session.warn(tuple(w for w in solution.warnings if w.code not in ignore))
    return solution


def check_plugin_backend(session: Session, spec: Spec, registry: Callable[[], BackendRegistry]) -> None:
    """
    Raise PR400 (or PR402) when the spec names a backend that is neither poprun's nor an installed plugin's.

    Backends poprun knows of (built in, or planned for a later version) are not looked up:
    a plan may be made for a backend that runs it elsewhere. ``registry()`` is the command's
    (:class:`~poprun.backends.registry.OnDemand`), asked for only here.
    """
    if spec.backend is None or spec.backend.value in BACKENDS:
        return
    made = registry()
    session.warn(made.warnings)
    made.factory(spec.backend.value, span=spec.backend.origin)


def emit(output: str | bytes, command: CommandLine) -> None:
    """Write ``output`` to the -o file, or to standard output (bytes there only as text: SVG)."""
    if command.output is None:
        sys.stdout.write(output if isinstance(output, str) else output.decode())
        return
    try:
        write_private(command.output.value, output.encode() if isinstance(output, str) else output)
    except OSError as exc:
        raise DiagnosticError([error("PR113", f"cannot write '{command.output.value}'",
                                     detail=exc.strerror or str(exc), span=command.output.origin,
                                     hint="check the directory exists and is writable")]) from exc


def given(command: CommandLine, flag: str) -> SourceSpan | None:
    """Return where ``flag`` (a plan-only option) was given, or None."""
    return next((o.origin for o in command.plan_options if o.value == flag), None)


def check_format(command: CommandLine, formats: tuple[str, ...], what: str) -> None:
    """
    Raise PR115 when ``--format`` names a format that ``what`` does not write.

    Diagnostics:
        PR115.
    """
    span = given(command, "--format")
    if span is None or command.format in formats:
        return
    hint = ("write 'poprun render [SPEC] [options] -o topology." + command.format + "'"
            if command.format in IMAGE_FORMATS else f"use --format {' or '.join(formats)}")
    raise DiagnosticError([error("PR115", f"{what} cannot write {command.format}",
                                 detail=f"{what} writes {', '.join(formats)}", span=span, hint=hint)])


def read_plan(path: str, *, key: str) -> LaunchPlan:
    """
    Return the plan saved in ``path``.

    Diagnostics:
        PR113 (unreadable), PR114 (not a plan of this format version).
    """
    import os

    from poprun.planner.load import read_text
    from poprun.planner.serde import from_json

    if not os.path.lexists(path):
        raise DiagnosticError([error("PR113", f"plan file '{path}' not found", detail="No such file or directory",
                                     span=SourceSpan(file=path, key_path=key),
                                     hint="check the path; save a plan with 'poprun plan --format json -o FILE'")])
    return from_json(read_text(path, key=key), file=path)


def outside_slurm(ctx: Context) -> Context:
    """Return ``ctx`` without the Slurm allocation poprun may run in: a batch script plans for its own."""
    return evolve(ctx, environ={k: v for k, v in ctx.environ.items() if not k.startswith("SLURM_")})


def without_plan_options(args: list[str]) -> list[str]:
    """Return ``args`` without ``poprun plan``'s own options: the launch the batch script runs."""
    from poprun.planner.option import BY_FLAG, PLAN_ONLY

    rest, i = [], 0
    while i < len(args):
        name = args[i].partition("=")[0]
        option = BY_FLAG.get(name)
        if option is not None and option.name in PLAN_ONLY:
            i += 1 if "=" in args[i] or not option.takes_value else 2
            continue
        rest.append(args[i])
        i += 1
    return rest


def reject_words_after_plan(rest: list[str], *, what: str = "a saved plan runs exactly as planned: "
                              "'poprun apply PLAN.json' takes no options and no program") -> None:
    """Raise PR101 for words after a saved plan (``what`` says why)."""
    if rest:
        raise DiagnosticError([error("PR101", f"'{rest[0]}' after a saved plan",
                                     detail=what,
                                     span=SourceSpan.flag(rest[0]),
                                     hint="make the plan again with the change: "
                                          "'poprun plan --format json -o FILE [options] PROGRAM ...'")])


def backend_span(spec: Spec) -> SourceSpan | None:
    """Return where the spec names its backend, so that PR400 points there."""
    return spec.backend.origin if spec.backend is not None else None


def show_help() -> int:
    """Print the help; return 0."""
    from poprun.cli.helptext import render_help

    sys.stdout.write(render_help())
    return exitcode.OK


def show_version(fmt: str) -> int:
    """Print the version in ``fmt`` (text, json, full-json); return 0."""
    if fmt == "text":
        sys.stdout.write(f"poprun {__version__}\n")
        return exitcode.OK
    import json
    import platform

    info = {"poprun": __version__, "popdist": __version__, "python": platform.python_version()}
    if fmt == "full-json":
        sys.stdout.write(json.dumps(info, indent=2) + "\n")
    else:
        sys.stdout.write("".join(f"{k}: {v}\n" for k, v in info.items()))
    return exitcode.OK
