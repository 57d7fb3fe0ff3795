"""
``poprun plan``: show the plan of a spec or command line, or a saved plan, in any view of :mod:`poprun.cli.views`.

Layer: ``poprun.cli``.
"""

from __future__ import annotations

import sys

from poprun.cli import exitcode
from poprun.cli.commands.common import (
    check_format,
    check_plugin_backend,
    emit,
    outside_slurm,
    read_command,
    read_plan,
    reject_words_after_plan,
    show_help,
    solve_spec,
    without_plan_options,
)
from poprun.cli.session import Session
from poprun.cli.views import DIFF_FORMATS, PLAN_FORMATS, SAVED_PLAN_FORMATS, VIEWS, Shown, View
from poprun.core.diagnostic import DiagnosticError, warning
from poprun.core.span import COMMAND_LINE
from poprun.planner.context import Context
from poprun.planner.flags import CommandLine, parse_flags
from poprun.planner.load import is_plan_path, is_spec_path
from poprun.planner.plan import LaunchPlan

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from poprun.backends.registry import OnDemand

NEW_PLAN = "the plan of this command line"


def plan(args: list[str], session: Session) -> int:
    """``poprun plan [SPEC] [options] [PROGRAM [ARGS...]]``; ``--format sbatch`` shows what ``poprun submit`` submits."""
    from poprun.backends.registry import OnDemand

    with OnDemand() as registry:  # the command's: made when a backend is first asked, closed at the end
        return _plan(args, session, registry)


def _plan(args: list[str], session: Session, registry: OnDemand) -> int:
    """``poprun plan``, with the command's backend ``registry``."""
    ctx = Context.from_process(backend_declares=registry.declared)
    args = _file_first(list(args))
    if args and is_plan_path(args[0]):
        return _plan_saved(args[0], args[1:], session, registry)
    command, spec = read_command(session, list(args), ctx, prog="poprun plan", allow_spec_file=True)
    view = VIEWS.get(command.format)
    if view is not None and view.outside_allocation:  # planned as outside an allocation, as poprun submit does
        ctx = outside_slurm(ctx)
    if command.help:
        return show_help()
    _warn_plan_options_in_program(session, command)
    check_format(command, PLAN_FORMATS if command.diff is None else DIFF_FORMATS,
                 "'poprun plan --diff'" if command.diff else "'poprun plan'")
    old = read_plan(command.diff.value, key="--diff") if command.diff is not None else None
    solution = solve_spec(session, spec, ctx, require_program=False, explain_cases=True)
    check_plugin_backend(session, spec, registry)
    from poprun.apply import partition

    planned, seen = partition.planned(solution.plan, ctx.environ)  # a bounded look at the V-IPU server
    session.warn(seen)
    assert view is not None  # check_format
    if command.diff is not None and old is not None:
        emit(_diff(old, planned, view, old_name=command.diff.value), command)
        return exitcode.OK
    launch = (sys.executable, "-m", "poprun.cli.main", *without_plan_options(args))
    emit(view.show(Shown(plan=planned, spec=spec, explain=command.explain, expand=command.expand, launch=launch,
                         hosts=spec.hosts.value if spec.hosts is not None else (), registry=registry)), command)
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


def _plan_saved(path: str, rest: list[str], session: Session, registry: OnDemand) -> int:
    """
    ``poprun plan PLAN.json [--explain] [--format text|json|dot] [-o FILE]``: show a saved plan, exactly as apply runs it.

    ``poprun plan --diff OLD.json NEW.json`` shows what changed from one saved plan to another.

    Diagnostics:
        PR113 (unreadable), PR114 (not a valid plan), PR101 (options that would change the
        plan, or a program), PR115 (a format a saved plan cannot be shown in).
    """
    saved = read_plan(path, key="PLAN")
    reject_words_after_plan(without_plan_options(rest), what="'poprun plan PLAN.json' takes only --explain, "
                            "--format, -o and --expand: a saved plan is shown as it is")
    command = parse_flags(rest, prog=f"poprun plan {path}")
    session.sources[COMMAND_LINE] = command.text
    if command.diff is not None:  # plan --diff OLD.json NEW.json: two saved plans
        check_format(command, DIFF_FORMATS, "'poprun plan --diff'")
        old = read_plan(command.diff.value, key="--diff")
        emit(_diff(old, saved, VIEWS[command.format], old_name=command.diff.value, new_name=path), command)
        return exitcode.OK
    check_format(command, SAVED_PLAN_FORMATS, "'poprun plan PLAN.json'")
    emit(VIEWS[command.format].show(Shown(plan=saved, explain=command.explain, expand=command.expand,
                                          registry=registry)), command)
    return exitcode.OK


def _warn_plan_options_in_program(session: Session, command: CommandLine) -> None:
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
            session.warn((warning("PR218", f"'{word}' after the program is the program's argument",
                           detail=f"poprun reads its options only before the program; '{word}' is passed to "
                                  f"{program.value[0]}", span=program.origin,
                           hint=f"put {option.name} before the program: 'poprun plan {option.name} ... PROGRAM'"),))
            return


def _diff(old: LaunchPlan, new: LaunchPlan, view: View, *, old_name: str, new_name: str = NEW_PLAN) -> str:
    """Return what changed from plan ``old`` to ``new`` (the command line's, or a saved one), in ``view``."""
    from poprun.render.diff import diff_plans

    assert view.diff is not None  # check_format
    return view.diff(diff_plans(old, new), old_name, new_name)
