"""
The plan's topology as a Graphviz graph, in DOT text: ``poprun render`` and ``plan --format dot``.

Layer: ``poprun.render``; imports ``poprun.core`` and the plan model, never graphviz: DOT is
written here, quoted by :func:`quote`, and turned into SVG or PNG by the CLI.

The graph nests what a launch is made of: the partition (a note, with its actions) points at
each IPU-Link domain (ILD); an ILD holds the hosts whose instances use its IPUs (a host split
across two ILDs appears in both); a host holds its instances, each labelled with its local
index, its GCD, its replicas and their IPUs. Same plan, same bytes.

Large plans are grouped so that they stay readable (:data:`GROUP_ABOVE`): consecutive ILDs
that look alike become one cluster (``ILDs 0-15 x 4 hosts each``), consecutive hosts alike
within them one cluster (``pod[1-64] x 4 instances each``) with one node that sums up their
instances. ``expand=True`` draws everything: every ILD, host and instance, and each replica
as its own node with its IPUs.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence

from poprun.core.hostlist import compress
from poprun.core.record import positional_record
from poprun.planner.plan import NO_DEVICES, Devices, Instance, LaunchPlan

GROUP_ABOVE = 32  # a plan with more instances than this is grouped unless expanded
_GRAPH = ('graph [rankdir=LR, fontname="Helvetica", fontsize=12, labelloc=t, compound=true, nodesep=0.25, '
          'ranksep=0.35, style="rounded,filled", color="#5b6b7f", penwidth=1.2];')
_NODE = 'node [shape=box, style="rounded,filled", fillcolor="#ffffff", fontname="Helvetica", fontsize=10];'
_EDGE = 'edge [color="#5b6b7f", arrowsize=0.7];'
_ILD_FILL = "#e8eef7"
_HOST_FILL = "#f7f9fc"
_INSTANCE_FILL = "#fdf3e1"
_DEVICE_FILL = "#e9f5e4"


@positional_record
class Drawing:
    """How a graph is drawn: grouped (large plans), expanded (every replica), and the IPUs of a replica."""

    grouped: bool
    expand: bool
    ipus_per_replica: int
    devices: Devices = NO_DEVICES

    def ipus(self, replicas: Sequence[int]) -> str:
        """Return the IPUs of ``replicas`` (replica r has IPUs [r*k, (r+1)*k)), e.g. 'IPUs 0-7'."""
        k = self.ipus_per_replica
        numbers = [ipu for r in replicas for ipu in range(r * k, (r + 1) * k)]
        return f"{'IPU' if len(numbers) == 1 else 'IPUs'} {ranges(numbers)}"


@positional_record
class Cell:
    """The instances of one host that use one ILD, in instance order (a host across two ILDs has two cells)."""

    ild: int
    host: str
    instances: tuple[Instance, ...]

    @property
    def signature(self) -> tuple[int, ...]:
        """What two cells must share to be drawn as one group: their instances' replica counts."""
        return tuple(i.num_local_replicas for i in self.instances)


@positional_record
class Group:
    """Cells drawn as one cluster: one host's cell, or alike hosts' cells of alike ILDs."""

    ilds: tuple[int, ...]
    cells: tuple[Cell, ...]

    @property
    def hosts(self) -> tuple[str, ...]:
        """The hosts of the group, each once, in order."""
        return tuple(dict.fromkeys(c.host for c in self.cells))

    @property
    def instances(self) -> tuple[Instance, ...]:
        """The instances of the group, by index."""
        return tuple(sorted((i for c in self.cells for i in c.instances), key=lambda i: i.index))


def quote(text: str, *, left: bool = False) -> str:
    r"""
    Return ``text`` as a DOT double-quoted string: backslashes and quotes escaped, lines ``\n``.

    With ``left``, every line is left-justified (``\l``, the last one included).
    """
    escaped = text.replace("\\", "\\\\").replace('"', '\\"').replace("\r", "")
    if left:
        return '"' + escaped.replace("\n", "\\l") + '\\l"'
    return '"' + escaped.replace("\n", "\\n") + '"'


def ranges(numbers: Sequence[int]) -> str:
    """Return integers as ranges, e.g. [0, 1, 2, 5] -> '0-2,5'."""
    ordered = sorted(set(numbers))
    pieces: list[str] = []
    start = 0
    for k in range(1, len(ordered) + 1):
        if k == len(ordered) or ordered[k] != ordered[k - 1] + 1:
            first, last = ordered[start], ordered[k - 1]
            pieces.append(str(first) if first == last else f"{first}-{last}")
            start = k
    return ",".join(pieces)


def cells(plan: LaunchPlan) -> tuple[Cell, ...]:
    """Return the plan's instances cut where the host or the ILD changes, in instance order."""
    found: list[Cell] = []
    for instance in plan.instances:
        last = found[-1] if found else None
        if last is not None and (last.ild, last.host) == (instance.ild, instance.host):
            found[-1] = Cell(last.ild, last.host, (*last.instances, instance))
        else:
            found.append(Cell(instance.ild, instance.host, (instance,)))
    return tuple(found)


def group_cells(all_cells: Sequence[Cell], *, grouped: bool) -> tuple[tuple[Group, ...], ...]:
    """
    Return the clusters to draw: per ILD (or run of alike ILDs), its host groups.

    Ungrouped, every ILD is a cluster and every cell a group of its own. Grouped,
    consecutive ILDs whose cells look alike (same signatures in the same order) share a
    cluster, and consecutive cell positions with the same signature share a group.
    """
    by_ild: list[list[Cell]] = []
    for cell in all_cells:
        if by_ild and by_ild[-1][0].ild == cell.ild:
            by_ild[-1].append(cell)
        else:
            by_ild.append([cell])
    if not grouped:
        return tuple(tuple(Group((c.ild,), (c,)) for c in ild) for ild in by_ild)
    return tuple(_merge_positions(run) for run in _runs(by_ild, key=lambda ild: [c.signature for c in ild]))


def _runs(items: Sequence[list[Cell]], *, key: Callable[[list[Cell]], object]) -> list[list[list[Cell]]]:
    """Return consecutive items with equal ``key(item)`` as runs."""
    runs: list[list[list[Cell]]] = []
    for item in items:
        if runs and key(runs[-1][0]) == key(item):
            runs[-1].append(item)
        else:
            runs.append([item])
    return runs


def _merge_positions(run: list[list[Cell]]) -> tuple[Group, ...]:
    """Return the groups of a run of alike ILDs: consecutive cell positions with equal signatures."""
    ilds = tuple(ild[0].ild for ild in run)
    groups: list[Group] = []
    previous: tuple[int, ...] | None = None
    for position in range(len(run[0])):
        column = tuple(ild[position] for ild in run)
        if groups and column[0].signature == previous:
            groups[-1] = Group(ilds, (*groups[-1].cells, *column))
        else:
            groups.append(Group(ilds, column))
        previous = column[0].signature
    return tuple(groups)


def render_dot(plan: LaunchPlan, *, expand: bool = False) -> str:
    """
    Return the plan's topology as a DOT ``digraph``: deterministic, one statement a line.

    Plans of more than :data:`GROUP_ABOVE` instances are grouped unless ``expand``; with
    ``expand`` every replica is a node too.
    """
    how = Drawing(not expand and len(plan.instances) > GROUP_ABOVE, expand, plan.topology.ipus_per_replica,
                  plan.devices)
    clusters = group_cells(cells(plan), grouped=how.grouped)
    partition = f'"partition" [shape=note, fillcolor="#fffbe6", label={quote(_partition_label(plan), left=True)}];'
    lines = ["digraph poprun {", f"  {_GRAPH}", f"  {_NODE}", f"  {_EDGE}", f"  label={quote(_title(plan))};",
             f"  {partition}"]
    for number, cluster in enumerate(clusters):
        lines.extend(_ild_cluster(number, cluster, how))
    for number, cluster in enumerate(clusters):
        target = _first_node(cluster[0], how)
        lines.append(f'  "partition" -> {quote(target)} [lhead={quote(f"cluster_ild_{number}")}];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _title(plan: LaunchPlan) -> str:
    t = plan.topology
    return (f"{_plural(t.num_replicas, 'replica')} x {_plural(t.ipus_per_replica, 'IPU')} = "
            f"{_plural(t.num_ipus, 'IPU')} over {_plural(t.num_instances, 'instance')} on "
            f"{_plural(len(t.hosts), 'host')}, {_plural(t.num_ilds, 'ILD')}")


def _partition_label(plan: LaunchPlan) -> str:
    part = plan.partition
    if part is None:
        target = f"\noffline target {plan.offline_target}" if plan.offline_target else ""
        return f"no partition (offline mode){target}"
    name = part.name or "(the only partition of the allocation)"
    lines = [f"partition {name}", f"V-IPU server {part.server_host}:{part.server_port}",
             f"{_plural(part.num_ipus, 'IPU')}, {_plural(part.num_gcds, 'GCD')}, {_plural(part.num_ilds, 'ILD')}",
             *(f"- {action}" for action in part.actions)]
    return "\n".join(lines)


def _ild_cluster(number: int, groups: tuple[Group, ...], how: Drawing) -> Iterator[str]:
    """Yield the lines of one ILD cluster (or run of alike ILDs) and the host clusters in it."""
    yield f'  subgraph {quote(f"cluster_ild_{number}")} {{'
    yield f'    label={quote(_ild_label(groups))}; fillcolor="{_ILD_FILL}";'
    for position, group in enumerate(groups):
        yield f'    subgraph {quote(f"cluster_ild_{number}_host_{position}")} {{'
        yield f'      label={quote(_host_label(group, grouped=how.grouped))}; fillcolor="{_HOST_FILL}";'
        if how.grouped:
            yield f'      {quote(_group_id(group))} [fillcolor="{_INSTANCE_FILL}", label={quote(_group_label(group, how))}];'
        else:
            yield from _instances(group.instances, how)
            if how.devices.per_instance and len(group.hosts) == 1:
                yield from _devices(f"devices_{number}_{position}", group, how)
        yield "    }"
    yield "  }"


def _devices(prefix: str, group: Group, how: Drawing) -> Iterator[str]:
    """Yield a host's devices, one node per NUMA node listing its devices, and an edge from each instance to its devices' nodes."""
    from poprun.core.secret import printable

    host = how.devices.of(group.hosts[0])
    if host is None:
        return
    owner = {d: i.index for i in group.instances for d in i.devices}
    by_node: dict[int, list[str]] = {}
    for d in host.devices:
        mine = f" (instance {owner[str(d.index)]})" if str(d.index) in owner else ""
        by_node.setdefault(d.numa_node, []).append(f"device {d.index} {d.bus_id}{mine}")
    for node, lines in sorted(by_node.items()):
        name = f"NUMA {node}" if node >= 0 else "NUMA node not known"
        label = quote("\n".join([f"{name}: {_plural(len(lines), 'device')}", *map(printable, lines)]))
        yield f'      {quote(f"{prefix}_numa_{node}")} [shape=box3d, fillcolor="{_DEVICE_FILL}", label={label}];'
    numa = {str(d.index): d.numa_node for d in host.devices}
    for instance in group.instances:
        source = f"replica_{instance.replica_offset}" if how.expand else f"instance_{instance.index}"
        for node in sorted({numa[d] for d in instance.devices if d in numa}):
            yield f"      {quote(source)} -> {quote(f'{prefix}_numa_{node}')} [style=dashed];"


def _ild_label(groups: tuple[Group, ...]) -> str:
    """Return an ILD's label, or a run's: ``ILDs 0-15 x 4 hosts each`` (``x N instances`` when hosts span ILDs)."""
    ilds = groups[0].ilds
    if len(ilds) == 1:
        return f"ILD {ilds[0]}"
    all_cells = [c for g in groups for c in g.cells]
    if len({c.host for c in all_cells}) == len(all_cells):  # no host is split between ILDs
        return f"ILDs {ranges(ilds)} x {_plural(len(all_cells) // len(ilds), 'host')} each"
    instances = sum(len(c.instances) for c in all_cells)
    return f"ILDs {ranges(ilds)} x {_plural(instances // len(ilds), 'instance')} each"


def _host_label(group: Group, *, grouped: bool) -> str:
    hosts = group.hosts
    if len(hosts) == 1:
        return f"host {hosts[0]}"
    each = len(group.instances) // len(hosts) if grouped else len(group.instances)
    return f"{compress(hosts)} x {_plural(each, 'instance')} each"


def _group_id(group: Group) -> str:
    return f"instances_{group.instances[0].index}"


def _group_label(group: Group, how: Drawing) -> str:
    """Return the label of a node that stands for a group's instances."""
    instances = group.instances
    per_instance = sorted({i.num_local_replicas for i in instances})
    each = _plural(per_instance[0], "replica") if len(per_instance) == 1 else "various"
    replicas = [r for i in instances for r in _replicas(i)]
    devices = [f"{_plural(how.devices.per_instance, 'device')} each"] if how.devices.per_instance else []
    return "\n".join([f"instances {ranges([i.index for i in instances])}",
                      f"local {ranges([i.local_index for i in instances])} on each host",
                      f"GCDs {ranges([i.gcd for i in instances])}",
                      f"replicas {ranges(replicas)} ({each} each)", how.ipus(replicas), *devices])


def _instances(instances: tuple[Instance, ...], how: Drawing) -> Iterator[str]:
    """Yield one node per instance (a cluster of replica nodes when expanded), stacked top to bottom."""
    heads: list[str] = []
    for instance in instances:
        if how.expand:
            heads.append(f"replica_{instance.replica_offset}")
            yield from _replica_cluster(instance, how)
        else:
            heads.append(f"instance_{instance.index}")
            label = quote(_instance_label(instance, how))
            yield f'      {quote(heads[-1])} [fillcolor="{_INSTANCE_FILL}", label={label}];'
    for upper, lower in itertools.pairwise(heads):
        yield f"      {quote(upper)} -> {quote(lower)} [style=invis];"


def _replicas(instance: Instance) -> range:
    return range(instance.replica_offset, instance.replica_offset + instance.num_local_replicas)


def _instance_label(instance: Instance, how: Drawing) -> str:
    replicas = _replicas(instance)
    devices = [f"devices {','.join(instance.devices)}"] if instance.devices else []
    return "\n".join([f"instance {instance.index}", f"local {instance.local_index}, GCD {instance.gcd}",
                      f"replicas {ranges(replicas)}", how.ipus(replicas), *devices])


def _replica_cluster(instance: Instance, how: Drawing) -> Iterator[str]:
    """Yield an instance as a cluster with one node per replica, side by side."""
    label = f"instance {instance.index}: local {instance.local_index}, GCD {instance.gcd}"
    yield f'      subgraph {quote(f"cluster_instance_{instance.index}")} {{'
    yield f'        label={quote(label)}; fillcolor="{_INSTANCE_FILL}";'
    for replica in _replicas(instance):
        label = quote(f"replica {replica}\n{how.ipus([replica])}")
        yield f"        {quote(f'replica_{replica}')} [label={label}];"
    yield "      }"


def _first_node(group: Group, how: Drawing) -> str:
    """Return the node an edge into the group's ILD cluster points at."""
    if how.grouped:
        return _group_id(group)
    first = group.instances[0]
    return f"replica_{first.replica_offset}" if how.expand else f"instance_{first.index}"
