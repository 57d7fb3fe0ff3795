"""
Host topologies: sockets, NUMA nodes, cores, accelerators and the CPUs a process may use.

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

Accelerators (:class:`Device`, docs/devices.md) are read only when asked (``--devices-per-instance``):
:func:`discover_devices` reads ``/sys/bus/pci/devices`` under a root directory (``/`` on a real
host, a fake tree in tests) and merges what ``nvidia-smi`` says (:func:`parse_smi`,
:func:`merge_smi`); the ssh probe's script (:data:`DUMP_SCRIPT`) prints the same from other hosts.
Every sysfs file is read bounded and only when it is a regular file (a FIFO, ``/dev/zero`` or a
huge file where an attribute should be is skipped, never waited on).

Length: CPUs, devices, the probe's script and its parser, and the topology file are one model of
a host, read and written here together; the device part is the second half.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from poprun.core.purepath import is_dir
from poprun.core.record import evolve, positional_record, record

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    import subprocess

TOPOLOGIES = os.path.join(os.path.dirname(os.path.dirname(__file__)), "topologies")
RECORDED = ("dell-r6525-2x-epyc-7742", "xeon-2s-2numa", "workstation-1numa", "hgx-h100-8gpu-2x-xeon-8480",
            "dell-r750xa-4x-a100")


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
class Device:
    """
    One accelerator of a host (a PCI GPU), as discovered.

    ``index`` is its number among the host's devices of its vendor in PCI bus id order: what
    ``nvidia-smi`` shows and CUDA uses under ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (which poprun sets
    with ``CUDA_VISIBLE_DEVICES``), and ROCm's order. ``vendor`` is ``nvidia`` or ``amd``;
    ``bus_id`` the PCI address as sysfs names it (``0000:1b:00.0``); ``numa_node`` -1 when not
    known; ``name`` and ``uuid`` come from ``nvidia-smi`` (empty without it); ``pci_id`` is
    ``vendor:device`` (``10de:2330``).
    """

    index: int
    vendor: str
    bus_id: str
    numa_node: int = -1
    name: str = ""
    uuid: str = ""
    pci_id: str = ""


@positional_record
class DeviceNote:
    """A coded warning of device discovery (PR247: nvidia-smi failed; PR248: it disagrees with sysfs)."""

    code: str
    detail: str


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
    # Accelerators, in index order (empty: none, or not read); where they were read from
    # ("sysfs", "sysfs+nvidia-smi", "recorded", "probe"; "" when not read); discovery's warnings.
    devices: tuple[Device, ...] = ()
    device_source: str = ""
    device_notes: tuple[DeviceNote, ...] = ()

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


MAX_CPU = 65_535  # the largest CPU number a list may name (the kernel's NR_CPUS is at most 8192 today)


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
    """
    Return the CPUs of a list like ``0-3,8`` (the kernel's syntax), sorted.

    Lists come from hosts' probe answers and files too: a CPU above :data:`MAX_CPU`, a range
    backwards, or ranges naming more than ``MAX_CPU + 1`` CPUs in all are refused before any is
    counted (``0-300000000`` once filled memory until the kernel killed poprun).

    Raises:
        ValueError: when ``text`` is not such a list.
    """
    cpus: set[int] = set()
    total = 0
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        low, high = int(first), int(last or first)
        total += high - low + 1
        if not 0 <= low <= high <= MAX_CPU or total > MAX_CPU + 1:
            msg = f"not a CPU list of CPUs 0 to {MAX_CPU}: {part[:40]!r}"
            raise ValueError(msg)
        cpus.update(range(low, high + 1))
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


# A POSIX shell script that prints what discover() and discover_devices() read, for hosts reached
# through ssh (the ssh backend's probe_topologies runs it as `sh -c SCRIPT sh /`; its argument is
# the root directory, which tests set to a fake tree): "node N CPULIST" lines, "cpu C PACKAGE
# CORE" lines, the login shell's Cpus_allowed_list and Mems_allowed_list lines of
# /proc/self/status, "pci ADDRESS VENDOR CLASS DEVICE NUMA LOCALCPULIST" for each accelerator
# ("-" for a missing value), and, on a real root with an NVIDIA GPU, nvidia-smi's rows as "smi ROW"
# lines then "smi exit STATUS". Only regular files are read (a FIFO is never waited on), with the
# shell's `read` (no process per file); nvidia-smi runs under `timeout` and its output is cut at
# 1,024 lines.
DUMP_SCRIPT = """\
r=${1%/}
for n in "$r"/sys/devices/system/node/node[0-9]*; do [ -f "$n/cpulist" ] && read -r l < "$n/cpulist"; \
  [ -f "$n/cpulist" ] && echo "node ${n##*node} $l"; done
for c in "$r"/sys/devices/system/cpu/cpu[0-9]*; do t=$c/topology; [ -f "$t/core_id" ] && \
  [ -f "$t/physical_package_id" ] || continue; read -r p < "$t/physical_package_id"; read -r k < "$t/core_id"; \
  echo "cpu ${c##*cpu} $p $k"; done
[ -f "$r/proc/self/status" ] && grep -E '^(Cpus|Mems)_allowed_list:' "$r/proc/self/status"
nv=
for d in "$r"/sys/bus/pci/devices/*; do
  [ -f "$d/class" ] && [ -f "$d/vendor" ] || continue
  read -r k < "$d/class"; read -r v < "$d/vendor"
  case "$v:$k" in
    0x10de:0x0300*|0x10de:0x0302*|0x10de:0x0380*|0x10de:0x1200*) nv=1 ;;
    0x1002:0x0300*|0x1002:0x0302*|0x1002:0x0380*|0x1002:0x1200*) ;;
    *) continue ;;
  esac
  m=-; [ -f "$d/numa_node" ] && read -r m < "$d/numa_node"
  i=-; [ -f "$d/device" ] && read -r i < "$d/device"
  l=-; [ -f "$d/local_cpulist" ] && read -r l < "$d/local_cpulist"
  echo "pci ${d##*/} $v $k ${i:--} ${m:--} ${l:--}"
done
if [ -z "$r" ] && [ -n "$nv" ] && command -v nvidia-smi >/dev/null 2>&1; then
  t=; command -v timeout >/dev/null 2>&1 && t="timeout 10"
  { $t nvidia-smi --query-gpu=index,pci.bus_id,uuid,name --format=csv,noheader 2>&1 </dev/null; echo "exit $?"; } \
    | head -n 1024 | sed 's/^/smi /'
fi"""


def from_dump(name: str, text: str) -> HostTopology:
    """
    Return the topology that :data:`DUMP_SCRIPT`'s output describes (with its devices: source ``probe``).

    Lines that do not read as the script writes them are skipped.

    Raises:
        ValueError: when the text describes no CPU.
    """
    nodes: dict[int, tuple[int, ...]] = {}
    cores: dict[int, tuple[int, int]] = {}
    allowed: dict[str, tuple[int, ...]] = {}
    pci: list[list[str]] = []
    smi: list[str] = []
    for line in text.splitlines():
        words = line.split()
        try:
            if len(words) == 3 and words[0] == "node":  # noqa: PLR2004 - "node N LIST"
                nodes[int(words[1])] = parse_cpulist(words[2])
            elif len(words) == 4 and words[0] == "cpu":  # noqa: PLR2004 - "cpu C PACKAGE CORE"
                cores[int(words[1])] = (int(words[2]), int(words[3]))
            elif len(words) == 2 and words[0] in ("Cpus_allowed_list:", "Mems_allowed_list:"):  # noqa: PLR2004
                allowed[words[0]] = parse_cpulist(words[1])
        except ValueError:
            continue
        if len(words) == 7 and words[0] == "pci":  # noqa: PLR2004 - "pci ADDRESS VENDOR CLASS DEVICE NUMA LOCAL"
            pci.append(words[1:])
        elif line.startswith("smi "):
            smi.append(line[4:])
    if not cores:
        msg = f"no CPU in the topology read from {name}"
        raise ValueError(msg)
    if not nodes:
        nodes = {0: tuple(sorted(cores))}
    topology = HostTopology(name=name, numa_nodes=_nodes(nodes, cores), cpuset=allowed.get("Cpus_allowed_list:"),
                            mems=allowed.get("Mems_allowed_list:"))
    return _dumped_devices(topology, pci, smi)


def _dumped_devices(topology: HostTopology, pci: list[list[str]], smi: list[str]) -> HostTopology:
    """Return ``topology`` with the devices of the dump's ``pci`` and ``smi`` lines (as :func:`discover_devices`)."""
    nodes = {n.index: n.cpus for n in topology.numa_nodes}
    found = []
    for address, vendor_id, class_, device_id, numa, local in pci:
        where, vendor = bus_id(address), pci_accelerator(class_, vendor_id)
        if where is None or vendor is None:
            continue
        node = _numa(numa if numa != "-" else None)
        if node < 0:
            node = node_of(None if local == "-" else local, nodes)
        short = device_id.lower().removeprefix("0x")
        found.append(Device(index=0, vendor=vendor, bus_id=where, numa_node=node,
                            pci_id=f"{VENDOR_IDS[vendor]}:{short}" if len(short) == 4 and short.isalnum() else ""))  # noqa: PLR2004
    devices, notes = numbered(found), tuple[DeviceNote, ...]()
    source = "probe"
    if smi:
        status = smi[-1].removeprefix("exit ").strip() if smi[-1].startswith("exit ") else "?"
        rows = smi[:-1] if smi[-1].startswith("exit ") else smi
        read = parse_smi("\n".join(rows))[0]
        if status == "0" and read:
            devices, notes = merge_smi(devices, read)
            source = "probe (sysfs+nvidia-smi)"
        elif status == "0":
            notes = (DeviceNote("PR247", "nvidia-smi's answer has no row poprun can read"),)
        else:
            said = next((r for r in reversed(rows) if r.strip()), "")
            reason = "no answer within 10 s" if status == "124" else f"exited with {status}"  # timeout(1)'s 124
            notes = (DeviceNote("PR247", f"nvidia-smi {reason}" + (f": {said[:200]}" if said else "")),)
    return evolve(topology, devices=devices, device_source=source, device_notes=notes)


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
        devices, notes = _loaded_devices(data.get("devices", []), data.get("device_notes", []))
        return HostTopology(name=str(data.get("name", path.stem)), numa_nodes=nodes,
                            cpuset=None if cpuset is None else parse_cpulist(str(cpuset)),
                            mems=None if mems is None else parse_cpulist(str(mems)),
                            devices=devices, device_source="recorded", device_notes=notes)
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
    if topology.devices:
        data["devices"] = [{"index": d.index, "vendor": d.vendor, "bus_id": d.bus_id, "numa_node": d.numa_node,
                            "name": d.name, "uuid": d.uuid, "pci_id": d.pci_id} for d in topology.devices]
    if topology.device_notes:
        data["device_notes"] = [{"code": n.code, "detail": n.detail} for n in topology.device_notes]
    return json.dumps(data, indent=1) + "\n"


def _loaded_devices(devices: object, notes: object) -> tuple[tuple[Device, ...], tuple[DeviceNote, ...]]:
    """
    Return a topology file's devices and discovery notes.

    Raises:
        ValueError: when a device is not a PCI accelerator record (bad vendor, bus id, index or NUMA node).
    """
    if not isinstance(devices, list) or not isinstance(notes, list):
        msg = "devices and device_notes are arrays"
        raise ValueError(msg)  # noqa: TRY004 - load() turns every ValueError into its one-line reason
    found = []
    for d in devices:
        address = bus_id(str(d["bus_id"]))
        if address is None or str(d["vendor"]) not in VENDOR_IDS or int(d["index"]) < 0 or int(d["numa_node"]) < -1:
            msg = f"device {d!r} is not an accelerator record (index, vendor nvidia|amd, bus_id, numa_node)"
            raise ValueError(msg)
        found.append(Device(index=int(d["index"]), vendor=str(d["vendor"]), bus_id=address,
                            numa_node=int(d["numa_node"]), name=str(d.get("name", "")), uuid=str(d.get("uuid", "")),
                            pci_id=str(d.get("pci_id", ""))))
    keys = [(d.vendor, d.index) for d in found]
    if len(set(keys)) != len(keys) or len({d.bus_id for d in found}) != len(found):
        msg = "two devices share an index or a bus id"
        raise ValueError(msg)
    return (tuple(sorted(found, key=lambda d: (d.vendor, d.index))),
            tuple(DeviceNote(str(n["code"]), str(n["detail"])) for n in notes))


# -- accelerators ------------------------------------------------------------------------------
# PCI classes of accelerators (the class attribute's first four hex digits): VGA and 3D
# controllers (NVIDIA's GPUs, AMD's Instinct before MI300), other display controllers (AMD MI100,
# MI200) and processing accelerators (AMD MI300); of these vendors only (a server's BMC VGA is not one).
PCI_CLASSES = ("0x0300", "0x0302", "0x0380", "0x1200")
VENDORS = {"0x10de": "nvidia", "0x1002": "amd"}
MAX_PCI_DEVICES = 4096  # entries of /sys/bus/pci/devices read at most (a real host has a few hundred)
SMI_QUERY = ("nvidia-smi", "--query-gpu=index,pci.bus_id,uuid,name", "--format=csv,noheader")
SMI_TIMEOUT_S = 10.0
_SMI_BYTES = 1 << 20


def bus_id(text: str) -> str | None:
    """
    Return the PCI address ``text`` as sysfs writes it (``0000:1b:00.0``), or None when it is not one.

    ``nvidia-smi`` writes an eight-digit domain in capitals (``00000000:1B:00.0``).
    """
    import re

    match = re.fullmatch(r"([0-9a-fA-F]{4,8}):([0-9a-fA-F]{2}):([0-9a-fA-F]{2})\.([0-7])", text.strip())
    if match is None:
        return None
    domain, bus, slot, function = match.groups()
    return f"{int(domain, 16):04x}:{bus.lower()}:{slot.lower()}.{function}"


def pci_accelerator(class_: str | None, vendor: str | None) -> str | None:
    """Return ``nvidia`` or ``amd`` when a PCI device of ``class_`` and ``vendor`` (sysfs's text) is an accelerator."""
    if class_ is None or vendor is None or not class_.lower().startswith(PCI_CLASSES):
        return None
    return VENDORS.get(vendor.lower())


def _numa(text: str | None) -> int:
    """Return a ``numa_node`` attribute's node: -1 when missing, negative or not a number."""
    try:
        node = int(text or "-1")
    except ValueError:
        return -1
    return node if 0 <= node < 1 << 16 else -1  # no host has 65,536 NUMA nodes


def node_of(local_cpus: str | None, nodes: Mapping[int, tuple[int, ...]]) -> int:
    """Return the NUMA node whose CPUs are exactly ``local_cpus`` (a device's ``local_cpulist``), or -1."""
    try:
        cpus = parse_cpulist(local_cpus or "")
    except ValueError:
        return -1
    found = [index for index, mine in nodes.items() if cpus and tuple(sorted(mine)) == cpus]
    return found[0] if len(found) == 1 else -1


def numbered(found: list[Device]) -> tuple[Device, ...]:
    """
    Return ``found`` in PCI bus id order, each numbered among its vendor's devices (index order within a vendor).

    A bus id given again (a forged probe answer; sysfs names each once) is left out: one PCI
    function is one device.
    """
    ordered = list({d.bus_id: d for d in sorted(found, key=lambda d: d.bus_id, reverse=True)}.values())[::-1]
    counts: dict[str, int] = {}
    devices = []
    for device in ordered:
        devices.append(evolve(device, index=counts.get(device.vendor, 0)))
        counts[device.vendor] = counts.get(device.vendor, 0) + 1
    return tuple(devices)


def sysfs_devices(root: str = "/", nodes: Mapping[int, tuple[int, ...]] | None = None) -> tuple[Device, ...]:
    """
    Return the accelerators under ``root``'s ``sys/bus/pci/devices``, numbered (:func:`numbered`).

    A device's NUMA node is its ``numa_node``; where that says -1 (firmware left it out), the
    node of ``nodes`` (node -> CPUs) whose CPUs are the device's ``local_cpulist``, else -1.
    """
    pci = os.path.join(root, "sys/bus/pci/devices")
    try:
        names = sorted(entry.name for entry in os.scandir(pci))[:MAX_PCI_DEVICES]
    except OSError:
        return ()
    found = []
    for name in names:
        address = bus_id(name)
        where = os.path.join(pci, name)
        vendor = pci_accelerator(attribute(os.path.join(where, "class")), attribute(os.path.join(where, "vendor")))
        if address is None or vendor is None:
            continue
        node = _numa(attribute(os.path.join(where, "numa_node")))
        if node < 0 and nodes:
            node = node_of(attribute(os.path.join(where, "local_cpulist"), limit=65536), nodes)
        device_id = (attribute(os.path.join(where, "device")) or "").lower().removeprefix("0x")
        pci_id = f"{VENDOR_IDS[vendor]}:{device_id}" if len(device_id) == 4 and device_id.isalnum() else ""  # noqa: PLR2004
        found.append(Device(index=0, vendor=vendor, bus_id=address, numa_node=node, pci_id=pci_id))
    return numbered(found)


VENDOR_IDS = {"nvidia": "10de", "amd": "1002"}


def parse_smi(text: str) -> tuple[tuple[tuple[int, str, str, str], ...], int]:
    """
    Return the rows of ``nvidia-smi --query-gpu=index,pci.bus_id,uuid,name --format=csv,noheader``, and how many lines were not rows.

    A row is (index, bus id as sysfs writes it, uuid, name). Pure: tested on recorded outputs.
    A host's answer is not trusted: a UUID is letters, digits and dashes (``GPU-`` or ``MIG-``
    first), a name at most 200 printable characters, an index at most six digits; other lines
    are not rows.
    """
    import re

    uuid_form = re.compile(r"(GPU|MIG)-[A-Za-z0-9-]{1,80}\Z")
    rows, bad = [], 0
    for line in text.splitlines():
        if not line.strip():
            continue
        words = [w.strip() for w in line.split(",", 3)]
        address = bus_id(words[1]) if len(words) == 4 else None  # noqa: PLR2004 - four columns asked
        index = words[0]  # ASCII digits: str.isdigit() also says yes to '\u00b2', which int() refuses
        if address is None or not (index.isascii() and index.isdigit() and len(index) <= 6) or not uuid_form.match(words[2]):  # noqa: PLR2004
            bad += 1
            continue
        rows.append((int(words[0]), address, words[2], "".join(c for c in words[3] if c.isprintable())[:200]))
    return tuple(rows), bad


def merge_smi(devices: tuple[Device, ...], rows: tuple[tuple[int, str, str, str], ...]) -> tuple[tuple[Device, ...], tuple[DeviceNote, ...]]:
    """
    Return ``devices`` (from sysfs) with ``nvidia-smi``'s rows merged in by bus id, and the disagreements (PR248).

    ``nvidia-smi`` sees the GPUs this host lets CUDA use: where it shows fewer than sysfs (a
    container, a cgroup), its GPUs are the host's NVIDIA devices, numbered as it numbers them
    (CUDA's numbers); a GPU it shows that sysfs does not is taken with an unknown NUMA node.
    """
    by_bus = {d.bus_id: d for d in devices if d.vendor == "nvidia"}
    notes: list[DeviceNote] = []
    merged: list[Device] = []
    seen: set[object] = set()
    for index, address, uuid, name in rows:
        if index in seen or address in seen:  # nvidia-smi names each GPU once: a repeated row is forged or garbled
            notes.append(DeviceNote("PR248", f"nvidia-smi shows GPU {index} at {address} again: the row is left out"))
            continue
        seen.update((index, address))
        known = by_bus.pop(address, None)
        if known is None:
            notes.append(DeviceNote("PR248", f"nvidia-smi shows GPU {index} at {address}, which sysfs does not list: "
                                             "its NUMA node is not known"))
            known = Device(index=index, vendor="nvidia", bus_id=address)
        elif known.index != index:
            notes.append(DeviceNote("PR248", f"nvidia-smi numbers the GPU at {address} {index}, sysfs's bus order "
                                             f"{known.index}: nvidia-smi's (CUDA's) number is used"))
        merged.append(evolve(known, index=index, name=name, uuid=uuid))
    if by_bus:
        hidden = ", ".join(sorted(by_bus))
        notes.append(DeviceNote("PR248", f"sysfs lists NVIDIA GPUs that nvidia-smi does not show ({hidden}): they are "
                                         "not usable here (a container or cgroup hides them) and are left out"))
    others = [d for d in devices if d.vendor != "nvidia"]
    return tuple(sorted([*merged, *others], key=lambda d: (d.vendor, d.index))), tuple(notes)


def run_smi(timeout_s: float = SMI_TIMEOUT_S) -> tuple[str | None, DeviceNote | None]:
    """
    Return ``nvidia-smi``'s answer to :data:`SMI_QUERY`, or None and why not (PR247) when it fails.

    No ``nvidia-smi`` on PATH: (None, None). It runs in a session of its own for at most
    ``timeout_s``, its output (stdout and stderr together) read up to 1 MiB: past that, or past
    the time, the session is killed (an endless answer was read into memory whole, and a child
    it left behind outlived poprun).
    """
    import shutil
    import subprocess

    program = shutil.which(SMI_QUERY[0])
    if program is None:
        return None, None
    try:
        proc = subprocess.Popen([program, *SMI_QUERY[1:]], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,  # noqa: S603
                                stderr=subprocess.STDOUT, start_new_session=True)
    except OSError as exc:
        return None, DeviceNote("PR247", f"nvidia-smi could not run: {exc.strerror or exc}")
    out, ended = _read_bounded(proc, timeout_s)
    if not ended:
        why = f"gave no answer within {timeout_s:g} s" if len(out) <= _SMI_BYTES else \
            f"wrote more than {_SMI_BYTES >> 20} MiB"
        return None, DeviceNote("PR247", f"nvidia-smi {why}")
    if proc.returncode != 0:
        said = out.decode(errors="replace").strip().splitlines()
        return None, DeviceNote("PR247", f"nvidia-smi exited with {proc.returncode}"
                                         + (f": {said[-1][:200]}" if said else ""))
    return out.decode(errors="replace"), None


def _read_bounded(proc: subprocess.Popen[bytes], timeout_s: float) -> tuple[bytes, bool]:
    """Return what ``proc`` wrote (at most :data:`_SMI_BYTES` + 1) and whether it ended by itself; else its session is killed."""
    import contextlib
    import selectors
    import signal
    import subprocess
    import time

    assert proc.stdout is not None
    out = bytearray()
    deadline = time.monotonic() + timeout_s
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        while len(out) <= _SMI_BYTES and (left := deadline - time.monotonic()) > 0:
            if not selector.select(left):
                continue
            chunk = os.read(proc.stdout.fileno(), 65536)
            if not chunk:
                break
            out.extend(chunk)
    proc.stdout.close()
    try:
        ended = len(out) <= _SMI_BYTES and proc.wait(max(deadline - time.monotonic(), 0.01)) is not None
    except subprocess.TimeoutExpired:
        ended = False
    if not ended or proc.returncode is None:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    return bytes(out[:_SMI_BYTES + 1]), ended


def discover_devices(topology: HostTopology, root: str = "/", *, smi: bool | None = None) -> HostTopology:
    """
    Return ``topology`` with the accelerators of the host whose file system is at ``root``.

    From sysfs (:func:`sysfs_devices`), then, when ``smi`` (default: the root is ``/`` and an
    NVIDIA GPU was found), ``nvidia-smi``'s view merged in (:func:`merge_smi`); its failure is a
    note (PR247), never an error.
    """
    nodes = {n.index: n.cpus for n in topology.numa_nodes}
    devices = sysfs_devices(root, nodes)
    source, notes = "sysfs", tuple[DeviceNote, ...]()
    if smi if smi is not None else (root == "/" and any(d.vendor == "nvidia" for d in devices)):
        text, failed = run_smi()
        rows = parse_smi(text)[0] if text is not None else ()
        if rows:
            devices, notes = merge_smi(devices, rows)
            source = "sysfs+nvidia-smi"
        elif text is not None:
            notes = (DeviceNote("PR247", "nvidia-smi's answer has no row poprun can read"),)
        elif failed is not None:
            notes = (failed,)
    return evolve(topology, devices=devices, device_source=source, device_notes=notes)


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
    """Return a sysfs or proc file's text, stripped: None unless a regular file of ASCII text under 64 KiB."""
    return attribute(os.path.join(*parts), limit=65536)


def attribute(path: str, *, limit: int = 4096) -> str | None:
    """
    Return the text of the sysfs attribute ``path``, stripped; None when it cannot be read as one.

    Opened without blocking and read only when a regular file (a FIFO, ``/dev/zero``, a
    directory or a terminal there is skipped at once), at most ``limit`` bytes (a larger file,
    not an attribute, is skipped), as ASCII text without NUL.
    """
    import stat

    from poprun.core.textfile import READ_FLAGS

    try:
        fd = os.open(path, READ_FLAGS)
    except (OSError, ValueError):  # ValueError: a NUL in the path
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        data = os.read(fd, limit + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    if len(data) > limit or b"\0" in data:
        return None
    try:
        return data.decode("ascii").strip()
    except UnicodeDecodeError:
        return None


def _node_names(node_root: str) -> list[str]:
    """Return the names ``node_root.glob("node[0-9]*")`` gave, sorted: ``node`` and a digit, then anything."""
    try:
        names = [entry.name for entry in os.scandir(node_root)]
    except PermissionError:  # as glob: a directory it may not read has no entries
        return []
    return sorted(name for name in names if name.startswith("node") and name[4:5] in tuple("0123456789"))


if __name__ == "__main__":  # `python3 -m poprun.planner.machine`: this machine's topology and devices, for POPRUN_HOST_TOPOLOGY
    import sys

    sys.stdout.write(to_json(discover_devices(discover())))
