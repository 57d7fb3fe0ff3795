"""
Process placement: which NUMA nodes and cores each instance of a host is bound to.

Layer: ``poprun.planner``; imports :mod:`poprun.planner.machine`. Pure: a host's topology, its
number of instances and the strategy in, one :class:`Binding` per instance out.

The strategies of the PopRun guide (section 2.5):

- ``spreadnuma`` (the default): the host's usable NUMA nodes are divided among its instances,
  in order; each instance is bound to the CPUs and memory of its nodes, not to a core. With more
  instances than nodes, consecutive instances share a node, each node serving as many (give or
  take one).
- ``scatternuma`` / ``scattersocket``: each instance is bound to one core, the cores scattered
  as far apart as possible: instance *i* takes the next free core of NUMA node (socket) *i*
  modulo their number (within a socket, its NUMA nodes take turns).
- ``close``: each instance is bound to one core, on consecutive cores.
- ``disabled``: no binding (the user's ``--map-by`` / ``--bind-to`` stand).

Only what the host's cpuset allows is used (changelog 2.1): :meth:`HostTopology.usable`. A core
strategy needs a core per instance: :class:`PlacementError` otherwise.
"""

from __future__ import annotations

from poprun.core.record import positional_record
from poprun.planner.machine import HostTopology, NumaNode

STRATEGIES = ("spreadnuma", "scattersocket", "scatternuma", "close", "disabled")
CORE_STRATEGIES = ("scattersocket", "scatternuma", "close")


@positional_record
class Binding:
    """One instance's NUMA nodes and logical CPUs (empty: not bound)."""

    numa_nodes: tuple[int, ...]
    cpus: tuple[int, ...]


class PlacementError(ValueError):
    """The host cannot hold its instances with the strategy (more instances than usable cores)."""


def place(topology: HostTopology, count: int, strategy: str) -> tuple[Binding, ...]:
    """Return the binding of each of ``count`` instances of a host with ``topology``, by ``strategy``."""
    if strategy == "disabled" or count == 0:
        return tuple(Binding((), ()) for _ in range(count))
    nodes = topology.usable()
    if not nodes:
        msg = f"{topology.name} has no NUMA node this process may use"
        raise PlacementError(msg)
    if strategy == "spreadnuma":
        return _spread(nodes, count)
    order = {"close": _close, "scatternuma": _scatter_numa, "scattersocket": _scatter_socket}[strategy](nodes)
    if count > len(order):
        msg = (f"{count} instances need {count} cores with --process-placement {strategy}; "
               f"{topology.name} has {len(order)} usable")
        raise PlacementError(msg)
    return tuple(Binding((node,), core) for node, core in order[:count])


def _spread(nodes: tuple[NumaNode, ...], count: int) -> tuple[Binding, ...]:
    """Divide the nodes among ``count`` instances in order: blocks of nodes, or blocks of instances per node."""
    bindings = []
    for i in range(count):
        if count <= len(nodes):
            mine = nodes[i * len(nodes) // count:(i + 1) * len(nodes) // count]
        else:
            mine = (nodes[i * len(nodes) // count],)
        bindings.append(Binding(tuple(n.index for n in mine), tuple(sorted(c for n in mine for c in n.cpus))))
    return tuple(bindings)


def _close(nodes: tuple[NumaNode, ...]) -> list[tuple[int, tuple[int, ...]]]:
    """Return every usable core in order (node by node), each with its node."""
    return [(node.index, core) for node in nodes for core in node.cores]


def _interleave(groups: list[list[tuple[int, tuple[int, ...]]]]) -> list[tuple[int, tuple[int, ...]]]:
    """Return the items of ``groups`` taking one of each in turn (round robin), until all are taken."""
    order: list[tuple[int, tuple[int, ...]]] = []
    for depth in range(max((len(g) for g in groups), default=0)):
        order.extend(g[depth] for g in groups if depth < len(g))
    return order


def _scatter_numa(nodes: tuple[NumaNode, ...]) -> list[tuple[int, tuple[int, ...]]]:
    """Return the cores with the NUMA nodes taking turns."""
    return _interleave([[(node.index, core) for core in node.cores] for node in nodes])


def _scatter_socket(nodes: tuple[NumaNode, ...]) -> list[tuple[int, tuple[int, ...]]]:
    """Return the cores with the sockets taking turns, and within a socket its NUMA nodes."""
    sockets = sorted({node.socket for node in nodes})
    return _interleave([_scatter_numa(tuple(n for n in nodes if n.socket == s)) for s in sockets])
