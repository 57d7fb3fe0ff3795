"""
The membership policy: spare hosts, the fewest hosts and the health check; decided, explained, and re-planned.

Layer: ``poprun.planner``; imports ``poprun.core``, the plan model, the solver's state and the
TOML front end, never the solver itself: :func:`cases` and :func:`resolved` are given it
(the solver calls :func:`cases`; :mod:`poprun.planner.replan`, the apply step's door to the
solver, calls :func:`resolved`).

:func:`membership` decides :class:`~poprun.planner.plan.Membership` from the spec and records
a decision for each part under a ``membership.`` key, which ``plan --explain`` shows in its own
section, with what the plan becomes in each case (:func:`cases`). A re-plan
(:func:`poprun.planner.replan.replan`, when an attempt ended because hosts were lost) never
patches a plan: it solves the spec kept in the plan again, on other hosts, so every rule of
the solver holds:

1. each lost host is replaced, in its place, by the first spare not used yet (instance 0's
   host too: MASTER_ADDR then follows it);
2. without a spare left, the plan shrinks by whole hosts, to no fewer than the minimum, each
   instance keeping its replicas (the IPUs of a lost host are gone with it), so the number of
   instances and of replicas shrinks with the hosts;
3. when fewer hosts than the minimum are left, or the solver finds no plan on those left, a
   coded diagnostic says why (PR310, PR311) and nothing starts.

A re-plan never adds hosts beyond those declared: a spare that took a host's place is used
up, and a plan that shrank never grows again.
"""

from __future__ import annotations

from poprun.core.diagnostic import DiagnosticError, error
from poprun.core.record import evolve, record
from poprun.core.span import SourceSpan
from poprun.planner import plan as p
from poprun.planner import value as conv
from poprun.planner.state import Solver

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from poprun.planner.context import Context
    from poprun.planner.spec import Spec
    from poprun.planner.trait import Traits

    Resolve = Callable[[Spec, Context], p.LaunchPlan]  # the solver, as a re-plan calls it

__all__ = ["MAX_CHECK_S", "MAX_COMMAND", "PREFIX", "Replanned", "cases", "change", "listed", "membership", "placed",
           "resolved"]

PREFIX = "membership."
MAX_COMMAND = 4096  # the --health-check command, in characters
MAX_CHECK_S = 3600  # the longest --health-check-timeout
MAX_CASES = 8  # the shrunk sizes explain shows one by one (then the smallest)
SPEC_FILE = "<the plan's membership.spec>"


def membership(s: Solver, topology: p.Topology, traits: Traits, backend: str) -> p.Membership:
    """
    Return the membership policy of the spec for a plan of ``topology`` run by ``backend`` (whose traits are ``traits``).

    Diagnostics: PR226 (a spare that is a host, or named twice), PR227 (a minimum above the
    host count), PR228 (spares or a minimum with a backend that cannot change hosts), PR216
    (too long a command), PR229 (a health check timeout out of range).
    """
    hosts = topology.hosts
    spares = _spares(s, hosts)
    minimum = _minimum(s, len(hosts))
    check = _health_check(s)
    timeout = _timeout(s, check)
    changes = bool(spares) or minimum < len(hosts)
    if changes and not traits.replaces_hosts:
        given = s.spec.spare_hosts if s.spec.spare_hosts is not None else s.spec.min_hosts
        assert given is not None
        what = "spare hosts" if spares else f"--min-hosts {minimum}"
        if traits.all_here:
            why = (f"the {backend} backend runs every instance on this machine: a re-plan would run on the same "
                   f"machine again, so there is no other host to move to and {what} would never be used")
            hint = ("give the hosts to run on (--host) so that the ssh, mpirun or slurm backend runs the plan, or "
                    "leave " + ("--spare-host" if spares else "--min-hosts") + " out")
        else:
            why = (f"the {backend} backend does not run a later attempt on other hosts (its replaces_hosts trait "
                   f"is off), so {what} would never be used")
            hint = ("use the ssh, mpirun or slurm backend (--backend), or leave "
                    + ("--spare-host" if spares else "--min-hosts") + " out")
        s.fail("PR228", "this backend cannot change hosts", detail=why, span=given.origin, hint=hint)
        changes = False
    return p.Membership(spares=spares if changes else (), min_hosts=minimum if s.spec.min_hosts is not None else 0,
                        health_check=check, health_check_timeout_ms=timeout,
                        spec=spec_text(s.spec) if changes else "")


def _spares(s: Solver, hosts: tuple[str, ...]) -> tuple[str, ...]:
    given = s.spec.spare_hosts
    if given is None or not given.value:
        s.decide(PREFIX + "spares", "none", SourceSpan.default(PREFIX + "spares"),
                 "default: a lost host is not replaced")
        return ()
    taken = [h for h in given.value if h in hosts]
    twice = sorted({h for h in given.value if given.value.count(h) > 1})
    if taken or twice:
        name = (taken or twice)[0]
        s.fail("PR226", "spare host named twice",
               detail=f"'{name}' is " + ("a host of the launch too" if taken else "given twice as a spare"),
               span=given.origin, hint="a spare host is one that no instance runs on until a host is replaced: "
                                       f"remove '{name}' from the " + ("spares or the hosts" if taken else "spares"))
        return ()
    return s.decide(PREFIX + "spares", given.value, given.origin,
                    "as given: each takes the place of a lost or unhealthy host, in this order")


def _minimum(s: Solver, hosts: int) -> int:
    given = s.spec.min_hosts
    if given is None:
        s.decide(PREFIX + "min_hosts", hosts, SourceSpan.default(PREFIX + "min_hosts"),
                 "default: every host of the plan (a restart never runs on fewer)")
        return hosts
    if given.value > hosts:
        s.fail("PR227", "more hosts asked for than the launch has",
               detail=f"a minimum of {given.value} hosts is more than the {hosts} host" + ("s" * (hosts != 1))
                      + " the launch runs on", span=given.origin,
               hint=f"give a minimum of {hosts} host" + "s" * (hosts != 1) + " or fewer (--min-hosts, [membership] "
                    "min_hosts, 'min hosts'), or give more hosts")
        return hosts
    return s.decide(PREFIX + "min_hosts", given.value, given.origin,
                    "as given: without a spare left, a restart may run on fewer hosts, down to this many")


def _health_check(s: Solver) -> str:
    given = s.spec.health_check
    if given is None or not given.value.strip():
        s.decide(PREFIX + "health_check", "none", SourceSpan.default(PREFIX + "health_check"),
                 "default: no health check")
        return ""
    if len(given.value) > MAX_COMMAND:
        s.fail("PR216", "command too long",
               detail=f"the health check is {len(given.value)} characters long (at most {MAX_COMMAND})",
               span=given.origin, hint="put the check in a script on every host and give its path")
        return ""
    return s.decide(PREFIX + "health_check", given.value, given.origin,
                    "as given: runs on every host, spares included, before the first start and each restart")


def _timeout(s: Solver, check: str) -> int:
    given = s.spec.health_check_timeout
    default = p.NO_MEMBERSHIP.health_check_timeout_ms
    if given is not None and not 0 < given.value <= MAX_CHECK_S * 1000:
        s.fail("PR229", "health check timeout out of range",
               detail=f"a health check timeout of {conv.seconds_text(given.value)} s is not from 0.001 to {MAX_CHECK_S} s",
               span=given.origin, hint=f"give a number of seconds from 0.001 to {MAX_CHECK_S}")
        return default
    if not check:
        return given.value if given is not None else default
    if given is not None:
        s.decide(PREFIX + "health_check_timeout", f"{conv.seconds_text(given.value)} s", given.origin, "as given")
        return given.value
    s.decide(PREFIX + "health_check_timeout", f"{conv.seconds_text(default)} s",
             SourceSpan.default(PREFIX + "health_check_timeout"), "default: a check that runs longer fails")
    return default


def spec_text(spec: Spec) -> str:
    """Return ``spec`` as the TOML a re-plan solves again (what ``--export-config`` writes)."""
    from poprun.planner.tomlspec import to_toml

    return to_toml(spec)


# -- re-planning ---------------------------------------------------------------------------
@record
class Replanned:
    """
    The plan of the next attempt, and what changed: ``removed`` hosts left out, ``added`` spares that took their places.

    ``shrunk`` is whether the plan has fewer hosts than the one before; ``why`` says it in one line.
    """

    plan: p.LaunchPlan
    removed: tuple[str, ...]
    added: tuple[str, ...]
    shrunk: bool
    why: str


def placed(plan: p.LaunchPlan, lost: Mapping[str, str], unusable: Iterable[str]) -> tuple[list[str], list[str], list[str]]:
    """
    Return the hosts of the next attempt, the spares that joined and the spares left, ``lost`` left out.

    Each lost host's place goes to the first spare that is neither lost nor ``unusable``;
    without one, the place goes (the plan shrinks). Raises PR310 when fewer hosts than the
    minimum would be left (or no re-plan may change the hosts).
    """
    policy, hosts = plan.membership, plan.topology.hosts
    gone = [h for h in hosts if h in lost]
    bad = set(unusable) | set(lost)
    free = [h for h in policy.spares if h not in bad]
    kept: list[str] = []
    added: list[str] = []
    for host in hosts:
        if host not in lost:
            kept.append(host)
        elif free:
            added.append(free.pop(0))
            kept.append(added[-1])
    smallest = policy.smallest(len(hosts))
    if len(kept) < smallest or (gone and not policy.replans):
        why = "; ".join(f"{h}: {lost[h]}" for h in gone)
        spent = [h for h in policy.spares if h in bad]
        spares = (f"; spare {listed(spent)} cannot take a place" if spent else "") if policy.spares else ""
        raise DiagnosticError([error(
            "PR310", "too few hosts left",
            detail=f"{listed(gone)} left the launch ({why}){spares}; {len(kept)} of {len(hosts)} hosts are left, and "
                   + (f"the plan runs on no fewer than {smallest} (--min-hosts)" if policy.replans
                      else "the plan has no spare host and runs on no fewer hosts"),
            span=SourceSpan.environment("host" + "s" * (len(gone) != 1) + f" {listed(gone)} lost"),
            hint="mend the hosts and launch again; to keep running next time, give spare hosts (--spare-host) "
                 "or a smaller --min-hosts")])
    return kept, added, free


def resolved(plan: p.LaunchPlan, hosts: tuple[str, ...], spares: tuple[str, ...], ctx: Context, *, why: str,
             resolve: Resolve) -> p.LaunchPlan:
    """
    Return the plan's spec solved again (by ``resolve``, the solver) on ``hosts``, ``spares`` left.

    Each host keeps as many instances, and each instance as many replicas, as in ``plan``.

    Raises:
        DiagnosticError: PR311 when the solver finds no plan there (its own diagnostics follow).
    """
    from poprun.planner.tomlspec import parse_toml

    spec = _resized(parse_toml(plan.membership.spec, file=SPEC_FILE), plan, hosts, spares)
    try:
        replanned = resolve(spec, ctx)
    except DiagnosticError as exc:
        raise DiagnosticError([error(
            "PR311", "no plan on the hosts left",
            detail=f"on {len(hosts)} host" + ("s" * (len(hosts) != 1)) + f" ({listed(hosts)}) after {why}: "
                   + "; ".join(d.summary + (f" ({d.detail})" if d.detail else "") for d in exc.diagnostics if d.is_error),
            span=SourceSpan.environment(f"the hosts left: {listed(hosts)}"),
            hint="mend the hosts and launch again; to keep running next time, give spare hosts (--spare-host), "
                 "or a --min-hosts whose smaller plans hold ('poprun plan --explain' shows each case)"),
            *exc.diagnostics]) from exc
    decision = p.Decision(key=PREFIX + "replan", value=",".join(hosts), source=SPEC_FILE, reason=why)
    return evolve(replanned, explanation=(*replanned.explanation, decision))


def _resized(spec: Spec, plan: p.LaunchPlan, hosts: tuple[str, ...], spares: tuple[str, ...]) -> Spec:
    """
    Return ``spec`` on ``hosts``: each host with as many instances, each instance with as many replicas, as in ``plan``.

    The plan's backend and working directory are kept. Everything else the user gave stays as given (``--num-ilds`` too): a smaller plan that breaks
    one of the solver's rules with it is no plan (PR311), never a plan the user did not ask for.
    """
    from poprun.planner.spec import Sourced

    here = SourceSpan.derived(PREFIX + "replan")
    topology = plan.topology
    instances = topology.instances_per_host * len(hosts)
    resized = {
        "hosts": Sourced(hosts, here), "host_file": None,
        "instances": Sourced(instances, here), "replicas": Sourced(topology.replicas_per_instance * instances, here),
        "spare_hosts": Sourced(spares, here) if spares else None,
        "backend": Sourced(plan.backend.name, here),
    }
    if spec.working_dir is None and plan.instances:  # where the plan runs, not where a re-plan happens to be made
        resized["working_dir"] = Sourced(plan.instances[0].cwd, here)
    return evolve(spec, **resized)


def change(removed: tuple[str, ...], added: tuple[str, ...], shrunk: bool, before: p.LaunchPlan,
            after: p.LaunchPlan) -> str:
    """Return what a re-plan changed, in words."""
    parts = [f"{a} replaces {r}" for r, a in zip(removed, added, strict=False)]
    if shrunk:
        left = removed[len(added):]
        parts.append(f"{listed(left)} left out: {len(before.topology.hosts)} -> {len(after.topology.hosts)} hosts, "
                     f"{before.topology.num_instances} -> {after.topology.num_instances} instances, "
                     f"{before.topology.num_replicas} -> {after.topology.num_replicas} replicas")
    return "; ".join(parts)


def listed(hosts: Iterable[str]) -> str:
    """Return host names as a message lists them."""
    return ", ".join(hosts)


# -- explain: what the plan becomes in each case -------------------------------------------
def cases(s: Solver, plan: p.LaunchPlan, resolve: Resolve) -> None:
    """
    Record, as ``membership.case.*`` decisions, what ``plan`` becomes when hosts are lost: each spare's turn, then each smaller size.

    The smaller sizes are solved again (by ``resolve``) as a re-plan would, leaving out the last hosts,
    at most :data:`MAX_CASES` of them one by one, then the smallest.
    """
    policy, hosts = plan.membership, plan.topology.hosts
    if not policy.replans:
        return
    shape = _shape(plan)
    if policy.spares:
        s.decide(PREFIX + "case.replaced", shape, SourceSpan.derived(PREFIX + "case"),
                 f"a lost or unhealthy host is replaced by the next spare ({listed(policy.spares)}): "
                 f"up to {len(policy.spares)} host" + ("s" * (len(policy.spares) != 1)) + ", the plan keeps its shape")
    smallest = policy.smallest(len(hosts))
    sizes = list(range(len(hosts) - 1, smallest - 1, -1))
    if len(sizes) > MAX_CASES:
        sizes = [*sizes[:MAX_CASES - 1], sizes[-1]]
    lost_first = len(policy.spares)
    for size in sizes:
        kept = hosts[:size]
        key = PREFIX + f"case.hosts_{size}"
        count = len(hosts) - size + lost_first
        when = f"{count} host" + "s" * (count != 1) + " lost"
        try:
            after = resolved(plan, kept, (), s.ctx, why=when, resolve=resolve)
        except DiagnosticError as exc:
            then = "more hosts are left out, down to the minimum" if size > smallest else "the run ends"
            s.decide(key, "no plan", SourceSpan.derived(PREFIX + "case"),
                     f"{when}, none left to replace them: no plan on {size} hosts ({_first_reason(exc)}): {then}")
            continue
        s.decide(key, _shape(after), SourceSpan.derived(PREFIX + "case"),
                 f"{when}, none left to replace them: the plan shrinks by whole hosts, each instance keeps its "
                 f"{plan.topology.replicas_per_instance} replica" + ("s" * (plan.topology.replicas_per_instance != 1)))
    if smallest > 1:
        s.decide(PREFIX + "case.fewer", "ends", SourceSpan.derived(PREFIX + "case"),
                 f"fewer than {smallest} hosts left: the run ends (PR310)")
    if plan.recovery.scope == "instance" and plan.recovery.max_restarts > 0:
        s.decide(PREFIX + "case.running", "ends", SourceSpan.derived(PREFIX + "case"),
                 "--restart-scope instance starts a failed instance again alone, where it ran: a host lost while "
                 "the run runs ends it (PR411); the cases above hold for hosts that fail their preflight or "
                 "health check before the start")


def _shape(plan: p.LaunchPlan) -> str:
    t = plan.topology
    return (f"{len(t.hosts)} host" + ("s" * (len(t.hosts) != 1)) + f", {t.num_instances} instance"
            + ("s" * (t.num_instances != 1)) + f", {t.num_replicas} replica" + ("s" * (t.num_replicas != 1)))


def _first_reason(exc: DiagnosticError) -> str:
    found = [d for d in exc.diagnostics if d.code != "PR311" and d.is_error]
    first = found[0] if found else exc.diagnostics[0]
    return first.summary + (f": {first.detail}" if first.detail else "")
