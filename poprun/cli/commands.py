"""
The commands: ``plan``, ``validate``, ``apply``, ``render`` and the classic form.

Layer: ``poprun.cli``; the only place (with :mod:`main`) that prints, writes files or exits.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path

from poprun import __version__
from poprun.cli import exitcode
from poprun.cli.config import export_config
from poprun.core.diagnostic import Diagnostic, DiagnosticError, error
from poprun.core.span import COMMAND_LINE, SourceSpan
from poprun.planner.context import Context
from poprun.planner.flags import CommandLine, parse_flags
from poprun.planner.load import SPEC_SUFFIXES, is_spec_path, load_spec
from poprun.planner.option import BACKENDS
from poprun.planner.plan import LaunchPlan
from poprun.planner.solve import Solution, solve
from poprun.planner.spec import Spec, overlay

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from poprun.cli.progress import Console

# The text behind spans that are not files (the command line), for carets in diagnostics.
SOURCES: dict[str, str] = {}


class _Status:
    """The console of a launch being planned: what is written meanwhile clears its status line first."""

    console: Console | None = None


def _warn(diagnostics: tuple[Diagnostic, ...]) -> None:
    if diagnostics:
        from poprun.render.diagnostics import render_diagnostics

        _stderr(render_diagnostics(diagnostics, SOURCES))


def _stderr(text: str) -> None:
    if _Status.console is not None:
        _Status.console.write("stderr", text.encode(errors="replace"))
    else:
        sys.stderr.write(text)


@contextlib.contextmanager
def _planning() -> Iterator[Console]:
    """
    Yield a console that shows ``planning`` on the status line (on a terminal) until the launch takes it over.

    When planning fails, the status line is cleared before the diagnostics are printed.
    """
    from poprun.cli.progress import Console

    console = Console()
    console.status("planning")
    _Status.console = console
    try:
        yield console
    except BaseException:
        console.close()
        raise
    finally:
        _Status.console = None


def _read(args: list[str], ctx: Context, *, prog: str, allow_spec_file: bool) -> tuple[CommandLine, Spec]:
    """Return the command line and the spec it describes (spec file and imported config under it)."""
    spec_path = args.pop(0) if allow_spec_file and args and is_spec_path(args[0]) else None
    if spec_path is not None:
        prog = f"{prog} {spec_path}"
    command = parse_flags(args, environ=ctx.environ, prog=prog)
    SOURCES[COMMAND_LINE] = command.text
    _warn(command.warnings)
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
        _warn(export_config(command.spec, command.export_config,
                            overwrite=bool(command.overwrite_config and command.overwrite_config.value)))
    return command, spec


def _reject_plan_options(command: CommandLine, where: str) -> None:
    if command.plan_options:
        first = command.plan_options[0]
        raise DiagnosticError([error("PR101", f"'{first.value}' is an option of 'poprun plan'",
                                     detail=f"{where} does not take it", span=first.origin,
                                     hint=f"use 'poprun plan {first.value} ...' to see the plan")])


def _solve(spec: Spec, ctx: Context, *, require_program: bool) -> Solution:
    solution = solve(spec, ctx, require_program=require_program)
    _warn(solution.warnings)
    return solution


def _check_plugin_backend(spec: Spec) -> None:
    """
    Raise PR400 (or PR402) when the spec names a backend that is neither poprun's nor an installed plugin's.

    Backends poprun knows of (built in, or planned for a later version) are not looked up:
    a plan may be made for a backend that runs it elsewhere.
    """
    if spec.backend is None or spec.backend.value in BACKENDS:
        return
    from poprun.backends.registry import default_registry

    registry = default_registry()
    _warn(registry.warnings)
    registry.factory(spec.backend.value, span=spec.backend.origin)


def _emit(text: str, command: CommandLine) -> None:
    if command.output is None:
        sys.stdout.write(text)
        return
    try:
        Path(command.output.value).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise DiagnosticError([error("PR113", f"cannot write '{command.output.value}'",
                                     detail=exc.strerror or str(exc), span=command.output.origin,
                                     hint="check the directory exists and is writable")]) from exc


def plan(args: list[str]) -> int:
    """``poprun plan [SPEC] [options] [PROGRAM [ARGS...]]``."""
    ctx = Context.from_process()
    command, spec = _read(list(args), ctx, prog="poprun plan", allow_spec_file=True)
    if command.help:
        return _help()
    solution = _solve(spec, ctx, require_program=False)
    _check_plugin_backend(spec)
    if command.format == "json":
        from poprun.planner.serde import to_json

        _emit(to_json(solution.plan), command)
    elif command.format == "toml":
        from poprun.planner.tomlspec import to_toml

        _emit(to_toml(spec), command)
    else:
        _emit(_text(solution.plan, explain=command.explain), command)
    return exitcode.OK


def _text(plan: LaunchPlan, *, explain: bool) -> str:
    from poprun.render.explain import render_plan

    text = render_plan(plan, explain=explain)
    if plan.output.print_topology:
        text = _topology(plan) + "\n" + text
    return text


def _topology(plan: LaunchPlan) -> str:
    from poprun.render.topology import TopologyRow, render_topology

    rows = [TopologyRow(index=i.index, host=i.host, ild=i.ild, replica_offset=i.replica_offset,
                        num_replicas=i.num_local_replicas) for i in plan.instances]
    return render_topology(rows)


def validate(args: list[str]) -> int:
    """``poprun validate SPEC [options]``: check a spec; print nothing but problems and 'ok'."""
    ctx = Context.from_process()
    if not args or args[0].startswith("-"):
        raise DiagnosticError([error("PR113", "no spec file", detail="'poprun validate' checks a spec file",
                                     span=SourceSpan.flag("SPEC"), hint="write 'poprun validate train.toml'")])
    path = args[0]
    spec = load_spec(path)
    command = parse_flags(args[1:], environ=ctx.environ, prog=f"poprun validate {path}")
    SOURCES[COMMAND_LINE] = command.text
    _solve(overlay(spec, command.spec), ctx, require_program=False)
    sys.stdout.write(f"{path}: ok\n")
    return exitcode.OK


def apply(args: list[str]) -> int:
    """``poprun apply SPEC|PLAN.json [options] [PROGRAM ...]``."""
    ctx = Context.from_process(probe_hosts=True)  # a launch: read the hosts' topologies
    if args and args[0].endswith(".json"):
        return _apply_saved(args[0], args[1:], ctx)
    if args and args[0].endswith(SPEC_SUFFIXES) and not Path(args[0]).is_file():
        load_spec(args[0])  # PR113, naming the file
    command, spec = _read(list(args), ctx, prog="poprun apply", allow_spec_file=True)
    _reject_plan_options(command, "'poprun apply'")
    if command.help:
        return _help()
    with _planning() as console:
        plan = _solve(spec, ctx, require_program=True).plan
    return _run(plan, console=console, backend_span=_backend_span(spec))


def _apply_saved(path: str, rest: list[str], ctx: Context) -> int:
    """
    Run the plan saved in ``path`` exactly, once its inputs are checked (design.md section 3).

    Diagnostics:
        PR113 (unreadable), PR114 (not a plan of this format version), PR101 (words after
        the plan), PR403 (stale plan: every input that changed, together).
    """
    from poprun.planner.load import read_text
    from poprun.planner.serde import from_json
    from poprun.planner.stale import validate_plan_inputs

    plan = from_json(read_text(path, key="PLAN"), file=path)
    _reject_words_after_plan(rest)
    stale = validate_plan_inputs(plan, ctx, file=path)
    if stale:
        raise DiagnosticError(stale)
    return _run(plan, backend_span=SourceSpan(file=path, key_path="$.backend.name"))


def _reject_words_after_plan(rest: list[str]) -> None:
    if rest:
        raise DiagnosticError([error("PR101", f"'{rest[0]}' after a saved plan",
                                     detail="a saved plan runs exactly as planned: 'poprun apply PLAN.json' "
                                            "takes no options and no program",
                                     span=SourceSpan.flag(rest[0]),
                                     hint="make the plan again with the change: "
                                          "'poprun plan --format json -o FILE [options] PROGRAM ...'")])


def render(_args: list[str]) -> int:
    """``poprun render``: topology graphs are not part of this release."""
    raise DiagnosticError([error("PR101", "'poprun render' is not available yet",
                                 detail="topology graphs (DOT, SVG, PNG) are not implemented in this version",
                                 span=SourceSpan.flag("render"),
                                 hint="use 'poprun plan --print-topology=yes' for the topology table")])


def classic(args: list[str]) -> int:
    """``poprun [options] PROGRAM [ARGS...]``: plan and apply in one go, exactly like PopRun."""
    ctx = Context.from_process(probe_hosts=True)  # a launch: read the hosts' topologies
    command, spec = _read(list(args), ctx, prog="poprun", allow_spec_file=False)
    _reject_plan_options(command, "the classic form")
    if command.help:
        return _help()
    if command.version:
        return _version(command.version_format)
    with _planning() as console:
        solution = _solve(spec, ctx, require_program=True)
        if solution.plan.output.print_topology:
            console.write("stdout", _topology(solution.plan).encode())
    return _run(solution.plan, console=console, backend_span=_backend_span(spec))


def _run(plan: LaunchPlan, *, backend_span: SourceSpan | None = None, console: Console | None = None) -> int:
    """
    Run ``plan`` with its backend from a new registry; return poprun's exit status.

    Plugins that failed to load are warned about (PR401); a backend that cannot be had exits
    125 with its diagnostic (PR400, PR402, PR404), placed at ``backend_span`` when given.
    """
    from poprun.backends.registry import default_registry
    from poprun.cli.run import run_plan

    registry = default_registry()
    _warn(registry.warnings)
    try:
        registry.factory(plan.backend.name, span=backend_span)
    except DiagnosticError as exc:
        if console is not None:
            console.close()
        _warn(exc.diagnostics)
        return exitcode.LAUNCH
    return run_plan(plan, registry=registry, console=console)


def _backend_span(spec: Spec) -> SourceSpan | None:
    """Return where the spec names its backend, so that PR400 and PR404 point there."""
    return spec.backend.origin if spec.backend is not None else None


def _help() -> int:
    from poprun.cli.helptext import render_help

    sys.stdout.write(render_help())
    return exitcode.OK


def _version(fmt: str) -> int:
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
