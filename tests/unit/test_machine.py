"""Host topologies: sysfs discovery, files, CPU lists, and the recorded servers."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from poprun.planner.machine import (
    DUMP_SCRIPT,
    RECORDED,
    HostTopology,
    NumaNode,
    cpulist,
    discover,
    from_dump,
    load,
    parse_cpulist,
    to_json,
)
from poprun.planner.placement import place


@given(st.sets(st.integers(0, 300)))
def test_cpulist_round_trips(cpus: set[int]) -> None:
    """The kernel's list syntax, both ways."""
    assert tuple(sorted(cpus)) == parse_cpulist(cpulist(cpus))


@pytest.mark.parametrize("text", ["0-300000000", "65536", "0-65535,0-65535", "5-3", "-1"])
def test_a_cpu_list_beyond_the_kernels_cpus_is_refused_at_once(text: str) -> None:
    """A forged probe answer's '0-300000000' filled memory (the kernel killed poprun); now a ValueError, as from_dump expects."""
    with pytest.raises(ValueError, match=r"not a CPU list|invalid literal"):
        parse_cpulist(text)


def test_a_probe_answer_with_an_absurd_cpu_list_is_no_topology_not_a_kill() -> None:
    """The lines with such lists are skipped (as any line that does not read), the rest is the topology."""
    topology = from_dump("h", "node 0 0-300000000\ncpu 5 0 0\nCpus_allowed_list: 0-4000000000\n")
    assert ((5,), None) == (topology.numa_nodes[0].cpus, topology.cpuset)
    topology = from_dump("h", "node 0 0-3\ncpu 0 0 0\npci 0000:1b:00.0 0x10de 0x030200 0x2330 - 0-900000000\n")
    assert (-1, 1) == (topology.devices[0].numa_node, len(topology.devices))


def test_cpulist_is_the_kernels_syntax() -> None:
    """Runs are joined with '-', pieces with ','."""
    assert ("0-3,8,10-11", "") == (cpulist({0, 1, 2, 3, 8, 10, 11}), cpulist(set()))


def fake_sysfs(root: Path) -> Path:
    """Write a 2-node, 2-socket, 4-core, 2-thread machine's sysfs under ``root``."""
    cpu = root / "devices/system/cpu"
    cpu.mkdir(parents=True)
    (cpu / "online").write_text("0-7\n")
    for n, cpus in ((0, "0-1,4-5"), (1, "2-3,6-7")):
        node = root / f"devices/system/node/node{n}"
        node.mkdir(parents=True)
        (node / "cpulist").write_text(cpus + "\n")
    for c in range(8):
        topo = cpu / f"cpu{c}/topology"
        topo.mkdir(parents=True)
        (topo / "physical_package_id").write_text(f"{(c % 4) // 2}\n")
        (topo / "core_id").write_text(f"{c % 4}\n")
    return root


def test_discover_reads_nodes_sockets_cores_and_the_cpuset(tmp_path: Path) -> None:
    """Nodes from node*/cpulist, cores from core_id (threads together), Mems_allowed_list from status."""
    status = tmp_path / "status"
    status.write_text("Name:\tx\nMems_allowed_list:\t0-1\n")

    found = discover(sys_root=str(fake_sysfs(tmp_path)), status=str(status), name="fake")

    assert (NumaNode(0, 0, ((0, 4), (1, 5))), NumaNode(1, 1, ((2, 6), (3, 7)))) == found.numa_nodes
    assert ("fake", (0, 1)) == (found.name, found.mems)


def test_discover_without_numa_sysfs_is_one_node(tmp_path: Path) -> None:
    """No devices/system/node: one NUMA node of every online CPU."""
    (tmp_path / "devices/system/cpu").mkdir(parents=True)
    (tmp_path / "devices/system/cpu/online").write_text("0-1\n")

    assert [0] == [n.index for n in discover(sys_root=str(tmp_path), status=str(tmp_path / "none")).numa_nodes]


def test_this_machine_is_discovered_with_its_cpuset() -> None:
    """The real sysfs: every CPU this process may use is in a node."""
    found = discover()

    assert found.cpuset is not None
    assert set(found.cpuset) <= {c for n in found.numa_nodes for c in n.cpus}


@pytest.mark.parametrize("name", RECORDED)
def test_recorded_topologies_load_and_round_trip(name: str, tmp_path: Path) -> None:
    """Each shipped topology loads, and to_json writes what load reads back."""
    topology = load(name)
    (tmp_path / "t.json").write_text(to_json(topology))

    assert topology == load(str(tmp_path / "t.json"))


def test_pod64_host_server_has_two_sockets_of_four_numa_nodes() -> None:
    """The IPU-POD64 host server: 2 x EPYC 7742, NPS4, SMT: 8 nodes, 128 cores, 256 CPUs."""
    topology = load("dell-r6525-2x-epyc-7742")

    assert ((0, 1), 8, 128, 256) == (topology.sockets, len(topology.numa_nodes),
                                      sum(len(n.cores) for n in topology.numa_nodes),
                                      sum(len(n.cpus) for n in topology.numa_nodes))


@pytest.mark.parametrize(("text", "reason"), [("{", "is not a host topology"), ('{"numa_nodes": [{}]}', "KeyError")])
def test_a_bad_file_is_a_one_line_value_error(tmp_path: Path, text: str, reason: str) -> None:
    """Unreadable, not JSON, or missing keys: ValueError naming the file and why."""
    path = tmp_path / "t.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=reason):
        load(str(path))
    with pytest.raises(ValueError, match="cannot read"):
        load(str(tmp_path / "missing.json"))


def test_a_narrowed_cpuset_keeps_only_its_nodes_and_cores() -> None:
    """cpuset {2, 6} on the fake machine: node 1 only, one core (2, 6); spreadnuma binds there."""
    nodes = (NumaNode(0, 0, ((0, 4), (1, 5))), NumaNode(1, 1, ((2, 6), (3, 7))))
    topology = HostTopology(name="narrow", numa_nodes=nodes, cpuset=(2, 6))

    assert (NumaNode(1, 1, ((2, 6),)),) == topology.usable()
    assert [(1,), (1,)] == [b.numa_nodes for b in place(topology, 2, "spreadnuma")]


def test_the_dump_script_run_here_reads_as_discover_does() -> None:
    """DUMP_SCRIPT (what ssh runs on a host) parsed by from_dump gives this machine's nodes and cpuset."""
    out = subprocess.run(["sh", "-c", DUMP_SCRIPT], capture_output=True, text=True, check=False).stdout
    here = discover()

    assert (here.numa_nodes, here.cpuset) == (from_dump("here", out).numa_nodes, from_dump("here", out).cpuset)


def test_a_dump_without_cpus_is_a_value_error() -> None:
    """Nothing readable (not Linux, say): ValueError, so the host is left unbound with the reason."""
    with pytest.raises(ValueError, match="no CPU"):
        from_dump("h9", "sh: 1: grep: not found\n")
