"""
Re-planning an attempt: the apply step's one door to the solver.

Layer: ``poprun.planner``; imports the membership policy and, on use, the solver. When an
attempt ended because hosts were lost (gone, failed their preflight or their health check),
:func:`replan` solves the plan's own spec again without them, as
:mod:`poprun.planner.membership` describes: spares first, then fewer hosts down to the minimum,
else a coded diagnostic. The apply step imports this module, never the solver.
"""

from __future__ import annotations

from poprun.core.diagnostic import DiagnosticError, error
from poprun.core.record import evolve
from poprun.core.span import SourceSpan
from poprun.planner.membership import Replanned, change, placed, resolved

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from poprun.planner import plan as p
    from poprun.planner.context import Context
    from poprun.planner.spec import Spec

__all__ = ["Replanned", "replan"]


def replan(plan: p.LaunchPlan, lost: Mapping[str, str], ctx: Context, *, unusable: Iterable[str] = ()) -> Replanned:
    """
    Return the plan of the next attempt of ``plan`` without the hosts of ``lost`` (host -> why, in the order found).

    ``unusable`` are spares that cannot take a host's place (they failed their health check).
    The plan's own spec is solved again in ``ctx`` (see :mod:`poprun.planner.membership`).

    Raises:
        ValueError: when ``lost`` names no host of the plan.
        DiagnosticError: PR310 when fewer hosts than the minimum are left; PR311 when the
            solver finds no plan on the hosts left (its own diagnostics follow); PR312 when the
            spec the plan keeps does not make the plan itself (a saved plan edited by hand).
    """
    hosts = plan.topology.hosts
    gone = tuple(h for h in hosts if h in lost)
    if not gone:
        msg = "replan() needs a host of the plan to leave out"
        raise ValueError(msg)
    kept, added, free = placed(plan, lost, unusable)
    why = "; ".join(f"{h}: {lost[h]}" for h in gone)
    _check_kept_spec(plan, ctx, gone=gone)
    solved, left_out = _largest(plan, kept, tuple(free), ctx, why=why)
    if left_out:
        why += f"; {', '.join(left_out)}: left out too, as no plan holds on {len(kept)} hosts"
    removed = (*gone, *left_out)
    added = [h for h in added if h not in left_out]
    shrunk = len(solved.topology.hosts) < len(hosts)
    return Replanned(plan=solved, removed=removed, added=tuple(added), shrunk=shrunk,
                     why=change(removed, tuple(added), shrunk, plan, solved) + f" ({why})")


def _largest(plan: p.LaunchPlan, kept: list[str], spares: tuple[str, ...], ctx: Context, *,
             why: str) -> tuple[p.LaunchPlan, tuple[str, ...]]:
    """
    Return the plan on the most of ``kept`` (the first ones) that the solver finds one for, and the hosts it leaves out.

    The sizes go down by whole hosts to the plan's minimum (``--num-ilds 2`` holds on 4 hosts
    and 2, not on 3).

    Raises:
        DiagnosticError: PR311 for the largest size when no size down to the minimum has a plan.
    """
    smallest = plan.membership.smallest(len(plan.topology.hosts))
    first: DiagnosticError | None = None
    for size in range(len(kept), smallest - 1, -1):
        try:
            return resolved(plan, tuple(kept[:size]), spares, ctx, why=why, resolve=_solve), tuple(kept[size:])
        except DiagnosticError as exc:
            first = first or exc
    assert first is not None
    raise first


def _check_kept_spec(plan: p.LaunchPlan, ctx: Context, *, gone: tuple[str, ...] = ()) -> None:
    """
    Raise PR312 unless the spec ``plan`` keeps, solved on the plan's own hosts, runs what the plan runs.

    The hosts ``gone`` (lost) are not probed again: their CPUs are unknown now, so the placement
    and the thread variables the solver derives from the hosts' CPUs (``OMP_NUM_THREADS``,
    ``MKL_DYNAMIC``) are not compared (a lost host of 64 cores is no edited plan).

    A saved plan is untrusted input, and what a reviewer reads in it (each instance's program,
    directory and environment, and the plan's settings: mpirun's options, the cache, the keys,
    the backend's settings, recovery, the health check) is what every attempt must run: a kept
    spec that would run anything else after a re-plan (edited by hand, or written by another
    tool) is refused.
    """
    again = resolved(plan, plan.topology.hosts, plan.membership.spares, _unprobed(ctx, gone), why="checking the kept spec",
                     resolve=_solve)
    given = _given_names(plan.membership.spec)
    if _program(again, given, gone) != _program(plan, given, gone) or _settings(again) != _settings(plan):
        raise DiagnosticError([error(
            "PR312", "the plan's kept spec does not make the plan",
            detail="membership.spec, solved on the plan's own hosts, runs another program, directory or environment "
                   "than the plan's instances, or with other settings than the plan's: a re-planned attempt would not "
                   "run what the plan shows",
            span=SourceSpan.environment("the plan's membership.spec"),
            hint="make the plan again with 'poprun plan ... --format json' rather than editing it, then apply it")])


def _program(plan: p.LaunchPlan, given: frozenset[str], gone: tuple[str, ...] = ()) -> tuple[object, ...]:
    """
    Return what each instance of ``plan`` runs: program, directory, mpirun's arguments and environment.

    The environment as its names (set, forwarded, unset) and the values of those the user gave
    (``given``): the values the planner derives from where the instances run and from this
    machine (MASTER_ADDR as the hosts reach it, the ranks) are the planner's to decide again.
    With hosts ``gone``, the thread variables (derived from the hosts' CPUs, unknown on those)
    are left out.
    """
    def names(instance: p.Instance) -> tuple[str, ...]:
        return tuple(name for name, _ in instance.env.set if not (gone and name in _THREADS))

    return tuple((i.argv, i.cwd, i.mpi_local_args, i.env.forward, i.env.unset, names(i),
                  tuple((name, value) for name, value in i.env.set if name in given)) for i in plan.instances)


def _given_names(text: str) -> frozenset[str]:
    """Return the variables the kept spec sets to values (``-x NAME=VALUE``, for every instance or one)."""
    from poprun.planner.tomlspec import parse_toml

    spec = parse_toml(text, file="<the plan's membership.spec>")
    names = {e.value.name for e in spec.env if e.value.value is not None}
    names |= {v.name for a in spec.instance_args for v in a.value.env if v.value is not None}
    return frozenset(names)


_THREADS = ("OMP_NUM_THREADS", "MKL_DYNAMIC")  # poprun.planner.binding's, from a host's CPUs


def _unprobed(ctx: Context, gone: tuple[str, ...]) -> Context:
    """Return ``ctx`` whose probe of other hosts never reaches the hosts ``gone`` (they stopped answering)."""
    probe = ctx.remote_probe
    if probe is None or not gone:
        return ctx

    def without(hosts: tuple[str, ...]) -> Mapping[str, object]:
        asked = tuple(h for h in hosts if h not in gone)
        found: dict[str, object] = dict(probe(asked)) if asked else {}
        return found | {h: "left the launch: not probed again" for h in hosts if h in gone}

    return evolve(ctx, remote_probe=without)


def _settings(plan: p.LaunchPlan) -> tuple[object, ...]:
    """
    Return the settings ``plan`` runs with besides its hosts and instances: all a re-plan must keep.

    Not compared: why the backend was chosen (the re-plan names it itself), whether mpirun may
    run as root (read from the process that solves: a plan applied by another user), the
    membership's spares and minimum (what a re-plan changes) and its kept spec.
    """
    backend = plan.backend
    return (plan.offline, plan.offline_target, plan.output, plan.cache, plan.ssh_keys, plan.partition, plan.mask,
            plan.recovery, (backend.name, backend.traits, backend.settings),
            (plan.mpi.global_args, plan.mpi.host_subnet, plan.mpi.srun_plugin),
            (plan.membership.health_check, plan.membership.health_check_timeout_ms))


def _solve(spec: Spec, ctx: Context) -> p.LaunchPlan:
    from poprun.planner.solve import solve

    return solve(spec, ctx, explain_cases=False).plan
