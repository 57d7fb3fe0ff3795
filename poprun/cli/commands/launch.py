"""
``poprun apply`` and the classic ``poprun [options] PROGRAM [ARGS...]``: plan (or read a saved plan) and run it.

Layer: ``poprun.cli``. The run itself is :func:`poprun.cli.run.run_plan` over :func:`poprun.apply.apply`.

Each command has one backend registry (:class:`~poprun.backends.registry.OnDemand`: made when
placement first reads another host's topology, or for the run), handed to planning and to the
apply step, and closed in a ``finally`` when the command ends: what the topology probe's backend
opened, the launch uses, and nothing of it outlives the command.
"""

from __future__ import annotations

import os

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
    from poprun.backends.registry import OnDemand
    from poprun.cli.progress import Console


def apply(args: list[str], session: Session) -> int:
    """``poprun apply SPEC|PLAN.json [options] [PROGRAM ...]``."""
    from poprun.backends.registry import OnDemand

    with OnDemand() as registry:
        return _apply(args, session, registry)


def _apply(args: list[str], session: Session, registry: OnDemand) -> int:
    """``poprun apply``, with the command's ``registry``."""
    # a launch: read the hosts' topologies
    ctx = Context.from_process(probe_hosts=True, remote_probe=registry.probe_topologies,
                               backend_declares=registry.declared)
    detach = args[:1] == ["--detach"]
    words = args[1:] if detach else args
    if words and is_plan_path(words[0]):
        rest = words[1:]
        if rest[:1] == ["--detach"]:
            detach, rest = True, rest[1:]
        return _apply_saved(words[0], rest, ctx, session, registry, detach=detach)
    command, spec = read_command(session, list(args), ctx, prog="poprun apply", allow_spec_file=True, launch=True)
    reject_plan_options(command, "'poprun apply'")
    if command.help:
        return show_help()
    events = open_stream(command.events, ctx.environ)
    with session.planning() as console:
        plan = solve_spec(session, spec, ctx, require_program=True).plan
    return _run(plan, session, registry, console=console, backend_span=backend_span(spec), events=events,
                detach=command.detach)


def _apply_saved(path: str, rest: list[str], ctx: Context, session: Session, registry: OnDemand, *,
                 detach: bool = False) -> int:
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
    return _run(plan, session, registry, backend_span=SourceSpan(file=path, key_path="$.backend.name"),
                events=events, detach=detach)


def classic(args: list[str], session: Session) -> int:
    """``poprun [options] PROGRAM [ARGS...]``: plan and apply in one go, exactly like PopRun."""
    from poprun.backends.registry import OnDemand

    with OnDemand() as registry:
        return _classic(args, session, registry)


def _classic(args: list[str], session: Session, registry: OnDemand) -> int:
    """Plan and apply in one go, with the command's ``registry`` (:func:`classic`)."""
    # a launch: read the hosts' topologies
    ctx = Context.from_process(probe_hosts=True, remote_probe=registry.probe_topologies,
                               backend_declares=registry.declared)
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
    return _run(solution.plan, session, registry, console=console, backend_span=backend_span(spec), events=events,
                detach=command.detach)


def _run(plan: LaunchPlan, session: Session, backends: OnDemand, *, backend_span: SourceSpan | None = None,
         console: Console | None = None, events: EventStream | None = None, detach: bool = False) -> int:
    """
    Run ``plan`` with its backend from the command's registry; return poprun's exit status (``detach``: see ``--detach``).

    Plugins that failed to load are warned about (PR401); a backend that cannot be had exits
    125 with its diagnostic (PR400, PR402), placed at ``backend_span`` when given. With
    ``detach``, what the registry's backends hold (the topology probe's connections) is closed
    before the run's supervisor is forked: the supervisor opens its own, and the command, which
    ends first, closes nothing the run uses.
    """
    if not detach and (plan.offline or plan.partition is None):  # no partition step (start-up: see cgroup_ahead)
        from poprun.backends.local import cgroup_ahead

        cgroup_ahead(plan)  # its move overlaps the imports and the run record below; released below if not taken
    try:
        return _run_plan(plan, session, backends, backend_span=backend_span, console=console, events=events,
                         detach=detach)
    finally:
        from poprun.process.cgroup import release_ahead

        release_ahead()


def _run_plan(plan: LaunchPlan, session: Session, backends: OnDemand, *, backend_span: SourceSpan | None,
              console: Console | None, events: EventStream | None, detach: bool) -> int:
    """:func:`_run` once the launch's cgroup is begun."""
    from poprun.cli.run import run_plan

    registry = backends()
    session.warn(registry.warnings)
    try:
        registry.factory(plan.backend.name, span=backend_span)
    except DiagnosticError as exc:
        if console is not None:
            console.close()
        session.warn(exc.diagnostics)
        return exitcode.LAUNCH
    os.environ.pop(EVENTS_VARIABLE, None)  # poprun's own setting: a poprun inside an instance must not reuse the stream
    if detach:
        registry.close()
    return run_plan(plan, registry=registry, console=console, started=session.started, events=events,
                    detach=detach)
