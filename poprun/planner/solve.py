"""
Solving: a Spec and a Context to a complete, explained LaunchPlan.

Layer: ``poprun.planner``; imports ``poprun.core``, the planner's models and the policies
(:mod:`policy`, :mod:`environment`, :mod:`binding`); Slurm's variables only inside an allocation.

The solver fills in every value the user left open, checks the rules of
:mod:`constraint`, and records for each value its source and the reason (what
``--explain`` prints). Errors are collected and raised once at the end.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from poprun import __version__
from poprun.core.diagnostic import Diagnostic, DiagnosticError, error
from poprun.core.hint import join_or, suggestion_hint
from poprun.core.record import evolve, positional_record
from poprun.core.span import SourceSpan
from poprun.planner import constraint, environment, policy
from poprun.planner import plan as p
from poprun.planner.binding import bind, threads
from poprun.planner.context import Context
from poprun.planner.recovery import recovery
from poprun.planner.spec import Sourced, Spec
from poprun.planner.state import Solver, is_on, value_of
from poprun.planner.target import DEFAULT_ILD_SIZE, TARGETS, Target

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from poprun.planner.slurm import Allocation
    from poprun.planner.trait import Traits


@positional_record
class Solution:
    """A plan and the warnings found while making it."""

    plan: p.LaunchPlan
    warnings: tuple[Diagnostic, ...]


def solve(spec: Spec, ctx: Context, *, require_program: bool = True, explain_cases: bool = True) -> Solution:
    """
    Return the plan of ``spec`` in ``ctx``.

    ``explain_cases``: with a membership policy that may change the hosts, solve the smaller
    plans too, to explain what the plan becomes in each case (not when re-planning).

    Diagnostics:
        PR202, PR203, PR205-PR209, PR215 (validation); PR219-PR221 (recovery; PR223 and PR224
        are warnings); PR226-PR229 (membership); PR238-PR240, PR468, PR469 (notifier, metrics file); PR256-PR259,
        PR322, PR324 (rank order); PR241-PR249, PR316 (devices); PR318, PR474-PR478 (network); PR300-PR305 (division
        rules); PR304 is a warning. Raises :class:`DiagnosticError` when any error is found.
    """
    solver = Solver(spec, ctx)
    plan = _solve(solver, require_program=require_program)
    if solver.diags.has_errors or plan is None:
        raise DiagnosticError(solver.diags)
    if explain_cases and plan.membership.replans:
        from poprun.planner.membership import cases

        cases(solver, plan, lambda spec, ctx: solve(spec, ctx, explain_cases=False).plan)
        plan = evolve(plan, explanation=tuple(solver.decisions))
    return Solution(plan=plan, warnings=solver.diags.warnings)


def _solve(s: Solver, *, require_program: bool) -> p.LaunchPlan | None:
    _check_text(s)
    target = _target(s)
    topology = _topology(s, target)
    if topology is None:
        return None
    topology, rank = _rank_order(s, topology)
    s.diags.extend(environment.validate_instance_args(s.spec, topology.num_instances))
    partition = policy.partition(s, topology)
    environment.check_user_env(s, partition=partition is not None)
    cache = policy.cache(s, topology)
    output = policy.output(s, topology)
    placement = policy.placement(s, topology)
    argv = policy.program(s, require_program=require_program)
    cwd = s.pick("cwd", s.spec.working_dir, s.ctx.cwd, "the directory poprun runs in (section 2.2.4: the same on every host)")
    uses_mpi = policy.mpi_use(s, topology, argv, cwd)  # reads the program once: both steps below need it
    restarts = recovery(s, topology.hosts)
    planned = policy.backend_name(s, topology, uses_mpi=uses_mpi)[0]
    traits = policy.traits_for(s, planned)
    base_env = environment.base_env(s, topology, partition, cache, target, backend=planned, traits=traits,
                                    recovery=restarts)
    instances = tuple(
        environment.instance(s, topology, i, argv=argv, cwd=cwd, base=base_env, placement=placement, partition=partition)
        for i in range(topology.num_instances)
    )
    instances = bind(s, _grouped(instances, rank), placement)
    here = traits.all_here or is_on(s.spec.offline_mode)
    instances, devices = _devices(s, instances, placement, all_here=here)
    instances = threads(s, instances, all_here=here)
    backend = policy.backend(s, topology, uses_mpi=uses_mpi)
    instances, net = _network(s, instances, traits)
    members = _membership(s, topology, traits, planned)
    observed = _observe(s)
    # as root, mpirun refuses to start without --allow-run-as-root: real poprun always added it
    root = s.spec.allow_run_as_root.value if s.spec.allow_run_as_root is not None else s.ctx.is_root
    mpi = p.Mpi(global_args=policy.mpi_global(s), host_subnet=value_of(s.spec.host_subnet),
                allow_run_as_root=bool(root) or "--allow-run-as-root" in policy.mpi_global(s),
                crowded_hosts=policy.crowded_hosts(s, topology, instances, backend),
                srun_plugin=policy.srun_mpi(s, backend, uses_mpi))
    keys = p.SshKeyDistribution(enabled=is_on(s.spec.distribute_ssh_key),
                                key_path=value_of(s.spec.distribute_ssh_key_path),
                                key_type=value_of(s.spec.distribute_ssh_key_type))
    notes = tuple(p.Note(code=d.code, summary=d.summary, hint=d.hint) for d in s.diags.warnings)
    mask = _mask(s)
    return p.LaunchPlan(
        poprun_version=__version__, topology=topology, instances=instances, partition=partition,
        offline=is_on(s.spec.offline_mode), offline_target=target.name if target else None,
        output=output, cache=cache, mpi=mpi, ssh_keys=keys, backend=backend,
        explanation=tuple(s.decisions), warnings=notes, mask=mask, recovery=restarts, membership=members,
        observe=observed, rank_order=rank, devices=devices, network=net,
    )


def _grouped(instances: tuple[p.Instance, ...], rank: p.RankOrder) -> tuple[p.Instance, ...]:
    """Return the instances with their groups under a topology rank order (no module to import otherwise)."""
    if rank.mode != "topology":
        return instances
    from poprun.planner.rankorder import with_groups

    return with_groups(instances, rank)


def _rank_order(s: Solver, topology: p.Topology) -> tuple[p.Topology, p.RankOrder]:
    """Return the topology with its hosts in the rank order the spec asks for (no module to import when it names none)."""
    if s.spec.rank_order is None and s.spec.network_topology is None:
        return topology, p.NO_RANK_ORDER
    from poprun.planner.rankorder import rank_order

    hosts, rank = rank_order(s, topology.hosts)
    return evolve(topology, hosts=hosts), rank


def _devices(s: Solver, instances: tuple[p.Instance, ...], placement: p.Placement, *,
             all_here: bool) -> tuple[tuple[p.Instance, ...], p.Devices]:
    """Return the instances with their devices and the devices record: none when not asked (no module to import)."""
    if s.spec.devices_per_instance is None and s.spec.device_visibility is None:
        return instances, p.NO_DEVICES
    from poprun.planner import devices

    if s.spec.devices_per_instance is None:
        return instances, devices.no_devices(s)
    return devices.assign(s, instances, placement, all_here=all_here)


def _membership(s: Solver, topology: p.Topology, traits: Traits, backend: str) -> p.Membership:
    """Return the membership policy: the default record when the spec says nothing of it (no module to import)."""
    spec = s.spec
    if spec.spare_hosts is None and spec.min_hosts is None and spec.health_check is None \
            and spec.health_check_timeout is None:
        return p.NO_MEMBERSHIP
    from poprun.planner.membership import membership

    return membership(s, topology, traits, backend)


def _network(s: Solver, instances: tuple[p.Instance, ...], traits: Traits,
             ) -> tuple[tuple[p.Instance, ...], p.Network]:
    """Return the instances with their variables and the interface collectives use on each host (poprun.planner.network)."""
    hosts = {i.host for i in instances}
    if len(hosts) < 2:  # noqa: PLR2004 - one host: nothing to decide (no module to import)
        return instances, p.Network(reason="one host: the collectives stay on it")
    from poprun.planner.network import network

    net, told = network(s, instances, traits=traits, offline=is_on(s.spec.offline_mode))
    return tuple(p.with_set(i, told[i.index]) if i.index in told else i for i in instances), net


def _observe(s: Solver) -> p.Observe:
    """Return the notifier and the metrics file: the default record when the spec names neither (no module to import)."""
    spec = s.spec
    if spec.notify is None and spec.notify_on is None and spec.notify_timeout is None and spec.metrics_file is None:
        return p.NO_OBSERVE
    from poprun.planner.observe import observe

    return observe(s)


def _mask(s: Solver) -> tuple[str, ...]:
    """Return the variables named by --mask (sorted, once each): their values are masked in every text output."""
    given = s.spec.mask
    if given is None:
        return ()
    names = tuple(sorted(set(given.value)))
    s.decide("mask", ",".join(names), given.origin, "their values are masked in explain, diff and logs")
    return names


# -- topology ------------------------------------------------------------------------------
def _hosts(s: Solver) -> tuple[tuple[str, ...], bool]:
    """
    Return the hosts and whether they were given (by the user, or by the Slurm allocation poprun runs in).

    Diagnostics: PR208, PR215, PR103/PR113 (host file), PR217 (a host outside the allocation).
    """
    spec = s.spec
    if spec.hosts is not None and spec.host_file is not None:
        s.fail("PR208", "hosts given twice", detail="both a host list and a host file are given",
               span=spec.host_file.origin, hint="give either --host or --host-file, not both")
    if spec.hosts is not None:
        if not spec.hosts.value:
            s.fail("PR215", "empty host list", detail="the host list names no host", span=spec.hosts.origin,
                   hint="name at least one host, e.g. --host pod1,pod2")
            return ("localhost",), False
        _check_allocation(s, spec.hosts.value, spec.hosts.origin)
        return s.decide("hosts", spec.hosts.value, spec.hosts.origin, "as given"), True
    if spec.host_file is not None:
        hosts = _read_host_file(s, spec.host_file)
        if hosts:
            _check_allocation(s, hosts, spec.host_file.origin)
            return s.decide("hosts", hosts, spec.host_file.origin, f"read from {spec.host_file.value}"), True
        return ("localhost",), False
    allocation = _allocation(s)
    if allocation is not None:
        return s.decide("hosts", allocation.nodes, SourceSpan.env("SLURM_JOB_NODELIST"),
                        f"not given: the nodes of {allocation.describe()}"), True
    s.decide("hosts", ("localhost",), SourceSpan.default("hosts"), "no hosts given: every instance runs on this host")
    return ("localhost",), False


def _allocation(s: Solver) -> Allocation | None:
    """Return the Slurm allocation poprun runs in, or None (nothing of Slurm is imported outside one)."""
    if not s.ctx.environ.get("SLURM_JOB_ID"):  # poprun.planner.slurm.JOB_ID
        return None
    from poprun.planner.slurm import from_environ

    return from_environ(s.ctx.environ)


def _check_allocation(s: Solver, hosts: tuple[str, ...], origin: SourceSpan) -> None:
    """PR217 for hosts outside the allocation, when Slurm (or mpirun through Slurm) would start the instances."""
    allocation = _allocation(s)
    given = s.spec.backend.value if s.spec.backend is not None else None
    if allocation is None or (given is not None and not policy.traits_for(s, given).follows_allocation()):
        return
    outside = [h for h in hosts if h not in allocation.nodes]
    if outside:
        shown = ", ".join(outside[:3]) + (", ..." if len(outside) > 3 else "")  # noqa: PLR2004 - three are enough
        s.fail("PR217", "host outside the Slurm allocation",
               detail=f"{shown} {'is' if len(outside) == 1 else 'are'} not among the nodes of "
                      f"{allocation.describe()}", span=origin,
               hint=f"leave --host out to use every node of the allocation, name nodes of {allocation.nodelist}, "
                    "or run poprun outside the allocation (--backend ssh reaches other hosts)")


def _allocation_tasks(s: Solver, hosts_given: bool) -> int | None:
    """Return the instances of the allocation's tasks, when the hosts are its nodes and it asked for tasks."""
    spec = s.spec
    allocation = _allocation(s) if hosts_given and spec.hosts is None and spec.host_file is None else None
    if allocation is None or allocation.num_tasks is None:
        return None
    return s.decide("num_instances", allocation.num_tasks, SourceSpan.env("SLURM_NTASKS"),
                    f"not given: one instance per task of {allocation.describe()}")


def _check_text(s: Solver) -> None:
    """
    PR105 for a NUL character in any value of the spec (a TOML or DSL escape can write one), and for an empty working directory.

    No program, name or value can hold a NUL, so a value with one would be cut short where it is
    used; an empty ``cwd`` would fail only when the launch starts.
    """
    from poprun.core.record import fields

    for f in fields(type(s.spec)):
        given = getattr(s.spec, f.name)
        for sourced in given if isinstance(given, tuple) else (given,):
            if isinstance(sourced, Sourced) and _has_nul(sourced.value):
                s.fail("PR105", "invalid value", detail=f"the value of {f.name} holds a NUL character",
                       span=sourced.origin, hint="remove the NUL character (a \\u0000 escape writes one)")
    program = s.spec.program
    if program is not None and program.value and not program.value[0]:
        s.fail("PR105", "invalid value", detail="the program's name is empty", span=program.origin,
               hint="name the program to run first, e.g. python3")
    if s.spec.working_dir is not None and not s.spec.working_dir.value:
        s.fail("PR105", "invalid value", detail="the working directory is empty", span=s.spec.working_dir.origin,
               hint="name a directory, or leave cwd out to run in the directory poprun runs in")


def _has_nul(value: object) -> bool:
    """Return whether ``value`` (a string, a tuple of values, or a record of them) holds a NUL character."""
    from poprun.core.record import fields

    if isinstance(value, str):
        return "\0" in value
    if isinstance(value, tuple):
        return any(_has_nul(v) for v in value)
    if hasattr(type(value), "__record_fields__"):
        return any(_has_nul(getattr(value, f.name)) for f in fields(type(value)))
    return False


def _read_host_file(s: Solver, given: Sourced[str]) -> tuple[str, ...]:
    """Return the hosts of a host file: one host or host range per line; blank lines and # comments skipped."""
    from poprun.core.hostlist import HostlistError, expand
    from poprun.core.purepath import pure
    from poprun.core.textfile import read_text_file

    path = pure(s.ctx.cwd, given.value)
    try:
        text = read_text_file(path, key="--host-file", span=given.origin, name=given.value)
    except DiagnosticError as exc:  # missing, not a regular file, too large, not text
        s.diags.extend(exc.diagnostics)
        return ()
    hosts: list[str] = []
    for number, line in enumerate(text.split("\n"), start=1):
        entry = line.split("#", 1)[0].strip()
        if not entry:
            continue
        try:
            hosts.extend(h for h in expand(entry) if h not in hosts)
        except HostlistError as exc:
            column = line.index(entry) + exc.position + 1
            s.diags.add(error("PR103", exc.message, detail=f"in host file '{given.value}'", hint=exc.hint,
                              span=SourceSpan(file=str(path), key_path=f"line {number}", line=number, column=column,
                                              end_line=number, end_column=column + exc.length),
                              source_line=line))
    if not hosts and not s.diags.has_errors:
        s.fail("PR215", "empty host list", detail=f"the host file '{given.value}' names no host", span=given.origin,
               hint="write one host (or host range such as pod[1-4]) per line")
    return tuple(hosts)


def _target(s: Solver) -> Target | None:
    given = s.spec.offline_target
    if given is None:
        return None
    target = TARGETS.get(given.value.lower())
    if target is None:
        s.fail("PR206", f"unknown offline target '{given.value}'", detail=f"'{given.value}' is not a known target",
               span=given.origin, hint=suggestion_hint(given.value.lower(), TARGETS, noun="target"))
        return None
    if not is_on(s.spec.offline_mode):
        s.warn("PR207", "offline target without offline mode", detail=f"--offline-target={target.name} is meant "
               "for compiling without IPUs", span=given.origin, hint="add --offline-mode=yes, or drop the target")
    return target


def _topology(s: Solver, target: Target | None) -> p.Topology | None:
    spec = s.spec
    hosts, hosts_given = _hosts(s)
    replicas = s.pick("num_replicas", spec.replicas, 1, "default: one replica")
    ipus = s.pick("ipus_per_replica", spec.ipus_per_replica, 1, "default: one IPU per replica")
    if spec.instances is not None:
        instances = s.decide("num_instances", spec.instances.value, spec.instances.origin, "as given")
    elif (tasks := _allocation_tasks(s, hosts_given)) is not None:
        instances = tasks
    elif hosts_given:
        instances = s.decide("num_instances", len(hosts), SourceSpan.derived("num_instances"),
                             "not given: one instance per host")
    else:
        instances = s.decide("num_instances", 1, SourceSpan.default("num_instances"), "default: one instance")
    ild_size = target.ild_size if target else DEFAULT_ILD_SIZE
    values = {"replicas": replicas, "ipus_per_replica": ipus, "instances": instances, "hosts": len(hosts),
              "ild_size": ild_size, "target_ipus": target.num_ipus if target else 0, "ilds": 1}
    if not _within_limits(s, values):
        return None
    values["ilds"] = _ilds(s, values, target)
    if not _check(s, values):
        return None
    _one_and_one(s, replicas, instances)
    return p.Topology(num_replicas=replicas, num_instances=instances, num_ilds=values["ilds"],
                      ipus_per_replica=ipus, hosts=hosts, num_ipus=replicas * ipus,
                      replicas_per_instance=replicas // instances, instances_per_host=instances // len(hosts),
                      instances_per_ild=instances // values["ilds"])


def _within_limits(s: Solver, values: dict[str, int]) -> bool:
    """PR216 for numbers no Pod system reaches: they would only make planning slow."""
    fine = True
    for name, limit in constraint.LIMITS.items():
        given = getattr(s.spec, name, None)
        if given is not None and given.value > limit:
            fine = False
            s.fail("PR216", "number too large", detail=f"{given.value} {constraint.NOUNS[name]} is more than "
                   f"poprun plans for (at most {limit})", span=given.origin, hint=f"use at most {limit}")
    return fine and values["instances"] <= constraint.LIMITS["instances"]


def _least_ilds(values: Mapping[str, int]) -> tuple[int, int]:
    """Return the fewest ILDs that hold the IPUs and divide the instances, and the fewest that hold them."""
    least = max(-(-values["replicas"] * values["ipus_per_replica"] // values["ild_size"]), 1)
    instances = values["instances"]
    small = [d for d in range(1, math.isqrt(instances) + 1) if instances % d == 0]
    fits = sorted(d for d in {*small, *(instances // d for d in small)} if d >= least)
    return (fits[0] if fits else least), least


def _ilds(s: Solver, values: dict[str, int], target: Target | None) -> int:
    if s.spec.ilds is not None:
        return s.decide("num_ilds", s.spec.ilds.value, s.spec.ilds.origin, "as given")
    ipus = values["replicas"] * values["ipus_per_replica"]
    ilds, least = _least_ilds(values)
    where = f"an ILD of {target.name} has {target.ild_size} IPUs" if target else \
        f"an ILD of a Pod64 has {DEFAULT_ILD_SIZE} IPUs; the V-IPU partition decides at apply time"
    return s.decide("num_ilds", ilds, SourceSpan.derived("num_ilds"),
                    f"not given: {ipus} IPUs need at least {least} ILD{'s' if least > 1 else ''} ({where})")


def _check(s: Solver, values: dict[str, int]) -> bool:
    broken = constraint.violated(values)
    if s.spec.ilds is None and any("ilds" not in rule.binds for rule in broken):
        # The ILDs were derived from the other numbers: fix those first.
        broken = tuple(rule for rule in broken if "ilds" not in rule.binds)
    for rule in constraint.CONSTRAINTS:
        if rule.applies(values) and rule not in broken:
            s.decisions.append(p.Decision(key=f"rule {rule.name}", value="holds", source="derived",
                                          reason=rule.explain(values)))
    for rule in broken:
        free = tuple(n for n in rule.binds if n == "hosts" or getattr(s.spec, n, None) is not None
                     or n in ("instances", "ilds"))
        spans = [s.origin(n) for n in rule.binds if s.origin(n).file != "<default>"]
        span = spans[-1] if spans else s.origin(rule.binds[0])
        s.fail(rule.code, rule.summary, detail=rule.detail(values), span=span,
               hint=_alternatives_hint(values, rule, free, derived_ilds=s.spec.ilds is None))
    return not broken


def _rederive_ilds(values: dict[str, int]) -> dict[str, int]:
    return {**values, "ilds": _least_ilds(values)[0]}


def _alternatives_hint(values: dict[str, int], rule: constraint.Constraint, free: tuple[str, ...], *,
                       derived_ilds: bool) -> str:
    found = constraint.alternatives(values, rule, free=free, adjust=_rederive_ilds if derived_ilds else dict)
    parts = [f"{join_or(found[n])} {constraint.NOUNS[n]}" for n in rule.binds if n in found]
    if not parts:
        return "change the numbers so that each divides evenly"
    return "use " + ", or ".join(parts)


def _one_and_one(s: Solver, replicas: int, instances: int) -> None:
    given = s.spec.replicas or s.spec.instances
    if replicas == 1 and instances == 1 and given is not None:
        s.warn("PR304", "one instance with one replica", detail="--num-instances=1 with --num-replicas=1 is "
               "not supported by PopRun and may add overhead", span=given.origin,
               hint="run the program without poprun, or use more replicas")

