"""
The solver's device step: each instance's accelerators on its host, NUMA-near first, and the CPUs that follow them.

Layer: ``poprun.planner``; imports the solver state, the plan model, :mod:`machine`, :mod:`binding`
(the hosts' topologies, read once a solve) and :mod:`environment` (the user's ``-x``). Imported by
the solver only when ``--devices-per-instance`` is given: a plan without devices never loads it.

Assignment (docs/devices.md): a host's devices are those of one vendor (the one it has most of;
NVIDIA on a tie), grouped by NUMA node. Each node holds ``len(node's devices) // N`` whole
instances of N devices. The host's instances are spread over the nodes that hold any, in order,
as ``spreadnuma`` spreads them over NUMA nodes (instance i to node ``i * nodes // instances``),
no node given more than it holds (the rest go to the next nodes with room); within a node each
instance takes the next N devices in index order. So 8 instances of 1 device on a two-socket
8-GPU server give instance i device i, on the node of its socket. Instances beyond what the
nodes hold whole take the devices left, in index order, across nodes (PR245 when a single
node could have held them: the split is uneven).

CPU binding follows the devices, whatever the strategy would have chosen alone: under
``spreadnuma`` an instance is bound to every usable CPU of its devices' NUMA node(s) (instances
sharing a node share its CPUs); under ``close``, ``scatternuma`` and ``scattersocket`` to one core
of its devices' node, the node's next free core (the devices already chose the node; a node out of
cores lends the next free core in order). ``--numa-aware off`` or ``--process-placement disabled``:
the devices are assigned the same way and the CPUs are not bound. A device whose NUMA node is not
known leaves its instance bound as the strategy alone would.

Variables: ``CUDA_VISIBLE_DEVICES`` with the devices' indices and ``CUDA_DEVICE_ORDER=PCI_BUS_ID``
(CUDA numbers GPUs fastest first by default; indices are PCI bus order, as nvidia-smi's, and
portable to plans made from recorded topologies, where UUIDs are not known); for AMD,
``ROCR_VISIBLE_DEVICES`` only (it filters in the ROCm runtime, below HIP, OpenCL and OpenMP
offload; ``HIP_VISIBLE_DEVICES`` would index the list ROCR already renumbered, so setting both
with the same indices is wrong). ``POPDIST_DEVICES`` names the instance's devices as the program
numbers them; ``LOCAL_RANK`` is 0 under ``local-rank-zero``. A ``-x`` of one of them wins (PR246).

Diagnostics: PR241 (more devices than a host has, with the nearest feasible numbers), PR242 (a
host's devices not known when planning), PR243 (a host without devices), PR244 (the instances
run here, and this machine has none); warnings PR245 (an instance's devices cross NUMA nodes
though one node could hold them), PR246 (``-x`` of a variable the devices set), PR247 / PR248
(nvidia-smi failed / disagrees with sysfs), PR249 (``--device-visibility`` without devices), PR316
(the launching shell's ``CUDA_VISIBLE_DEVICES`` / ``ROCR_VISIBLE_DEVICES`` names devices this machine
does not have; when it names some, only those are assigned).
"""

from __future__ import annotations

from poprun.core.record import evolve
from poprun.core.span import SourceSpan
from poprun.planner import plan as p
from poprun.planner.binding import TOPOLOGY_VARIABLE, host_topologies
from poprun.planner.machine import Device, HostTopology, NumaNode, cpulist
from poprun.planner.placement import CORE_STRATEGIES
from poprun.planner.setting import setting_value
from poprun.planner.state import Solver

VISIBILITIES = p.DEVICE_VISIBILITIES
POPDIST_DEVICES = "POPDIST_DEVICES"  # popdist._contract.DEVICES
LOCAL_RANK = "LOCAL_RANK"
VARIABLES = p.DEVICE_VARIABLES
# Variables that also filter devices: a -x of one of them changes what the instance sees (PR246).
FILTERS = ("CUDA_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "GPU_DEVICE_ORDINAL")
VENDOR_NAMES = {"nvidia": "NVIDIA", "amd": "AMD"}


def no_devices(s: Solver) -> p.Devices:
    """PR249 when ``--device-visibility`` is given without ``--devices-per-instance``; return no devices."""
    given = s.spec.device_visibility
    if given is not None:
        s.warn("PR249", "device visibility without devices", span=given.origin,
               detail=f"--device-visibility {given.value} says what an instance sees of the devices poprun gives it, "
                      "but no --devices-per-instance asks for any",
               hint="add --devices-per-instance N, or drop --device-visibility")
    return p.NO_DEVICES


def assign(s: Solver, instances: tuple[p.Instance, ...], placement: p.Placement, *,
           all_here: bool) -> tuple[tuple[p.Instance, ...], p.Devices]:
    """
    Return ``instances`` with their devices, environment and binding, and the plan's devices record.

    ``all_here``: every instance runs on this machine (the local and offline backends): its
    devices are every host's, unless ``POPRUN_HOST_TOPOLOGY`` describes the hosts.
    """
    given = s.spec.devices_per_instance
    assert given is not None
    per = s.decide("devices.per_instance", given.value, given.origin, "as given")
    visibility = s.pick("devices.visibility", s.spec.device_visibility, "own",
                        "default: an instance sees only its own devices")
    hosts = list(dict.fromkeys(i.host for i in instances))
    topologies = _topologies(s, hosts, all_here=all_here)
    if topologies is None:
        return instances, p.NO_DEVICES
    found: dict[int, p.Instance] = {}
    records: list[p.HostDevices] = []
    vendors: set[str] = set()
    for host in hosts:
        mine = [i for i in instances if i.host == host]
        topology = topologies[host]
        devices = _usable(topology)
        if not devices:
            _no_devices(s, host, topology, all_here=all_here)
            continue
        if len(mine) * per > len(devices):
            _too_many(s, host, len(devices), len(mine), per)
            continue
        vendors.add(devices[0].vendor)
        records.append(_record(host, topology, devices))
        chosen, crossing = split(devices, len(mine), per)
        _explain_host(s, host, topology, devices, count=len(mine), per=per, crossing=[mine[k].index for k in crossing])
        for instance, own in zip(mine, chosen, strict=True):
            bound = _bind(instance, own, topology, placement, chosen=chosen, mine=mine)
            found[instance.index] = evolve(instance, devices=tuple(str(d.index) for d in own), placement=bound)
    if s.diags.has_errors:
        return instances, p.NO_DEVICES
    variables = tuple(v for vendor in sorted(vendors) for v in VARIABLES[vendor])
    placed = tuple(_environment(s, found[i.index], visibility, topologies[i.host]) for i in instances)
    _explain_visibility(s, visibility, variables)
    return placed, p.Devices(per_instance=per, visibility=visibility, variables=variables, hosts=tuple(records))


# -- the hosts' devices --------------------------------------------------------------------
def _topologies(s: Solver, hosts: list[str], *, all_here: bool) -> dict[str, HostTopology] | None:
    """Return each host's topology with its devices; None after a diagnostic (PR242, or PR307 said already)."""
    given = setting_value(TOPOLOGY_VARIABLE, s.ctx.environ)
    if all_here and not given:
        local = s.ctx.probe() if s.ctx.probe is not None else None
        read: dict[str, HostTopology | str | None] = dict.fromkeys(hosts, local)
    else:
        read = host_topologies(s, hosts)
    if any(d.code == "PR307" for d in s.diags):
        return None
    found: dict[str, HostTopology] = {}
    unread: dict[str, list[str]] = {}
    here: HostTopology | None = None  # this machine's devices, read once
    for host, topology in read.items():
        if isinstance(topology, HostTopology):
            if not topology.device_source and s.ctx.device_probe is not None:  # this machine's, devices not read yet
                here = here or shell_visible(s, s.ctx.device_probe(topology))
                topology = evolve(topology, devices=here.devices, device_source=here.device_source,  # noqa: PLW2901
                                  device_notes=here.device_notes)
            found[host] = topology
            _notes(s, host, topology)
        else:
            unread.setdefault(topology or "", []).append(host)
    for why, names in unread.items():
        from poprun.core.hostlist import compress

        shown = compress(names) if len(names) > 1 else names[0]
        reason = (f"could not be read through ssh ({why})" if why else
                  "are read through ssh only when launching ('poprun plan' asks no host)")
        s.fail("PR242", "devices of a host not known", span=s.origin("devices_per_instance"),
               detail=f"--devices-per-instance needs the devices of {shown}, which {reason}",
               hint=f"check that poprun reaches {shown} by ssh, or describe the hosts: {TOPOLOGY_VARIABLE}=FILE|NAME "
                    "('python3 -m poprun.planner.machine' on a host writes its FILE; recorded: "
                    "hgx-h100-8gpu-2x-xeon-8480, dell-r750xa-4x-a100)")
    return None if unread or any(d.code == "PR316" for d in s.diags) else found


SHELL_FILTERS = {"nvidia": "CUDA_VISIBLE_DEVICES", "amd": "ROCR_VISIBLE_DEVICES"}


def shell_visible(s: Solver, topology: HostTopology) -> HostTopology:
    """
    Return this machine's ``topology`` with only the devices the launching shell's own filter leaves (PR316 when it names others).

    ``CUDA_VISIBLE_DEVICES=4,5,6,7 poprun ...`` on a shared machine keeps poprun off GPUs 0-3, as it
    keeps any CUDA program off them: its entries are indices as nvidia-smi numbers the GPUs (PCI bus
    order, as poprun's own ``CUDA_DEVICE_ORDER``) or their UUIDs; ``ROCR_VISIBLE_DEVICES`` likewise for AMD.
    """
    kept = list(topology.devices)
    for vendor, name in SHELL_FILTERS.items():
        raw = s.ctx.environ.get(name)
        mine = [d for d in kept if d.vendor == vendor]
        if raw is None or not mine:
            continue
        words = [w.strip() for w in raw.split(",")]
        by_word = {**{str(d.index): d for d in mine}, **{d.uuid: d for d in mine if d.uuid}}
        unknown = [w for w in words if w not in by_word]
        shown = "".join(c if c.isprintable() else "?" for c in raw[:80])
        if unknown or len({by_word[w].bus_id for w in words}) != len(words):
            named = ", ".join(repr(w[:40]) for w in unknown[:4]) or "a device twice"
            why = "is empty: it hides every GPU" if not raw.strip() else \
                f"names {named}, not one device each of this machine's ({', '.join(str(d.index) for d in mine)})"
            s.fail("PR316", "the launching shell's device filter names other devices", span=SourceSpan.env(name),
                   detail=f"{name}={shown!r} {why}",
                   hint=f"unset {name}, or list indices or UUIDs of this machine's GPUs as 'nvidia-smi -L' shows them")
            return evolve(topology, devices=())
        listed = {by_word[w].bus_id for w in words}
        kept = [d for d in kept if d.vendor != vendor or d.bus_id in listed]
        s.decide(f"devices.{name}", shown, SourceSpan.env(name),
                 f"the launching shell's: poprun assigns only these of this machine's {len(mine)} devices")
    return evolve(topology, devices=tuple(kept))


def _notes(s: Solver, host: str, topology: HostTopology) -> None:
    """PR247 / PR248 for what discovery found wrong on ``host`` (once per host and note)."""
    for note in topology.device_notes:
        if note.code not in ("PR247", "PR248"):
            continue
        detail = f"on {host}: {note.detail}"
        if any(d.code == note.code and d.detail == detail for d in s.diags.warnings):
            continue
        if note.code == "PR247":
            s.warn("PR247", "nvidia-smi failed", span=s.origin("devices_per_instance"), detail=detail,
                   hint="the devices are those sysfs lists (no names or UUIDs); check the NVIDIA driver with "
                        "'nvidia-smi' on the host")
        else:
            s.warn("PR248", "nvidia-smi and sysfs disagree", span=s.origin("devices_per_instance"), detail=detail,
                   hint="poprun follows nvidia-smi, which lists the GPUs CUDA can use here; check the container's or "
                        "job's GPU limits if this is not what you expected")


def _usable(topology: HostTopology) -> tuple[Device, ...]:
    """Return the devices of the vendor ``topology`` has most of (NVIDIA on a tie), in index order."""
    by_vendor: dict[str, list[Device]] = {}
    for device in topology.devices:
        by_vendor.setdefault(device.vendor, []).append(device)
    if not by_vendor:
        return ()
    vendor = max(sorted(by_vendor, key=lambda v: v != "nvidia"), key=lambda v: len(by_vendor[v]))
    return tuple(sorted(by_vendor[vendor], key=lambda d: d.index))


def _record(host: str, topology: HostTopology, devices: tuple[Device, ...]) -> p.HostDevices:
    return p.HostDevices(host=host, source=topology.device_source or "sysfs", devices=tuple(
        p.HostDevice(index=d.index, vendor=d.vendor, bus_id=d.bus_id, numa_node=d.numa_node, name=d.name, uuid=d.uuid)
        for d in devices))


def _no_devices(s: Solver, host: str, topology: HostTopology, *, all_here: bool) -> None:
    """PR244 when the instances run here and this machine has no device; PR243 for another host without any."""
    where = f"read from {topology.device_source}" if topology.device_source else "read"
    if all_here and not setting_value(TOPOLOGY_VARIABLE, s.ctx.environ):
        s.fail("PR244", "no device on this machine", span=s.origin("devices_per_instance"),
               detail=f"the instances run on this machine, which has no NVIDIA or AMD GPU ({where}: "
                      "/sys/bus/pci/devices lists none)",
               hint=f"drop --devices-per-instance to run on CPUs, or plan for a GPU server: {TOPOLOGY_VARIABLE}="
                    "hgx-h100-8gpu-2x-xeon-8480 (a recorded one) or a file its 'python3 -m poprun.planner.machine' wrote")
        return
    s.fail("PR243", "host without devices", span=s.origin("devices_per_instance"),
           detail=f"{host} has no NVIDIA or AMD GPU (its devices as {where}: none)",
           hint=f"drop --devices-per-instance, or leave {host} out of the hosts")


def _too_many(s: Solver, host: str, have: int, count: int, per: int) -> None:
    """PR241 with the nearest numbers that fit: fewer instances of ``per`` devices, or fewer devices each."""
    options = []
    if have // per >= 1:
        options.append(f"at most {have // per} instance{'s' if have // per > 1 else ''} of {per} device"
                       f"{'s' if per > 1 else ''} on {host}")
    if have // count >= 1:
        options.append(f"{have // count} device{'s' if have // count > 1 else ''} per instance for {count} "
                       f"instances: --devices-per-instance {have // count}")
    s.fail("PR241", "more devices than the host has", span=s.origin("devices_per_instance"),
           detail=f"{count} instance{'s' if count > 1 else ''} of {per} device{'s' if per > 1 else ''} need "
                  f"{count * per} devices on {host}, which has {have}",
           hint="use " + ", or ".join(options) + ", or spread the instances over more hosts" if options
           else "spread the instances over more hosts")


# -- the assignment ----------------------------------------------------------------------
def split(devices: tuple[Device, ...], count: int, per: int) -> tuple[list[tuple[Device, ...]], list[int]]:
    """
    Return the devices of each of ``count`` instances of ``per`` devices (pure; see the module's docstring), and the local indices of those whose devices cross NUMA nodes though one node holds ``per``.

    Requires ``count * per <= len(devices)``.
    """
    groups: dict[int, list[Device]] = {}
    for device in devices:
        groups.setdefault(device.numa_node, []).append(device)
    order = sorted(groups, key=lambda n: (n < 0, n))  # an unknown node (-1) last
    holds = {n: len(groups[n]) // per for n in order}
    nodes = [n for n in order if holds[n] > 0 and n >= 0]  # devices of an unknown node: only what is left
    targets = dict.fromkeys(nodes, 0)
    for i in range(count if nodes else 0):
        targets[nodes[i * len(nodes) // count]] += 1
    spill = sum(max(targets[n] - holds[n], 0) for n in nodes)
    for n in nodes:
        targets[n] = min(targets[n], holds[n])
    for n in nodes:
        room = min(holds[n] - targets[n], spill)
        targets[n] += room
        spill -= room
    taken: set[str] = set()
    chosen: list[tuple[Device, ...]] = []
    for n in nodes:
        for _ in range(targets[n]):
            own = tuple(d for d in groups[n] if d.bus_id not in taken)[:per]
            taken.update(d.bus_id for d in own)
            chosen.append(own)
    crossing = []
    largest = max((len(g) for n, g in groups.items() if n >= 0), default=0)
    while len(chosen) < count:
        own = tuple(d for d in devices if d.bus_id not in taken)[:per]
        taken.update(d.bus_id for d in own)
        if len({d.numa_node for d in own}) > 1 and per <= largest:
            crossing.append(len(chosen))
        chosen.append(own)
    return chosen, crossing


def _bind(instance: p.Instance, own: tuple[Device, ...], topology: HostTopology, placement: p.Placement, *,
          chosen: list[tuple[Device, ...]], mine: list[p.Instance]) -> p.Placement:
    """Return ``instance``'s placement bound to its devices' NUMA node(s) (see the module's docstring)."""
    if not placement.numa_aware or placement.strategy == "disabled":
        return instance.placement
    nodes = sorted({d.numa_node for d in own if d.numa_node >= 0})
    usable = {n.index: n for n in topology.usable()}
    near = [usable[n] for n in nodes if n in usable]
    if not near:
        why = "its devices' NUMA node is not known" if not nodes else \
            f"its devices' NUMA node {cpulist(tuple(nodes))} has no CPU this process may use"
        return evolve(instance.placement, reason=f"{instance.placement.reason}; {why}")
    reason = f"{placement.strategy} on {topology.name}, near its devices"
    if placement.strategy not in CORE_STRATEGIES:
        cpus = sorted(c for n in near for c in n.cpus)
        return evolve(instance.placement, numa_nodes=cpulist(tuple(n.index for n in near)), cpus=cpulist(cpus),
                      reason=reason)
    position = mine.index(instance)
    taken: list[tuple[int, ...]] = []
    for before in range(position):  # the cores the instances before this one on the host took
        taken.append(_core(chosen[before], usable, taken))
    core = _core(own, usable, taken)
    if not core:  # fewer usable cores than instances: the placement step said so (PR306); nothing to bind to
        return instance.placement
    node = next(n.index for n in topology.usable() for c in n.cores if c == core)
    return evolve(instance.placement, numa_nodes=str(node), cpus=cpulist(core), reason=reason)


def _core(own: tuple[Device, ...], usable: dict[int, NumaNode], taken: list[tuple[int, ...]]) -> tuple[int, ...]:
    """Return the next free core of the devices' first node, else the next free core of any node in order."""
    nodes = list(usable.values())
    first = next((d.numa_node for d in own if d.numa_node in usable), None)
    ordered = [n for n in nodes if n.index == first] + [n for n in nodes if n.index != first]
    return next((core for n in ordered for core in n.cores if core not in taken), ())


# -- the environment ---------------------------------------------------------------------
def _environment(s: Solver, instance: p.Instance, visibility: str, topology: HostTopology) -> p.Instance:
    """Return ``instance`` with the variables of its devices, the user's ``-x`` winning (PR246)."""
    own = [int(d) for d in instance.devices]
    vendor = _usable(topology)[0].vendor
    every = [d.index for d in _usable(topology)]
    visible = every if visibility == "all" else own
    values = {VARIABLES[vendor][0]: ",".join(map(str, visible)),
              POPDIST_DEVICES: ",".join(str(visible.index(d)) for d in own)}
    if vendor == "nvidia":
        values["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    if visibility == "local-rank-zero":
        values[LOCAL_RANK] = "0"
    from poprun.planner.environment import user_variables

    user = {var.name: origin for var, origin, _ in user_variables(s.spec)}
    env = dict(instance.env.set)
    for name, value in values.items():
        if name in user or name in instance.env.forward:
            _warn_user(s, name, value, user.get(name))
            continue
        env[name] = value
    for name in FILTERS:
        if name in user and name not in values:
            _warn_user(s, name, "", user[name])
    return evolve(instance, env=evolve(instance.env, set=tuple(sorted(env.items()))))


def _warn_user(s: Solver, name: str, value: str, origin: SourceSpan | None) -> None:
    """PR246 (once per variable): a ``-x`` of a variable the devices set, or of another filter of them."""
    if any(d.code == "PR246" and d.hint.startswith(f"remove -x {name} ") for d in s.diags.warnings):
        return
    what = (f"poprun sets {name} from the devices it assigns ('{value}' for one instance)" if value
            else f"{name} filters the devices an instance sees, on top of what poprun sets")
    s.warn("PR246", "-x of a device variable", span=origin or s.origin("devices_per_instance"),
           detail=f"{what}; the instances get the -x value instead, as explain shows",
           hint=f"remove -x {name} unless the program must see other devices than those planned "
                "(--device-visibility all shows every device of the host)")


# -- explain -----------------------------------------------------------------------------
def _explain_host(s: Solver, host: str, topology: HostTopology, devices: tuple[Device, ...], *, count: int, per: int,
                  crossing: list[int]) -> None:
    """Record what ``host`` has and how its instances got their devices; PR245 for each instance (by index) that crosses nodes."""
    by_node: dict[int, list[int]] = {}
    for d in devices:
        by_node.setdefault(d.numa_node, []).append(d.index)
    nodes = ", ".join(f"NUMA {n if n >= 0 else '?'}: {cpulist(tuple(i))}" for n, i in sorted(by_node.items()))
    vendor = VENDOR_NAMES.get(devices[0].vendor, devices[0].vendor)
    s.decide(f"devices.{host}", f"{len(devices)} {vendor} from {topology.device_source or 'sysfs'}",
             SourceSpan.derived("devices"), f"{nodes}; {count} instance{'s' if count > 1 else ''} of {per}, "
             "each given devices of one NUMA node where one holds them, spread over the nodes in order")
    for index in crossing:
        s.warn("PR245", "devices across NUMA nodes", span=s.origin("devices_per_instance"),
               detail=f"instance {index} (on {host}) gets devices on more than one NUMA node: "
                      f"{count} instances of {per} do not divide evenly into {host}'s nodes ({nodes})",
               hint=f"use a number of instances per host whose devices each fit one node (with --devices-per-instance "
                    f"{per}, {sum(len(i) // per for i in by_node.values())} of them on {host}), or accept the slower "
                    "link between the nodes")


def _explain_visibility(s: Solver, visibility: str, variables: tuple[str, ...]) -> None:
    shown = ", ".join(variables)
    reasons = {
        "own": f"{shown}: only the instance's devices; the program numbers them from 0 (POPDIST_DEVICES), "
               "LOCAL_RANK keeps its meaning",
        "local-rank-zero": f"{shown}: only the instance's devices, and LOCAL_RANK=0 so that cuda:LOCAL_RANK is its "
                           "first device (torchrun's --virtual-local-rank)",
        "all": f"{shown}: every device of the host; POPDIST_DEVICES names the instance's own among them",
    }
    s.decide("devices.variables", shown, SourceSpan.derived("devices"), reasons[visibility])

