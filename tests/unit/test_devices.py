"""Devices per instance: the assignment, the binding that follows it, the variables, explain and the diagnostics."""

from __future__ import annotations

import pytest

from poprun.core.diagnostic import DiagnosticError
from poprun.core.record import evolve
from poprun.planner.context import Context
from poprun.planner.devices import split
from poprun.planner.flags import parse_flags
from poprun.planner.machine import Device, HostTopology, load
from poprun.planner.serde import from_json, to_json
from poprun.planner.solve import solve


def solved(*argv: str, topology: str | HostTopology = "hgx-h100-8gpu-2x-xeon-8480", environ: dict | None = None,
           hosts: tuple[str, ...] = ()):
    """Solve ``argv`` on this machine described as ``topology`` (its devices included); return the solution."""
    given = topology if isinstance(topology, HostTopology) else load(topology)
    ctx = Context(environ={"PATH": "/usr/bin"} | (environ or {}), cwd="/work", local_names=("localhost", *hosts),
                  probe=lambda: evolve(given, device_source=""), device_probe=lambda t: evolve(
                      t, devices=given.devices, device_source="sysfs"))
    return solve(parse_flags([*argv, "python3", "train.py"]).spec, ctx)


def test_eight_instances_of_one_gpu_each_get_their_gpu_and_its_socket() -> None:
    """The issue's plan: instance i has GPU i, CUDA_VISIBLE_DEVICES=i, and the CPUs of that GPU's NUMA node."""
    plan = solved("--num-instances=8", "--num-replicas=8", "--devices-per-instance=1").plan

    assert [(str(k),) for k in range(8)] == [i.devices for i in plan.instances]
    assert [str(k) for k in range(8)] == [i.env.get("CUDA_VISIBLE_DEVICES") for i in plan.instances]
    assert {"PCI_BUS_ID"} == {i.env.get("CUDA_DEVICE_ORDER") for i in plan.instances}
    assert ["0"] * 8 == [i.env.get("POPDIST_DEVICES") for i in plan.instances]
    assert [str(k) for k in range(8)] == [i.env.get("LOCAL_RANK") for i in plan.instances]  # own: its meaning kept
    assert ["0-55,112-167"] * 4 + ["56-111,168-223"] * 4 == [i.placement.cpus for i in plan.instances]


def test_two_instances_spread_over_the_sockets_like_spreadnuma() -> None:
    """Two instances of one GPU: GPU 0 on socket 0 and GPU 4 on socket 1, not GPUs 0 and 1 on one socket."""
    plan = solved("--num-instances=2", "--num-replicas=2", "--devices-per-instance=1").plan

    assert [("0",), ("4",)] == [i.devices for i in plan.instances]
    assert ["0", "1"] == [i.placement.numa_nodes for i in plan.instances]


def test_one_instance_alone_is_bound_to_its_gpus_node() -> None:
    """One instance per host: NUMA awareness turns on with devices (it is off alone otherwise), bound to GPU 0's node."""
    plan = solved("--devices-per-instance=1").plan

    assert (("0",), "0", True) == (plan.instances[0].devices, plan.instances[0].placement.numa_nodes,
                                   plan.instances[0].placement.numa_aware)


@pytest.mark.parametrize(("visibility", "visible", "popdist", "local_rank"), [
    ("own", ["2,3", "6,7"], ["0,1", "0,1"], ["0", "1"]),
    ("local-rank-zero", ["2,3", "6,7"], ["0,1", "0,1"], ["0", "0"]),
    ("all", ["0,1,2,3,4,5,6,7"] * 2, ["2,3", "6,7"], ["0", "1"]),
])
def test_visibility_sets_what_each_instance_sees(visibility: str, visible: list, popdist: list, local_rank: list) -> None:
    """own / local-rank-zero / all: CUDA_VISIBLE_DEVICES, POPDIST_DEVICES (as the program numbers them), LOCAL_RANK."""
    plan = solved("--num-instances=4", "--num-replicas=4", "--devices-per-instance=2",
                  f"--device-visibility={visibility}").plan
    odd = plan.instances[1::2]

    assert visible == [i.env.get("CUDA_VISIBLE_DEVICES") for i in odd]
    assert popdist == [i.env.get("POPDIST_DEVICES") for i in odd]
    assert local_rank == [i.env.get("LOCAL_RANK") for i in plan.instances[:2]]


@pytest.mark.parametrize(("strategy", "cpus"), [
    ("close", ["0,112", "1,113", "56,168", "57,169"]),
    ("scatternuma", ["0,112", "1,113", "56,168", "57,169"]),
    ("spreadnuma", ["0-55,112-167", "0-55,112-167", "56-111,168-223", "56-111,168-223"]),
])
def test_the_binding_follows_the_devices_under_each_strategy(strategy: str, cpus: list) -> None:
    """Core strategies take the next free core of the devices' node; spreadnuma the node's CPUs."""
    plan = solved("--num-instances=4", "--num-replicas=4", "--devices-per-instance=2",
                  f"--process-placement={strategy}").plan

    assert cpus == [i.placement.cpus for i in plan.instances]
    assert all("near its devices" in i.placement.reason for i in plan.instances)


@pytest.mark.parametrize("flag", ["--numa-aware=no", "--process-placement=disabled"])
def test_without_binding_the_devices_are_still_assigned(flag: str) -> None:
    """NUMA awareness off or placement disabled: devices as always, CPUs not bound."""
    plan = solved("--num-instances=2", "--num-replicas=2", "--devices-per-instance=1", flag).plan

    assert ([("0",), ("4",)], ["", ""]) == ([i.devices for i in plan.instances], [i.placement.cpus for i in plan.instances])


def test_amd_gpus_get_rocr_visible_devices_only() -> None:
    """AMD: ROCR_VISIBLE_DEVICES, no HIP_VISIBLE_DEVICES (it would index ROCR's renumbered list), no CUDA_DEVICE_ORDER."""
    nodes = load("xeon-2s-2numa").numa_nodes
    mi = tuple(Device(index=k, vendor="amd", bus_id=f"0000:{0x10 + k * 0x20:02x}:00.0", numa_node=k // 2)
               for k in range(4))
    plan = solved("--num-instances=2", "--num-replicas=2", "--devices-per-instance=2",
                  topology=HostTopology(name="mi250", numa_nodes=nodes, devices=mi)).plan

    env = plan.instances[1].env.as_dict()
    assert ("2,3", None, None, None) == (env.get("ROCR_VISIBLE_DEVICES"), env.get("HIP_VISIBLE_DEVICES"),
                                         env.get("CUDA_VISIBLE_DEVICES"), env.get("CUDA_DEVICE_ORDER"))
    assert ("ROCR_VISIBLE_DEVICES",) == plan.devices.variables


def test_the_user_x_wins_with_a_warning_once() -> None:
    """-x CUDA_VISIBLE_DEVICES=7 for every instance: kept, PR246 once; the others poprun sets still set."""
    solution = solved("--num-instances=2", "--num-replicas=2", "--devices-per-instance=1",
                      "--mpi-local-args=-x CUDA_VISIBLE_DEVICES=7 -x HIP_VISIBLE_DEVICES=1")

    assert ["7", "7"] == [i.env.get("CUDA_VISIBLE_DEVICES") for i in solution.plan.instances]
    assert ["0", "0"] == [i.env.get("POPDIST_DEVICES") for i in solution.plan.instances]
    assert ["PR246", "PR246"] == [w.code for w in solution.warnings]


def test_a_saved_plan_with_devices_round_trips_and_one_without_keeps_its_json() -> None:
    """The devices record and each instance's devices survive JSON; a plan without devices has no such key."""
    plan = solved("--num-instances=4", "--num-replicas=4", "--devices-per-instance=2").plan
    plain = solved("--num-instances=4", "--num-replicas=4").plan

    assert plan == from_json(to_json(plan))
    assert '"devices"' not in to_json(plain)
    assert plain == from_json(to_json(plain))


@pytest.mark.parametrize(("argv", "code"), [
    (("--num-instances=3", "--num-replicas=3", "--devices-per-instance=4"), "PR241"),
    (("--num-instances=9", "--num-replicas=9", "--devices-per-instance=1"), "PR241"),
])
def test_impossible_requests_are_errors(argv: tuple, code: str) -> None:
    """More devices than the host has: an error with the nearest numbers."""
    with pytest.raises(DiagnosticError) as raised:
        solved(*argv)
    assert [code] == [d.code for d in raised.value.diagnostics]


def test_a_host_reached_by_ssh_is_probed_and_its_devices_used() -> None:
    """Remote hosts: their topologies from the remote probe (devices included: source probe), read once for placement and devices."""
    calls = []
    hgx = evolve(load("hgx-h100-8gpu-2x-xeon-8480"), device_source="probe")

    def probe(hosts):
        calls.append(hosts)
        return dict.fromkeys(hosts, hgx)

    ctx = Context(environ={"PATH": "/usr/bin"}, cwd="/work", local_names=("localhost",), remote_probe=probe)
    plan = solve(parse_flags(["--host=g1,g2", "--num-instances=4", "--num-replicas=4", "--devices-per-instance=4",
                              "python3", "t.py"]).spec, ctx).plan

    assert [("g1", "g2")] == calls
    assert [("0", "1", "2", "3"), ("4", "5", "6", "7")] * 2 == [i.devices for i in plan.instances]
    assert ["probe", "probe"] == [h.source for h in plan.devices.hosts]


def test_a_host_the_probe_could_not_read_is_pr242_naming_why() -> None:
    """ssh failed on one host: PR242 with the probe's reason."""
    ctx = Context(environ={}, cwd="/work", local_names=("localhost",),
                  remote_probe=lambda hosts: dict.fromkeys(hosts, "Permission denied (publickey)"))
    with pytest.raises(DiagnosticError) as raised:
        solve(parse_flags(["--host=g1", "--devices-per-instance=1", "python3", "t.py"]).spec, ctx)

    assert ["PR242"] == [d.code for d in raised.value.diagnostics]
    assert "Permission denied (publickey)" in raised.value.diagnostics[0].detail


@pytest.mark.parametrize(("per_node", "count", "per", "expected", "crossing"), [
    ((4, 4), 8, 1, [[0], [1], [2], [3], [4], [5], [6], [7]], []),
    ((4, 4), 2, 1, [[0], [4]], []),
    ((4, 4), 3, 2, [[0, 1], [2, 3], [4, 5]], []),
    ((4, 2), 2, 3, [[0, 1, 2], [3, 4, 5]], [1]),
    ((4, 4), 1, 8, [[0, 1, 2, 3, 4, 5, 6, 7]], []),  # more than a node holds: crossing is no choice, no warning
    ((1, 3), 2, 2, [[1, 2], [0, 3]], [1]),  # node 0 holds no pair: its GPU is left for the one that must cross
])
def test_split_keeps_instances_on_one_node_where_one_holds_them(per_node: tuple, count: int, per: int, expected: list,
                                                                 crossing: list) -> None:
    """Whole instances per node, spread in order; the rest from what is left, crossing."""
    devices, k = [], 0
    for node, n in enumerate(per_node):
        for _ in range(n):
            devices.append(Device(index=k, vendor="nvidia", bus_id=f"0000:{k:02x}:00.0", numa_node=node))
            k += 1

    chosen, crossed = split(tuple(devices), count, per)

    assert (expected, crossing) == ([[d.index for d in own] for own in chosen], crossed)


def test_a_device_of_an_unknown_node_leaves_its_instance_bound_by_the_strategy() -> None:
    """NUMA node -1 (not known): the instance keeps the strategy's own binding, and its reason says why."""
    base = load("xeon-2s-2numa")
    gpus = (Device(index=0, vendor="nvidia", bus_id="0000:3b:00.0", numa_node=-1),)
    plan = solved("--devices-per-instance=1", topology=HostTopology(name="vm", numa_nodes=base.numa_nodes,
                                                                     devices=gpus)).plan

    assert plan.instances[0].placement.reason.endswith("its devices' NUMA node is not known")
    assert plan.instances[0].placement.cpus  # spreadnuma's own: both nodes of the one instance


def test_a_plan_without_devices_never_imports_the_device_step() -> None:
    """Start-up: poprun.planner.devices is imported only when devices are asked."""
    import subprocess
    import sys

    code = ("import sys; from poprun.planner.context import Context; from poprun.planner.flags import parse_flags; "
            "from poprun.planner.solve import solve; "
            "solve(parse_flags(['--offline-mode=1', 'python3', 't.py']).spec, Context()); "
            "print('poprun.planner.devices' in sys.modules, 'poprun.planner._devicescheck' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout

    assert "False False" == out.strip()


def test_the_diff_shows_each_instances_devices_and_the_devices_record() -> None:
    """plan --diff: devices in placement per instance, the per-instance count and visibility in their own section."""
    from poprun.render.diff import SECTIONS, diff_plans

    one = solved("--num-instances=2", "--num-replicas=2", "--devices-per-instance=1").plan
    two = solved("--num-instances=2", "--num-replicas=2", "--devices-per-instance=2", "--device-visibility=all").plan

    changes = {(c.section, c.key, c.old, c.new, c.instances) for c in diff_plans(one, two).changes}

    assert {("placement", "devices", "0", "0,1", (0,)), ("placement", "devices", "4", "4,5", (1,)),
            ("devices", "per_instance", 1, 2, ()), ("devices", "visibility", "own", "all", ())} <= changes
    assert "devices" in SECTIONS


def test_the_launching_shells_cuda_visible_devices_keeps_poprun_to_its_gpus() -> None:
    """CUDA_VISIBLE_DEVICES=4,5,6,7 in the shell (a shared machine): the instances get GPUs 4-7 only (they got 0 and 4)."""
    plan = solved("--num-instances=2", "--num-replicas=2", "--devices-per-instance=1",
                  environ={"CUDA_VISIBLE_DEVICES": "4,GPU-6,7,5"}, topology=_with_uuids()).plan

    assert [("4",), ("5",)] == [i.devices for i in plan.instances]
    assert any(d.key == "devices.CUDA_VISIBLE_DEVICES" for d in plan.explanation)


def _with_uuids() -> HostTopology:
    given = load("hgx-h100-8gpu-2x-xeon-8480")
    return evolve(given, devices=tuple(evolve(d, uuid=f"GPU-{d.index}") for d in given.devices))


@pytest.mark.parametrize("value", ["8", "", "4,4", "GPU-6,6", "0,$(id)", "\u0663"])
def test_a_shell_filter_that_names_no_device_of_this_machine_is_pr316(value: str) -> None:
    """A device it lacks, one twice (by index and UUID), none: PR316 alone, nothing planned."""
    with pytest.raises(DiagnosticError) as raised:
        solved("--devices-per-instance=1", environ={"CUDA_VISIBLE_DEVICES": value}, topology=_with_uuids())

    assert ["PR316"] == [d.code for d in raised.value.diagnostics]


def test_a_shell_filter_says_nothing_of_a_described_host() -> None:
    """With POPRUN_HOST_TOPOLOGY the devices are another machine's: the shell's variable is not read."""
    plan = solved("--devices-per-instance=1", environ={"CUDA_VISIBLE_DEVICES": "9",
                                                       "POPRUN_HOST_TOPOLOGY": "hgx-h100-8gpu-2x-xeon-8480"}).plan

    assert ("0",) == plan.instances[0].devices


@pytest.mark.parametrize("strategy", ["close", "scattersocket", "scatternuma"])
@pytest.mark.parametrize("cpuset", [(0,), (56, 57), (0, 112)])
def test_fewer_usable_cores_than_instances_is_pr306_not_a_traceback(strategy: str, cpuset: tuple) -> None:
    """A cpuset of one or two cores (taskset, a container) and 4 single-core instances: PR306 (StopIteration before)."""
    topology = evolve(load("hgx-h100-8gpu-2x-xeon-8480"), cpuset=cpuset)

    with pytest.raises(DiagnosticError) as raised:
        solved("--num-instances=4", "--num-replicas=4", "--devices-per-instance=1", f"--process-placement={strategy}",
               topology=topology)

    assert "PR306" in [d.code for d in raised.value.diagnostics]
