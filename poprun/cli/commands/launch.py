"""
``poprun apply`` and the classic ``poprun [options] PROGRAM [ARGS...]``: plan (or read a saved plan) and run it.

Layer: ``poprun.cli``. The run itself is :func:`poprun.cli.run.run_plan` over :func:`poprun.apply.apply`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from poprun.cli import exitcode
from poprun.cli.commands.common import (
    backend_span,
    read_command,
    read_plan,
    reject_plan_options,
    reject_words_after_plan,
    show_help,
    show_version,
    solve_spec,
)
from poprun.cli.eventstream import VARIABLE as EVENTS_VARIABLE
from poprun.cli.eventstream import EventStream, open_stream
from poprun.cli.session import Session
from poprun.cli.views import topology
from poprun.core.diagnostic import DiagnosticError
from poprun.core.span import SourceSpan
from poprun.planner.context import Context
from poprun.planner.load import is_plan_path
from poprun.planner.plan import LaunchPlan

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from poprun.cli.progress import Console
    from poprun.planner.machine import HostTopology


def apply(args: list[str], session: Session) -> int:
    """``poprun apply SPEC|PLAN.json [options] [PROGRAM ...]``."""
    ctx = Context.from_process(probe_hosts=True, remote_probe=_probe_topologies)  # a launch: read the hosts' topologies
    detach = args[:1] == ["--detach"]
    words = args[1:] if detach else args
    if words and is_plan_path(words[0]):
        rest = words[1:]
        if rest[:1] == ["--detach"]:
            detach, rest = True, rest[1:]
        return _apply_saved(words[0], rest, ctx, session, detach=detach)
    command, spec = read_command(session, list(args), ctx, prog="poprun apply", allow_spec_file=True, launch=True)
    reject_plan_options(command, "'poprun apply'")
    if command.help:
        return show_help()
    events = open_stream(command.events, ctx.environ)
    with session.planning() as console:
        plan = solve_spec(session, spec, ctx, require_program=True).plan
    return _run(plan, session, console=console, backend_span=backend_span(spec), events=events,
                detach=command.detach)


def _apply_saved(path: str, rest: list[str], ctx: Context, session: Session, *, detach: bool = False) -> int:
    """
    Run the plan saved in ``path`` exactly, once its inputs are checked (design.md section 3).

    Diagnostics:
        PR113 (unreadable), PR114 (not a plan of this format version), PR101 (words after
        the plan), PR403 (stale plan: every input that changed, together).
    """
    from poprun.planner.stale import validate_plan_inputs

    plan = read_plan(path, key="PLAN")
    reject_words_after_plan(rest)
    stale = validate_plan_inputs(plan, ctx, file=path)
    if stale:
        raise DiagnosticError(stale)
    events = open_stream(None, ctx.environ)
    return _run(plan, session, backend_span=SourceSpan(file=path, key_path="$.backend.name"), events=events,
                detach=detach)


def classic(args: list[str], session: Session) -> int:
    """``poprun [options] PROGRAM [ARGS...]``: plan and apply in one go, exactly like PopRun."""
    ctx = Context.from_process(probe_hosts=True, remote_probe=_probe_topologies)  # a launch: read the hosts' topologies
    command, spec = read_command(session, list(args), ctx, prog="poprun", allow_spec_file=False, launch=True)
    reject_plan_options(command, "the classic form")
    if command.help:
        return show_help()
    if command.version:
        return show_version(command.version_format)
    events = open_stream(command.events, ctx.environ)
    with session.planning() as console:
        solution = solve_spec(session, spec, ctx, require_program=True)
        if solution.plan.output.print_topology:
            console.write("stdout", topology(solution.plan).encode())
    return _run(solution.plan, session, console=console, backend_span=backend_span(spec), events=events,
                detach=command.detach)


def _run(plan: LaunchPlan, session: Session, *, backend_span: SourceSpan | None = None, console: Console | None = None,
         events: EventStream | None = None, detach: bool = False) -> int:
    """
    Run ``plan`` with its backend from a new registry; return poprun's exit status (``detach``: see ``--detach``).

    Plugins that failed to load are warned about (PR401); a backend that cannot be had exits
    125 with its diagnostic (PR400, PR402), placed at ``backend_span`` when given.
    """
    if not detach and (plan.offline or plan.partition is None):  # no partition step (start-up: see cgroup_ahead)
        from poprun.backends.local import cgroup_ahead

        cgroup_ahead(plan)  # its move overlaps the imports and the run record below; released below if not taken
    try:
        return _run_plan(plan, session, backend_span=backend_span, console=console, events=events, detach=detach)
    finally:
        from poprun.backends._process.cgroup import release_ahead

        release_ahead()


def _run_plan(plan: LaunchPlan, session: Session, *, backend_span: SourceSpan | None, console: Console | None,
              events: EventStream | None, detach: bool) -> int:
    """:func:`_run` once the launch's cgroup is begun."""
    from poprun.backends.registry import default_registry
    from poprun.cli.run import run_plan

    registry = default_registry()
    session.warn(registry.warnings)
    try:
        registry.factory(plan.backend.name, span=backend_span)
    except DiagnosticError as exc:
        if console is not None:
            console.close()
        session.warn(exc.diagnostics)
        return exitcode.LAUNCH
    os.environ.pop(EVENTS_VARIABLE, None)  # poprun's own setting: a poprun inside an instance must not reuse the stream
    return run_plan(plan, registry=registry, console=console, started=session.started, events=events,
                    detach=detach)


def _probe_topologies(hosts: tuple[str, ...], *, environ: Mapping[str, str]) -> Mapping[str, HostTopology | str]:
    """Read other hosts' topologies with the backend that can (the registry is made only when placement asks)."""
    from poprun.backends.registry import default_registry, topology_prober

    prober = topology_prober(default_registry())
    return prober(hosts, environ=environ) if prober is not None else dict.fromkeys(hosts, "no backend reads them")
