"""Placement laws over generated host topologies (seed section 2.5, changelog 2.1)."""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from poprun.planner.machine import HostTopology, NumaNode
from poprun.planner.placement import CORE_STRATEGIES, PlacementError, place


@st.composite
def topologies(draw: st.DrawFn) -> HostTopology:
    """Return a host: 1-2 sockets of 1-4 NUMA nodes of 1-6 cores of 1-2 threads, and maybe a narrower cpuset."""
    sockets, nodes_per, cores_per, threads = (draw(st.integers(1, 2)), draw(st.integers(1, 4)), draw(st.integers(1, 6)),
                                              draw(st.integers(1, 2)))
    total = sockets * nodes_per * cores_per
    nodes = tuple(NumaNode(n, n // nodes_per, tuple(tuple(c + t * total for t in range(threads))
                                                   for c in range(n * cores_per, (n + 1) * cores_per)))
                  for n in range(sockets * nodes_per))
    every = sorted(c for n in nodes for c in n.cpus)
    cpuset = draw(st.none() | st.lists(st.sampled_from(every), min_size=1, unique=True).map(lambda c: tuple(sorted(c))))
    return HostTopology(name="generated", numa_nodes=nodes, cpuset=cpuset)


@settings(max_examples=300, deadline=None)
@given(topology=topologies(), count=st.integers(1, 24), strategy=st.sampled_from(CORE_STRATEGIES))
def test_core_strategies_never_give_one_core_two_instances(topology: HostTopology, count: int, strategy: str) -> None:
    """close, scatternuma, scattersocket: every instance has its own core, or the placement is refused."""
    cores = sum(len(n.cores) for n in topology.usable())
    try:
        bindings = place(topology, count, strategy)
    except PlacementError:
        assert count > cores
        return
    cpus = [set(b.cpus) for b in bindings]
    assert all(a.isdisjoint(b) for i, a in enumerate(cpus) for b in cpus[i + 1:])
    assert all(len(b.numa_nodes) == 1 for b in bindings)


@settings(max_examples=300, deadline=None)
@given(topology=topologies(), count=st.integers(1, 24))
def test_spreadnuma_divides_numa_nodes_evenly(topology: HostTopology, count: int) -> None:
    """Fewer instances than nodes: node counts differ by at most one, none shared; more: node loads differ by one."""
    usable = topology.usable()
    bindings = place(topology, count, "spreadnuma")
    if count <= len(usable):
        sizes = [len(b.numa_nodes) for b in bindings]
        assert max(sizes) - min(sizes) <= 1
        assert sorted(n for b in bindings for n in b.numa_nodes) == [n.index for n in usable]
    else:
        loads = [sum(n.index in b.numa_nodes for b in bindings) for n in usable]
        assert max(loads) - min(loads) <= 1


@settings(max_examples=300, deadline=None)
@given(topology=topologies(), count=st.integers(1, 24),
       strategy=st.sampled_from(("spreadnuma", *CORE_STRATEGIES)))
def test_the_cpuset_is_never_left(topology: HostTopology, count: int, strategy: str) -> None:
    """Every CPU of every binding is one the cpuset allows, on a node whose CPUs it is."""
    assume(strategy == "spreadnuma" or count <= sum(len(n.cores) for n in topology.usable()))
    allowed = set(topology.cpuset) if topology.cpuset is not None else {c for n in topology.numa_nodes for c in n.cpus}
    for binding in place(topology, count, strategy):
        node_cpus = {c for n in topology.numa_nodes if n.index in binding.numa_nodes for c in n.cpus}
        assert binding.cpus
        assert set(binding.cpus) <= allowed & node_cpus
