"""
Host topologies: sockets, NUMA nodes, cores and the CPUs a process may use.

Layer: ``poprun.planner``; the standard library (JSON and pathlib only when a file is read) and
``poprun.core``. The planner places instances on a host's NUMA nodes and cores
(:mod:`poprun.planner.placement`); this module says what a host has.

A :class:`HostTopology` comes from this machine's sysfs (:func:`discover`: NUMA nodes from
``/sys/devices/system/node``, cores from each CPU's ``topology/``, the cpuset from the CPUs this
process may run on and ``Mems_allowed_list``), or from a JSON file of the same shape
(:func:`load`), so that plans for other machines can be made anywhere
(``python3 -m poprun.planner.machine`` prints a host's own). A few recorded real
servers ship with poprun (:data:`RECORDED`, ``poprun/topologies/*.json``), for example the host
server of an IPU-POD64 (two 64-core AMD EPYC 7742 sockets, four NUMA nodes each).

CPU lists use the kernel's syntax (``0-3,8``), in files and in plans.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from poprun.core.purepath import is_dir
from poprun.core.record import positional_record, record

TOPOLOGIES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "topologies")
RECORDED = ("dell-r6525-2x-epyc-7742", "xeon-2s-2numa", "workstation-1numa")


@positional_record
class NumaNode:
    """One NUMA node: its number, its socket, and its cores (each a tuple of its logical CPUs)."""

    index: int
    socket: int
    cores: tuple[tuple[int, ...], ...]

    @property
    def cpus(self) -> tuple[int, ...]:
        """Return every logical CPU of the node, sorted."""
        return tuple(sorted(cpu for core in self.cores for cpu in core))


@record
class HostTopology:
    """
    What one host has: NUMA nodes (with sockets and cores) and the part of it a process may use.

    ``cpuset`` and ``mems`` are the CPUs and NUMA nodes allowed (a cpuset, ``taskset``, Slurm's
    binding); None means all of them.
    """

    name: str
    numa_nodes: tuple[NumaNode, ...]
    cpuset: tuple[int, ...] | None = None
    mems: tuple[int, ...] | None = None

    @property
    def sockets(self) -> tuple[int, ...]:
        """Return the socket numbers, sorted."""
        return tuple(sorted({node.socket for node in self.numa_nodes}))

    def usable(self) -> tuple[NumaNode, ...]:
        """
        Return the NUMA nodes and cores this host lets a process use (changelog 2.1).

        A node is usable when its memory is allowed and at least one of its CPUs is; a core,
        when all of its CPUs that are allowed (a core half in the cpuset keeps that half).
        """
        allowed = None if self.cpuset is None else set(self.cpuset)
        nodes = []
        for node in self.numa_nodes:
            if self.mems is not None and node.index not in self.mems:
                continue
            cores = tuple(tuple(c for c in core if allowed is None or c in allowed) for core in node.cores)
            cores = tuple(core for core in cores if core)
            if cores:
                nodes.append(NumaNode(node.index, node.socket, cores))
        return tuple(nodes)


def cpulist(cpus: tuple[int, ...] | list[int] | set[int]) -> str:
    """Return ``0-3,8`` for CPUs 0, 1, 2, 3 and 8 (the kernel's list syntax); ``""`` for none."""
    ordered = sorted(set(cpus))
    runs: list[str] = []
    start = prev = None
    for cpu in [*ordered, None]:
        if cpu is not None and prev is not None and cpu == prev + 1:
            prev = cpu
            continue
        if start is not None:
            runs.append(str(start) if start == prev else f"{start}-{prev}")
        start = prev = cpu
    return ",".join(runs)


def parse_cpulist(text: str) -> tuple[int, ...]:
    """Return the CPUs of a list like ``0-3,8`` (the kernel's syntax), sorted."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        cpus.update(range(int(first), int(last or first) + 1))
    return tuple(sorted(cpus))


def discover(*, sys_root: str = "/sys", status: str = "/proc/self/status", name: str | None = None) -> HostTopology:
    """
    Return this machine's topology from sysfs, with the cpuset of this process.

    A machine without ``/sys/devices/system/node`` is one NUMA node of every online CPU.
    """
    cpu_root = os.path.join(sys_root, "devices/system/cpu")  # pathlib costs start-up
    online = parse_cpulist(_read(cpu_root, "online") or f"0-{(os.cpu_count() or 1) - 1}")
    node_root = os.path.join(sys_root, "devices/system/node")
    members: dict[int, tuple[int, ...]] = {}
    for entry in _node_names(node_root) if is_dir(node_root) else []:
        members[int(entry[4:])] = tuple(c for c in parse_cpulist(_read(node_root, entry, "cpulist") or "") if c in online)
    if not members:
        members = {0: online}
    cores = {}
    for cpu in (c for cpus in members.values() for c in cpus):
        topo = (cpu_root, f"cpu{cpu}", "topology")
        cores[cpu] = (int(_read(*topo, "physical_package_id") or 0), int(_read(*topo, "core_id") or cpu))
    nodes = _nodes(members, cores)
    cpuset = tuple(sorted(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else None
    mems = next((parse_cpulist(line.split(":", 1)[1]) for line in (_read(status) or "").splitlines()
                 if line.startswith("Mems_allowed_list:")), None)
    return HostTopology(name=name or os.uname().nodename, numa_nodes=tuple(nodes), cpuset=cpuset, mems=mems)


# A POSIX shell script that prints what discover() reads, for hosts reached through ssh (the ssh
# backend's probe_topologies runs it):
# "node N CPULIST" lines, "cpu C PACKAGE CORE" lines, then the login shell's Cpus_allowed_list
# and Mems_allowed_list lines of /proc/self/status.
DUMP_SCRIPT = """\
for n in /sys/devices/system/node/node[0-9]*; do [ -r "$n/cpulist" ] && echo "node ${n##*node} $(cat "$n/cpulist")"; done
for c in /sys/devices/system/cpu/cpu[0-9]*; do t=$c/topology; [ -r "$t/core_id" ] && \
  echo "cpu ${c##*cpu} $(cat "$t/physical_package_id") $(cat "$t/core_id")"; done
grep -E '^(Cpus|Mems)_allowed_list:' /proc/self/status"""


def from_dump(name: str, text: str) -> HostTopology:
    """
    Return the topology that :data:`DUMP_SCRIPT`'s output describes.

    Raises:
        ValueError: when the text describes no CPU.
    """
    nodes: dict[int, tuple[int, ...]] = {}
    cores: dict[int, tuple[int, int]] = {}
    allowed: dict[str, tuple[int, ...]] = {}
    for line in text.splitlines():
        words = line.split()
        if len(words) == 3 and words[0] == "node":  # noqa: PLR2004 - "node N LIST"
            nodes[int(words[1])] = parse_cpulist(words[2])
        elif len(words) == 4 and words[0] == "cpu":  # noqa: PLR2004 - "cpu C PACKAGE CORE"
            cores[int(words[1])] = (int(words[2]), int(words[3]))
        elif len(words) == 2 and words[0] in ("Cpus_allowed_list:", "Mems_allowed_list:"):  # noqa: PLR2004
            allowed[words[0]] = parse_cpulist(words[1])
    if not cores:
        msg = f"no CPU in the topology read from {name}"
        raise ValueError(msg)
    if not nodes:
        nodes = {0: tuple(sorted(cores))}
    return HostTopology(name=name, numa_nodes=_nodes(nodes, cores), cpuset=allowed.get("Cpus_allowed_list:"),
                        mems=allowed.get("Mems_allowed_list:"))


def load(source: str) -> HostTopology:
    """
    Return the topology in the JSON file ``source``, or the recorded one of that name (:data:`RECORDED`).

    Raises:
        ValueError: with a one-line reason when the file cannot be read or is not a topology.
    """
    import json  # here, not at the top: only topology files need it (start-up stays lean)
    from pathlib import Path  # here, not at the top: only topology files need it (start-up stays lean)

    from poprun.core.diagnostic import DiagnosticError
    from poprun.core.textfile import read_text_file

    path = Path(source) if source not in RECORDED else Path(TOPOLOGIES) / f"{source}.json"
    try:
        # bounded like every file poprun reads: /dev/zero or a FIFO is refused, not read without end
        data = json.loads(read_text_file(str(path), key="POPRUN_HOST_TOPOLOGY"))
        nodes = tuple(NumaNode(int(n["index"]), int(n["socket"]), tuple(tuple(int(c) for c in core) for core in n["cores"]))
                      for n in data["numa_nodes"])
        cpuset = data.get("cpuset")
        mems = data.get("mems")
        return HostTopology(name=str(data.get("name", path.stem)), numa_nodes=nodes,
                            cpuset=None if cpuset is None else parse_cpulist(str(cpuset)),
                            mems=None if mems is None else parse_cpulist(str(mems)))
    except DiagnosticError as exc:
        problem = exc.diagnostics[0]
        msg = f"cannot read {path}: {problem.detail}" if problem.code == "PR113" else problem.detail
        raise ValueError(msg) from exc
    except RecursionError as exc:
        msg = f"{path} is not a host topology: arrays nested too deeply"
        raise ValueError(msg) from exc
    except (ValueError, KeyError, TypeError) as exc:
        msg = f"{path} is not a host topology: {type(exc).__name__}: {exc}"
        raise ValueError(msg) from exc


def to_json(topology: HostTopology) -> str:
    """Return ``topology`` as the JSON :func:`load` reads."""
    import json  # here, not at the top: see load()

    data: dict[str, object] = {"name": topology.name, "numa_nodes": [
        {"index": n.index, "socket": n.socket, "cores": [list(core) for core in n.cores]} for n in topology.numa_nodes]}
    if topology.cpuset is not None:
        data["cpuset"] = cpulist(topology.cpuset)
    if topology.mems is not None:
        data["mems"] = cpulist(topology.mems)
    return json.dumps(data, indent=1) + "\n"


def _nodes(members: Mapping[int, tuple[int, ...]], cores: Mapping[int, tuple[int, int]]) -> tuple[NumaNode, ...]:
    """
    Return the NUMA nodes of ``members`` (node -> its CPUs), their CPUs grouped into cores.

    ``cores`` maps a CPU to its (socket, core id); a node's socket is its first CPU's. A CPU
    not in ``cores`` is a core of its own on socket 0; a node without CPUs is left out.
    """
    nodes = []
    for index, cpus in sorted(members.items()):
        by_core: dict[tuple[int, int], list[int]] = {}
        for cpu in cpus:
            by_core.setdefault(cores.get(cpu, (0, cpu)), []).append(cpu)
        if by_core:
            grouped = tuple(tuple(v) for _, v in sorted(by_core.items(), key=lambda kv: kv[1][0]))
            nodes.append(NumaNode(index, cores.get(cpus[0], (0, 0))[0], grouped))
    return tuple(nodes)


def _read(*parts: str) -> str | None:
    try:
        with open(os.path.join(*parts), encoding="ascii") as file:  # pathlib costs start-up
            return file.read().strip()
    except OSError:
        return None


def _node_names(node_root: str) -> list[str]:
    """Return the names ``node_root.glob("node[0-9]*")`` gave, sorted: ``node`` and a digit, then anything."""
    try:
        names = [entry.name for entry in os.scandir(node_root)]
    except PermissionError:  # as glob: a directory it may not read has no entries
        return []
    return sorted(name for name in names if name.startswith("node") and name[4:5] in tuple("0123456789"))


if __name__ == "__main__":  # `python3 -m poprun.planner.machine`: this machine's topology, for POPRUN_HOST_TOPOLOGY
    import sys

    sys.stdout.write(to_json(discover()))
