"""
The solver's placement step: each instance's NUMA nodes and cores, host by host, explained.

Layer: ``poprun.planner``; imports the solver state, the plan model, :mod:`machine`,
:mod:`placement` and the settings table (:mod:`setting`: ``POPRUN_HOST_TOPOLOGY`` is read through it).

Binding happens when NUMA awareness is on (``--numa-aware``, or by itself with more than one
instance per host, changelog 2.1) and the strategy is not ``disabled``. A host's topology comes
from ``POPRUN_HOST_TOPOLOGY`` (a JSON file or a recorded name: every host is taken to look like
it, for plans made for other machines), else, for this machine, from its sysfs and this
process's cpuset (:func:`poprun.planner.machine.discover`). Other hosts' topologies are read
through ssh when placement needs them (the context's ``remote_probe``, a few seconds at most);
an instance on a host whose topology is still not known is not bound, and its placement says why.

Diagnostics: PR306 (a core strategy with more instances than usable cores on a host), PR307
(``POPRUN_HOST_TOPOLOGY`` unreadable), PR308 (warning: a core strategy binds each instance to
one core, seed section 2.5).
"""

from __future__ import annotations

from poprun.core.record import evolve
from poprun.core.span import SourceSpan
from poprun.planner import plan as p
from poprun.planner.machine import RECORDED, HostTopology, cpulist, load
from poprun.planner.placement import CORE_STRATEGIES, PlacementError, place
from poprun.planner.setting import setting_value
from poprun.planner.state import Solver

TOPOLOGY_VARIABLE = "POPRUN_HOST_TOPOLOGY"


def bind(s: Solver, instances: tuple[p.Instance, ...], placement: p.Placement) -> tuple[p.Instance, ...]:
    """Return ``instances`` with their bindings (or the reason they have none); record the decisions."""
    if not placement.numa_aware or placement.strategy == "disabled":
        why = "process placement disabled" if placement.strategy == "disabled" else "NUMA awareness is off"
        return tuple(evolve(i, placement=evolve(i.placement, reason=why)) for i in instances)
    if placement.strategy in CORE_STRATEGIES:
        _warn_one_core(s, placement.strategy)
    topologies = _topologies(s, list(dict.fromkeys(i.host for i in instances)))
    bound: dict[int, p.Placement] = {}
    for host, topology in topologies.items():
        mine = [i for i in instances if i.host == host]
        if not isinstance(topology, HostTopology):
            why = (f"the topology of {host} could not be read ({topology}; {TOPOLOGY_VARIABLE}=FILE|NAME gives it)"
                   if topology else f"the topology of {host} is read when launching, not when planning "
                   f"({TOPOLOGY_VARIABLE}=FILE|NAME gives it here)")
            bound.update((i.index, evolve(i.placement, reason=why)) for i in mine)
            s.decide(f"placement {host}", "not bound", SourceSpan.derived("placement"), why)
            continue
        try:
            bindings = place(topology, len(mine), placement.strategy)
        except PlacementError as exc:
            s.fail("PR306", "not enough cores for the placement", detail=str(exc), span=s.origin("process_placement"),
                   hint="use --process-placement spreadnuma (no core binding), fewer instances per host, or more hosts")
            return instances
        for instance, b in zip(mine, bindings, strict=True):
            bound[instance.index] = evolve(instance.placement, numa_nodes=cpulist(b.numa_nodes), cpus=cpulist(b.cpus),
                                           reason=f"{placement.strategy} on {topology.name}")
        s.decide(f"placement {host}", f"{placement.strategy} on {topology.name}", SourceSpan.derived("placement"),
                 f"{len(mine)} instance{'s' if len(mine) > 1 else ''} over {len(topology.usable())} usable NUMA "
                 f"node{'s' if len(topology.usable()) > 1 else ''} (see placement)")
    return tuple(evolve(i, placement=bound.get(i.index, i.placement)) for i in instances)


def _topologies(s: Solver, hosts: list[str]) -> dict[str, HostTopology | str | None]:
    """Return each host's topology: POPRUN_HOST_TOPOLOGY's, this machine's, one read through ssh, or why not (each read once a solve)."""
    missing = [h for h in hosts if h not in s.topologies]
    if missing:
        s.topologies.update(_read_topologies(s, missing))
    return {h: s.topologies[h] for h in hosts}


host_topologies = _topologies


def _read_topologies(s: Solver, hosts: list[str]) -> dict[str, HostTopology | str | None]:
    """Return each host's topology: POPRUN_HOST_TOPOLOGY's, this machine's, one read through ssh, or why not."""
    given = setting_value(TOPOLOGY_VARIABLE, s.ctx.environ)
    if given:
        try:
            every = load(given)
        except ValueError as exc:
            s.fail("PR307", "cannot read the host topology", detail=str(exc), span=SourceSpan.env(TOPOLOGY_VARIABLE),
                   hint="give a JSON file ('python3 -m poprun.planner.machine' on a host writes its own) or a "
                        f"recorded name ({', '.join(RECORDED)})")
            return dict.fromkeys(hosts)
        return dict.fromkeys(hosts, every)
    local = None
    found: dict[str, HostTopology | str | None] = {}
    for host in hosts:
        if host in s.ctx.local_names and s.ctx.probe is not None:
            local = local or s.ctx.probe()
            found[host] = local
        else:
            found[host] = None
    remote = tuple(h for h, t in found.items() if t is None)
    if remote and s.ctx.remote_probe is not None:
        found.update(s.ctx.remote_probe(remote))
    return found


def _warn_one_core(s: Solver, strategy: str) -> None:
    s.warn("PR308", "instances bound to one core", span=s.origin("process_placement"),
           detail=f"--process-placement {strategy} binds each instance to a single core",
           hint="a program that spawns threads or processes has them all compete for that core (seed 2.5); "
                "use spreadnuma for such programs")


# -- CPU threads -----------------------------------------------------------------------------
OMP_NUM_THREADS = "OMP_NUM_THREADS"
MKL_DYNAMIC = "MKL_DYNAMIC"
_WHY_SET = ("; without it torch's oneMKL reads OMPI_COMM_WORLD_LOCAL_SIZE, which poprun sets, and drops to one "
            "thread")


def threads(s: Solver, instances: tuple[p.Instance, ...], *, all_here: bool) -> tuple[p.Instance, ...]:
    """
    Return ``instances`` with the CPU threads each may use (``OMP_NUM_THREADS``), decided and explained host by host.

    An instance gets its fair share of the CPUs it may use: its placement's CPU set, else every
    CPU its host lets a process use, each CPU shared evenly among the instances that may use it
    (4 for two instances on the same 8 CPUs, 8 for an instance alone on them). A host whose CPUs
    are not known when planning (read only when placement needs them): ``MKL_DYNAMIC=FALSE`` for
    an instance alone there (torch then uses every CPU it may, as under torchrun), else
    ``OMP_NUM_THREADS=1`` (torchrun's choice for several processes on a node). The user's
    ``-x OMP_NUM_THREADS`` (or one in the launching shell, then forwarded) is kept. ``all_here``:
    every instance runs on this machine, whatever its host (the offline and local backends).
    """
    if s.ctx.environ.get(OMP_NUM_THREADS) is not None:
        s.decide(OMP_NUM_THREADS, "forwarded", SourceSpan.env(OMP_NUM_THREADS),
                 "set in the launching shell: every instance gets that value")
        return tuple(i if _user_sets(i, OMP_NUM_THREADS) else evolve(i, env=evolve(
            i.env, forward=(*i.env.forward, OMP_NUM_THREADS))) for i in instances)
    hosts: dict[str, list[p.Instance]] = {}
    for i in instances:
        hosts.setdefault("localhost" if all_here else i.host, []).append(i)
    found: dict[int, p.Instance] = {}
    decided: dict[_Decision, list[str]] = {}  # hosts decided alike share one line of explain (64 hosts: one)
    for host, mine in hosts.items():
        placed, decision = _host_threads(s, host, mine)
        found.update((i.index, i) for i in placed)
        if decision is not None:
            decided.setdefault(decision, []).append(host)
    for (value, origin, reason), names in decided.items():
        s.decide(f"threads {_hosts(names)}", value, origin, reason)
    return tuple(found[i.index] for i in instances)


def _hosts(names: list[str]) -> str:
    """Return ``names`` as explain shows them: one name, or a host list (imported only then: start-up)."""
    if len(names) == 1:
        return names[0]
    from poprun.core.hostlist import compress

    return compress(names)


_Decision = tuple[str, SourceSpan, str]  # what a host's instances got, where it came from, and why


def _origin(s: Solver, name: str) -> SourceSpan:
    """Return where a ``-x`` names ``name`` (for every instance, else for one)."""
    given = [(e.value.name, e.origin) for e in s.spec.env]
    given += [(v.name, a.origin) for a in s.spec.instance_args for v in a.value.env]
    return next((origin for key, origin in given if key == name), SourceSpan.derived(name))


def _user_sets(instance: p.Instance, name: str) -> bool:
    """Return whether ``-x`` sets or forwards ``name`` for ``instance``."""
    return name in instance.env.forward or instance.env.get(name) is not None


def _host_threads(s: Solver, host: str, mine: list[p.Instance]) -> tuple[list[p.Instance], _Decision | None]:
    """Return the instances of ``host`` with their threads (see :func:`threads`), and the decision to explain."""
    free = [i for i in mine if not _user_sets(i, OMP_NUM_THREADS)]
    if not free:
        return mine, ("yours", _origin(s, OMP_NUM_THREADS), "OMP_NUM_THREADS is set with -x")
    sets = {i.index: _cpus(i) for i in mine}
    if any(not cpus for cpus in sets.values()):
        topology = _known_topology(s, host)
        if topology is None:
            return _unknown_host(mine, free)
        every = tuple(c for node in topology.usable() for core in node.cores for c in core)
        sets = {index: cpus or every for index, cpus in sets.items()}
    users: dict[int, int] = {}
    for cpus in sets.values():
        for cpu in cpus:
            users[cpu] = users.get(cpu, 0) + 1
    counts = {i.index: max(int(sum(1 / users[c] for c in sets[i.index]) + 1e-9), 1) for i in free}
    shown = sorted(set(counts.values()))
    every_cpu = cpulist(sorted(users))
    share = (f"the only instance on its host, on CPUs {every_cpu}" if len(mine) == 1 else
             f"{len(mine)} instances on CPUs {every_cpu} of their host, each CPU shared evenly by those that may use it")
    placed = [evolve(i, env=_with(i.env, OMP_NUM_THREADS, str(counts[i.index]))) if i.index in counts else i
              for i in mine]
    return placed, (",".join(map(str, shown)), SourceSpan.derived("threads"), f"{OMP_NUM_THREADS}: {share}{_WHY_SET}")


def _unknown_host(mine: list[p.Instance], free: list[p.Instance]) -> tuple[list[p.Instance], _Decision | None]:
    """Return the instances of a host whose CPUs are not known, with their threads (see :func:`threads`)."""
    where = f"the host's CPUs are not known when planning ({TOPOLOGY_VARIABLE}=FILE|NAME gives them)"
    if len(mine) > 1:
        return ([evolve(i, env=_with(i.env, OMP_NUM_THREADS, "1")) if i in free else i for i in mine],
                ("1", SourceSpan.derived("threads"), (f"{OMP_NUM_THREADS}=1: {len(mine)} instances share a host and "
                 f"{where}; torchrun's choice for several processes on one host")))
    if _user_sets(mine[0], MKL_DYNAMIC):
        return mine, None
    return ([evolve(mine[0], env=_with(mine[0].env, MKL_DYNAMIC, "FALSE"))],
            ("every CPU", SourceSpan.derived("threads"), (f"{MKL_DYNAMIC}=FALSE: {where}; the instance alone there uses "
             "every CPU it may (as under torchrun), not the one thread oneMKL chooses because "
             "OMPI_COMM_WORLD_LOCAL_SIZE is set")))


def _cpus(instance: p.Instance) -> tuple[int, ...]:
    from poprun.planner.machine import parse_cpulist

    return parse_cpulist(instance.placement.cpus) if instance.placement.cpus else ()


def _known_topology(s: Solver, host: str) -> HostTopology | None:
    """Return ``host``'s topology when known without asking it: POPRUN_HOST_TOPOLOGY's, or this machine's."""
    given = setting_value(TOPOLOGY_VARIABLE, s.ctx.environ)
    if given:
        try:
            return load(given)
        except ValueError:  # PR307, said once by bind
            return None
    if (host == "localhost" or host in s.ctx.local_names) and s.ctx.probe is not None:
        return s.ctx.probe()
    return None


def _with(env: p.Environment, name: str, value: str) -> p.Environment:
    return evolve(env, set=tuple(sorted((*env.set, (name, value)))))
