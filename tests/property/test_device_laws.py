"""Laws of the device assignment: exact counts, no device twice, NUMA-near when it can be, variables agree with the record."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from poprun.core.record import evolve
from poprun.planner.context import Context
from poprun.planner.devices import split
from poprun.planner.flags import parse_flags
from poprun.planner.machine import Device, HostTopology, NumaNode, cpulist
from poprun.planner.solve import solve


@st.composite
def hosts(draw: st.DrawFn) -> tuple[tuple[Device, ...], int, int]:
    """A host's devices over 1-4 NUMA nodes (some of an unknown node), and a feasible (instances, per instance)."""
    per_node = draw(st.lists(st.integers(0, 8), min_size=1, max_size=4))
    unknown = draw(st.integers(0, 2))
    nodes = [n for n, count in enumerate(per_node) for _ in range(count)] + [-1] * unknown
    if not nodes:
        nodes = [0]
    order = draw(st.permutations(nodes))  # bus order need not follow the nodes
    devices = tuple(Device(index=k, vendor="nvidia", bus_id=f"0000:{k + 1:02x}:00.0", numa_node=node)
                    for k, node in enumerate(order))
    per = draw(st.integers(1, len(devices)))
    count = draw(st.integers(1, len(devices) // per))
    return devices, count, per


@given(hosts())
@settings(max_examples=300, deadline=None)
def test_every_instance_gets_exactly_its_devices_and_none_twice(host: tuple[tuple[Device, ...], int, int]) -> None:
    """count instances of per devices: per each, all distinct, all of the host."""
    devices, count, per = host

    chosen, _ = split(devices, count, per)

    assert count == len(chosen)
    assert all(len(own) == per for own in chosen)
    flat = [d.bus_id for own in chosen for d in own]
    assert len(flat) == len(set(flat))
    assert set(flat) <= {d.bus_id for d in devices}


@given(hosts())
@settings(max_examples=300, deadline=None)
def test_numa_near_whenever_the_known_nodes_hold_every_instance(host: tuple[tuple[Device, ...], int, int]) -> None:
    """When the known nodes hold count whole instances of per, every instance's devices share one known node; none is called crossing then."""
    devices, count, per = host
    holds = sum(len([d for d in devices if d.numa_node == n]) // per for n in {d.numa_node for d in devices} if n >= 0)

    chosen, crossing = split(devices, count, per)

    if holds >= count:
        assert all(len({d.numa_node for d in own}) == 1 and own[0].numa_node >= 0 for own in chosen)
        assert [] == crossing
    else:
        assert all(len({d.numa_node for d in own}) == 1 for k, own in enumerate(chosen) if k < holds)


@given(hosts(), st.sampled_from(["own", "local-rank-zero", "all"]))
@settings(max_examples=60, deadline=None)
def test_the_variables_agree_with_the_record(host: tuple[tuple[Device, ...], int, int], visibility: str) -> None:
    """Solved on such a host: CUDA_VISIBLE_DEVICES, POPDIST_DEVICES and LOCAL_RANK say what Instance.devices records."""
    devices, count, per = host
    cpus = [(c,) for c in range(16)]
    topology = HostTopology(name="h", numa_nodes=(NumaNode(0, 0, tuple(cpus[:4])), NumaNode(1, 0, tuple(cpus[4:8])),
                                                  NumaNode(2, 1, tuple(cpus[8:12])), NumaNode(3, 1, tuple(cpus[12:]))),
                            devices=devices, device_source="sysfs")
    ctx = Context(environ={}, cwd="/work", local_names=("localhost",), probe=lambda: evolve(topology, device_source=""),
                  device_probe=lambda t: evolve(t, devices=devices, device_source="sysfs"))
    argv = [f"--num-instances={count}", f"--num-replicas={count}", f"--devices-per-instance={per}",
            f"--device-visibility={visibility}", "--offline-mode=1", "python3", "t.py"]

    plan = solve(parse_flags(argv).spec, ctx).plan

    every = ",".join(str(d.index) for d in devices)
    for instance in plan.instances:
        own = [int(d) for d in instance.devices]
        visible = [int(v) for v in (instance.env.get("CUDA_VISIBLE_DEVICES") or "").split(",")]
        assert visible == (own if visibility != "all" else [int(v) for v in every.split(",")])
        assert [visible[int(p)] for p in (instance.env.get("POPDIST_DEVICES") or "").split(",")] == own
        assert instance.env.get("LOCAL_RANK") == ("0" if visibility == "local-rank-zero" else str(instance.local_index))
        nodes = sorted({d.numa_node for d in devices if str(d.index) in instance.devices and d.numa_node >= 0})
        if nodes:
            assert instance.placement.numa_nodes == cpulist(tuple(nodes))  # spreadnuma: bound to its devices' nodes
