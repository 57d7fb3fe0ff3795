"""
The solver's placement step: each instance's NUMA nodes and cores, host by host, explained.

Layer: ``poprun.planner``; imports the solver state, the plan model, :mod:`machine` and
:mod:`placement`.

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
from poprun.planner.machine import HostTopology, cpulist, load
from poprun.planner.placement import CORE_STRATEGIES, PlacementError, place
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
    """Return each host's topology: POPRUN_HOST_TOPOLOGY's, this machine's, one read through ssh, or why not."""
    given = s.ctx.environ.get(TOPOLOGY_VARIABLE)
    if given:
        try:
            every = load(given)
        except ValueError as exc:
            s.fail("PR307", "cannot read the host topology", detail=str(exc), span=SourceSpan.env(TOPOLOGY_VARIABLE),
                   hint="give a JSON file ('python3 -m poprun.planner.machine' on a host writes its own) or a "
                        "recorded name (dell-r6525-2x-epyc-7742, xeon-2s-2numa, workstation-1numa)")
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
