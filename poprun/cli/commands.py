"""
The commands: ``plan``, ``validate``, ``apply``, ``render`` and the classic form.

Layer: ``poprun.cli``; the only place (with :mod:`main`) that prints, writes files or exits.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path

from poprun import __version__
from poprun.cli import exitcode
from poprun.cli.config import export_config
from poprun.core.diagnostic import Diagnostic, DiagnosticError, error, warning
from poprun.core.record import evolve
from poprun.core.span import COMMAND_LINE, SourceSpan
from poprun.planner.context import Context
from poprun.planner.flags import CommandLine, parse_flags
from poprun.planner.load import is_plan_path, is_spec_path, load_spec
from poprun.planner.option import BACKENDS
from poprun.planner.plan import LaunchPlan
from poprun.planner.solve import Solution, solve
from poprun.planner.spec import Sourced, Spec, overlay

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from poprun.backends.base import FormatRequest, PlanFormat
    from poprun.cli.progress import Console
    from poprun.planner.machine import HostTopology

# The text behind spans that are not files (the command line), for carets in diagnostics.
SOURCES: dict[str, str] = {}
PLAN_FORMATS = ("text", "json", "toml", "dot", "sbatch")
DIFF_FORMATS = ("text", "json")
SAVED_PLAN_FORMATS = ("text", "json", "dot")
RENDER_FORMATS = ("dot", "svg", "png")
IMAGE_FORMATS = ("svg", "png")
SUFFIXES = {".dot": "dot", ".gv": "dot", ".svg": "svg", ".png": "png"}
NEW_PLAN = "the plan of this command line"


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


def _reject_plan_options(command: CommandLine, where: str, *, allowed: tuple[str, ...] = ()) -> None:
    rejected = [o for o in command.plan_options if o.value not in allowed]
    if rejected:
        first = rejected[0]
        raise DiagnosticError([error("PR101", f"'{first.value}' is an option of 'poprun plan'",
                                     detail=f"{where} does not take it", span=first.origin,
                                     hint=f"use 'poprun plan {first.value} ...' to see the plan")])


def _solve(spec: Spec, ctx: Context, *, require_program: bool, ignore: tuple[str, ...] = ()) -> Solution:
    """Solve ``spec`` and print its warnings, but those whose codes are in ``ignore``."""
    solution = solve(spec, ctx, require_program=require_program)
    _warn(tuple(w for w in solution.warnings if w.code not in ignore))
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


def _emit(output: str | bytes, command: CommandLine) -> None:
    """Write ``output`` to the -o file, or to standard output (bytes there only as text: SVG)."""
    if command.output is None:
        sys.stdout.write(output if isinstance(output, str) else output.decode())
        return
    try:
        path = Path(command.output.value)
        if isinstance(output, str):
            path.write_text(output, encoding="utf-8")
        else:
            path.write_bytes(output)
    except OSError as exc:
        raise DiagnosticError([error("PR113", f"cannot write '{command.output.value}'",
                                     detail=exc.strerror or str(exc), span=command.output.origin,
                                     hint="check the directory exists and is writable")]) from exc


def plan(args: list[str]) -> int:
    """``poprun plan [SPEC] [options] [PROGRAM [ARGS...]]``; ``--format sbatch`` shows what ``poprun submit`` submits."""
    ctx = Context.from_process()
    args = _file_first(list(args))
    if args and is_plan_path(args[0]):
        return _plan_saved(args[0], args[1:])
    command, spec = _read(list(args), ctx, prog="poprun plan", allow_spec_file=True)
    if command.format == "sbatch":  # planned as outside an allocation, as poprun submit does
        ctx = _outside_slurm(ctx)
    if command.help:
        return _help()
    _warn_plan_options_in_program(command)
    _check_format(command, PLAN_FORMATS if command.diff is None else DIFF_FORMATS,
                  "'poprun plan --diff'" if command.diff else "'poprun plan'")
    old = _read_plan(command.diff.value, key="--diff") if command.diff is not None else None
    solution = _solve(spec, ctx, require_program=False)
    _check_plugin_backend(spec)
    from poprun.cli import partition

    planned, seen = partition.planned(solution.plan, ctx.environ)  # a bounded look at the V-IPU server
    _warn(seen)
    solution = evolve(solution, plan=planned)
    if command.diff is not None and old is not None:
        _emit(_diff(old, solution.plan, old_name=command.diff.value, as_json=command.format == "json"), command)
    elif command.format == "json":
        from poprun.planner.serde import to_json

        _emit(to_json(solution.plan), command)
    elif command.format == "toml":
        from poprun.planner.tomlspec import to_toml

        _emit(to_toml(spec), command)
    elif command.format == "dot":
        from poprun.render.graph import render_dot

        _emit(render_dot(solution.plan, expand=command.expand), command)
    elif command.format == "sbatch":
        named = spec.hosts.value if spec.hosts is not None else ()
        launch = (sys.executable, "-m", "poprun.cli.main", *_without_plan_options(args))
        _emit(_backend_format("sbatch")(solution.plan, _format_request(launch, named)), command)
    else:
        _emit(_text(solution.plan, explain=command.explain), command)
    return exitcode.OK


def _file_first(args: list[str]) -> list[str]:
    """
    Return ``args`` with a lone last word that names a spec or saved plan moved first.

    ``poprun plan --explain PLAN.json`` explains the saved plan, as ``poprun plan PLAN.json
    --explain`` does: the only word after the options is a file, not a program of that name.
    """
    if len(args) < 2 or is_plan_path(args[0]) or is_spec_path(args[0]):  # noqa: PLR2004 - options, then the word
        return args
    last = args[-1]
    if not (is_plan_path(last) or is_spec_path(last)):
        return args
    from poprun.planner.flags import parse_flags as parse

    try:
        program = parse(args, prog="poprun plan").spec.program
    except DiagnosticError:
        return args  # the options are wrong: parsing them again reports it
    return [last, *args[:-1]] if program is not None and program.value == (last,) else args


def _plan_saved(path: str, rest: list[str]) -> int:
    """
    ``poprun plan PLAN.json [--explain] [--format text|json|dot] [-o FILE]``: show a saved plan, exactly as apply runs it.

    ``poprun plan --diff OLD.json NEW.json`` shows what changed from one saved plan to another.

    Diagnostics:
        PR113 (unreadable), PR114 (not a valid plan), PR101 (options that would change the
        plan, or a program), PR115 (a format a saved plan cannot be shown in).
    """
    plan = _read_plan(path, key="PLAN")
    _reject_words_after_plan(_without_plan_options(rest), what="'poprun plan PLAN.json' takes only --explain, "
                             "--format, -o and --expand: a saved plan is shown as it is")
    command = parse_flags(rest, prog=f"poprun plan {path}")
    SOURCES[COMMAND_LINE] = command.text
    if command.diff is not None:  # plan --diff OLD.json NEW.json: two saved plans
        _check_format(command, DIFF_FORMATS, "'poprun plan --diff'")
        old = _read_plan(command.diff.value, key="--diff")
        _emit(_diff(old, plan, old_name=command.diff.value, as_json=command.format == "json", new_name=path), command)
        return exitcode.OK
    _check_format(command, SAVED_PLAN_FORMATS, "'poprun plan PLAN.json'")
    if command.format == "json":
        from poprun.planner.serde import to_json

        _emit(to_json(plan), command)
    elif command.format == "dot":
        from poprun.render.graph import render_dot

        _emit(render_dot(plan, expand=command.expand), command)
    else:
        _emit(_text(plan, explain=command.explain), command)
    return exitcode.OK


def _warn_plan_options_in_program(command: CommandLine) -> None:
    """
    PR218 (a warning) when an option of ``poprun plan`` stands after the program: it is the program's.

    Everything after the program belongs to it (as with every launcher), so ``poprun plan
    python3 train.py --explain`` plans ``train.py --explain``; the plan text shows that program.
    """
    from poprun.planner.option import BY_FLAG, PLAN_ONLY

    program = command.spec.program
    if program is None:
        return
    for word in program.value[1:]:
        option = BY_FLAG.get(word.partition("=")[0])
        if option is not None and option.name in PLAN_ONLY:
            _warn((warning("PR218", f"'{word}' after the program is the program's argument",
                           detail=f"poprun reads its options only before the program; '{word}' is passed to "
                                  f"{program.value[0]}", span=program.origin,
                           hint=f"put {option.name} before the program: 'poprun plan {option.name} ... PROGRAM'"),))
            return


def _outside_slurm(ctx: Context) -> Context:
    """Return ``ctx`` without the Slurm allocation poprun may run in: a batch script plans for its own."""
    return evolve(ctx, environ={k: v for k, v in ctx.environ.items() if not k.startswith("SLURM_")})


def _without_plan_options(args: list[str]) -> list[str]:
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


def _read_plan(path: str, *, key: str) -> LaunchPlan:
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


def _diff(old: LaunchPlan, new: LaunchPlan, *, old_name: str, as_json: bool, new_name: str = NEW_PLAN) -> str:
    """Return what changed from plan ``old`` to ``new`` (the command line's, or a saved one), as text or JSON."""
    from poprun.render.diff import diff_plans, render_diff, render_diff_json

    render = render_diff_json if as_json else render_diff
    return render(diff_plans(old, new), old_name=old_name, new_name=new_name)


def _given(command: CommandLine, flag: str) -> SourceSpan | None:
    """Return where ``flag`` (a plan-only option) was given, or None."""
    return next((o.origin for o in command.plan_options if o.value == flag), None)


def _check_format(command: CommandLine, formats: tuple[str, ...], what: str) -> None:
    """
    Raise PR115 when ``--format`` names a format that ``what`` does not write.

    Diagnostics:
        PR115.
    """
    span = _given(command, "--format")
    if span is None or command.format in formats:
        return
    hint = ("write 'poprun render [SPEC] [options] -o topology." + command.format + "'"
            if command.format in IMAGE_FORMATS else f"use --format {' or '.join(formats)}")
    raise DiagnosticError([error("PR115", f"{what} cannot write {command.format}",
                                 detail=f"{what} writes {', '.join(formats)}", span=span, hint=hint)])


def _text(plan: LaunchPlan, *, explain: bool) -> str:
    from poprun.backends.registry import default_registry, describe
    from poprun.render.explain import render_plan

    text = render_plan(plan, explain=explain, backend_text=describe(default_registry(), plan))
    if plan.output.print_topology:
        text = _topology(plan) + "\n" + text
    return text


def _probe_topologies(hosts: tuple[str, ...], *, environ: Mapping[str, str]) -> Mapping[str, HostTopology | str]:
    """Read other hosts' topologies with the backend that can (the registry is made only when placement asks)."""
    from poprun.backends.registry import default_registry, topology_prober

    prober = topology_prober(default_registry())
    return prober(hosts, environ=environ) if prober is not None else dict.fromkeys(hosts, "no backend reads them")


def _backend_format(name: str) -> PlanFormat:
    """Return the plan view ``name`` that a backend offers (``sbatch``: the slurm backend's batch script)."""
    from poprun.backends.registry import default_registry, find_format

    view = find_format(default_registry(), name)
    assert view is not None, f"no backend offers --format {name}"  # a built-in's: always there
    return view


def _format_request(command: tuple[str, ...], hosts: tuple[str, ...]) -> FormatRequest:
    from poprun.backends.base import FormatRequest

    return FormatRequest(command=command, hosts=hosts)


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
    ctx = Context.from_process(probe_hosts=True, remote_probe=_probe_topologies)  # a launch: read the hosts' topologies
    if args and is_plan_path(args[0]):
        return _apply_saved(args[0], args[1:], ctx)
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
    from poprun.planner.stale import validate_plan_inputs

    plan = _read_plan(path, key="PLAN")
    _reject_words_after_plan(rest)
    stale = validate_plan_inputs(plan, ctx, file=path)
    if stale:
        raise DiagnosticError(stale)
    return _run(plan, backend_span=SourceSpan(file=path, key_path="$.backend.name"))


def _reject_words_after_plan(rest: list[str], *, what: str = "a saved plan runs exactly as planned: "
                              "'poprun apply PLAN.json' takes no options and no program") -> None:
    if rest:
        raise DiagnosticError([error("PR101", f"'{rest[0]}' after a saved plan",
                                     detail=what,
                                     span=SourceSpan.flag(rest[0]),
                                     hint="make the plan again with the change: "
                                          "'poprun plan --format json -o FILE [options] PROGRAM ...'")])


def vipu_server(args: list[str]) -> int:
    """``poprun vipu-server [--host H] [--port P] [--db FILE] [--ipus N] [--ild-size N]``: the emulated V-IPU service."""
    from poprun.partitions.emulator import main as serve

    return serve(args)


def render(args: list[str]) -> int:
    """
    ``poprun render [SPEC] [options] [-o FILE]``: the plan's topology as a graph, DOT, SVG or PNG.

    The format is ``--format``'s, else the -o file's suffix, else DOT on standard output.
    SVG and PNG are drawn by Graphviz's ``dot``; without it, exit 125 with PR410.
    """
    ctx = Context.from_process()
    command, spec = _read(list(args), ctx, prog="poprun render", allow_spec_file=True)
    _reject_plan_options(command, "'poprun render'", allowed=("--format", "--output", "--expand"))
    if command.help:
        return _help()
    fmt = _render_format(command)
    from poprun.render.graph import render_dot

    plan = _solve(spec, ctx, require_program=False, ignore=("PR209",)).plan  # a graph needs no program
    dot = render_dot(plan, expand=command.expand)
    if fmt == "dot":
        _emit(dot, command)
        return exitcode.OK
    try:
        image = _image(dot, fmt)
    except DiagnosticError as exc:  # the environment lacks Graphviz: poprun could not do its work
        _warn(exc.diagnostics)
        return exitcode.LAUNCH
    _emit(image, command)
    return exitcode.OK


def _render_format(command: CommandLine) -> str:
    """
    Return the format ``poprun render`` writes: ``--format``'s, else the -o file's suffix's, else dot.

    Diagnostics:
        PR115 (a format render does not write, a suffix it does not know, PNG to standard output).
    """
    _check_format(command, RENDER_FORMATS, "'poprun render'")
    fmt = command.format if _given(command, "--format") else "dot"
    if command.output is not None and not _given(command, "--format"):
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
                                     span=_given(command, "--format") or SourceSpan.flag("--format"),
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


def classic(args: list[str]) -> int:
    """``poprun [options] PROGRAM [ARGS...]``: plan and apply in one go, exactly like PopRun."""
    ctx = Context.from_process(probe_hosts=True, remote_probe=_probe_topologies)  # a launch: read the hosts' topologies
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


def submit(args: list[str]) -> int:
    """
    ``poprun submit [--dry-run] [--wait] [--nodes N] [SPEC] [options] PROGRAM [ARGS...]``: run it as a Slurm batch job.

    Writes a batch script whose allocation fits the plan (its hosts as nodes, or ``--nodes N``;
    its instances per host as tasks per node) and that runs the same poprun command inside it,
    and submits it with ``sbatch`` (``--dry-run`` prints the script instead; ``--wait`` waits for
    the job and exits with its status). Submit's own options come first.
    """
    dry_run, wait, nodes, rest = _submit_options(list(args))
    ctx = _outside_slurm(Context.from_process())
    command, spec = _read(list(rest), ctx, prog="poprun submit", allow_spec_file=True)
    _reject_plan_options(command, "'poprun submit'")
    if command.help:
        return _help()
    named = spec.hosts.value if spec.hosts is not None else ()
    if nodes is not None and spec.hosts is None and spec.host_file is None:
        spec = evolve(spec, hosts=Sourced(tuple(f"node{i}" for i in range(1, nodes.value + 1)), nodes.origin))
    plan = _solve(spec, ctx, require_program=True).plan
    script = _backend_format("sbatch")(plan, _format_request((sys.executable, "-m", "poprun.cli.main", *rest), named))
    if dry_run:
        sys.stdout.write(script)
        return exitcode.OK
    return _sbatch(script, wait=wait)


def _submit_options(args: list[str]) -> tuple[bool, bool, Sourced[int] | None, list[str]]:
    """Return ``--dry-run``, ``--wait`` and ``--nodes N`` from the front of ``args``, and the rest (PR200)."""
    dry_run = wait = False
    nodes: Sourced[int] | None = None
    while args and (args[0] in ("--dry-run", "--wait") or args[0].split("=")[0] == "--nodes"):
        word = args.pop(0)
        if word in ("--dry-run", "--wait"):
            dry_run, wait = dry_run or word == "--dry-run", wait or word == "--wait"
            continue
        value = word.partition("=")[2] if "=" in word else (args.pop(0) if args else "")
        if not value.isdigit() or int(value) < 1:
            raise DiagnosticError([error("PR200", "value must be a positive integer",
                                         detail=f"--nodes takes a number of nodes, not '{value}'",
                                         span=SourceSpan.flag("--nodes"), hint="write e.g. --nodes 4")])
        nodes = Sourced(int(value), SourceSpan.flag("--nodes"))
    return dry_run, wait, nodes, args


def _sbatch(script: str, *, wait: bool) -> int:
    """Submit ``script`` with ``sbatch`` (on its standard input); return 0, or the job's status with ``wait``."""
    import shutil
    import subprocess

    sbatch = shutil.which("sbatch")
    if sbatch is None:
        sys.stderr.write("poprun: sbatch not found on PATH: 'poprun submit' needs Slurm's client commands\n")
        return exitcode.NOT_FOUND
    proc = subprocess.Popen([sbatch, "--parsable", *(["--wait"] if wait else [])], stdin=subprocess.PIPE,  # noqa: S603
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None
    assert proc.stdout is not None
    proc.stdin.write(script)
    proc.stdin.close()
    job = proc.stdout.readline().strip().split(";")[0]
    if job:
        sys.stdout.write(f"poprun: submitted batch job {job} (its output: slurm-{job}.out)\n")
        sys.stdout.flush()
    status = proc.wait()
    if not job:
        return exitcode.LAUNCH
    return status


def _run(plan: LaunchPlan, *, backend_span: SourceSpan | None = None, console: Console | None = None) -> int:
    """
    Run ``plan`` with its backend from a new registry; return poprun's exit status.

    Plugins that failed to load are warned about (PR401); a backend that cannot be had exits
    125 with its diagnostic (PR400, PR402), placed at ``backend_span`` when given.
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
    """Return where the spec names its backend, so that PR400 points there."""
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
