"""
Devices end to end on this machine: each instance sees the devices, LOCAL_RANK and CPUs its plan gives it.

No GPU can exist here, so the hosts' devices come from a recorded topology (docs/devices.md): the
recorded HGX H100 server itself (its CPUs are not this machine's, so placement is disabled), and
the same eight GPUs on this machine's own CPUs split into two NUMA nodes (a topology file as
'python3 -m poprun.planner.machine' writes it), where each instance's real affinity
(os.sched_getaffinity) must be its devices' node's CPUs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from poprun.core.record import evolve
from poprun.planner.machine import HostTopology, NumaNode, load, parse_cpulist, to_json

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PROBE = ("import os, json, popdist; print(json.dumps([int(os.environ['POPDIST_INSTANCE_INDEX']), "
         "os.environ.get('CUDA_VISIBLE_DEVICES'), os.environ.get('LOCAL_RANK'), list(popdist.devices()), "
         "sorted(os.sched_getaffinity(0))]))")
CPUS = sorted(os.sched_getaffinity(0))


def poprun(*args: str, cwd: Path, topology: str) -> subprocess.CompletedProcess[str]:
    """Run the CLI with POPRUN_HOST_TOPOLOGY=topology."""
    env = {**os.environ, "POPRUN_HOST_TOPOLOGY": topology}
    return subprocess.run([sys.executable, "-m", "poprun.cli.main", *args], cwd=cwd, capture_output=True, text=True,
                          env=env, timeout=90, check=False)


def planned_and_seen(*args: str, cwd: Path, topology: str) -> tuple[dict, dict]:
    """Return each instance's (devices, CPUs) as planned, and (CUDA_VISIBLE_DEVICES, LOCAL_RANK, popdist.devices(), CPUs) as run."""
    plan = poprun("plan", "--format", "json", *args, sys.executable, "-c", PROBE, cwd=cwd, topology=topology)
    assert 0 == plan.returncode, plan.stderr
    planned = {i["index"]: (i["devices"], i["env"].get("CUDA_VISIBLE_DEVICES"), i["env"].get("LOCAL_RANK"),
                            list(parse_cpulist(i["placement"]["cpus"]))) for i in json.loads(plan.stdout)["instances"]}
    ran = poprun(*args, sys.executable, "-c", PROBE, cwd=cwd, topology=topology)
    assert 0 == ran.returncode, ran.stderr
    seen = {index: rest for index, *rest in map(json.loads, ran.stdout.splitlines())}
    return planned, seen


def this_machine_with_eight_gpus(folder: Path) -> str:
    """Write this machine's CPUs as two NUMA nodes (one if it has one CPU) with the HGX H100's eight GPUs, four a node."""
    halves = [CPUS[: len(CPUS) // 2], CPUS[len(CPUS) // 2:]] if len(CPUS) > 1 else [CPUS]
    nodes = tuple(NumaNode(n, n, tuple((c,) for c in cpus)) for n, cpus in enumerate(halves))
    gpus = tuple(evolve(d, numa_node=d.index * len(nodes) // 8) for d in load("hgx-h100-8gpu-2x-xeon-8480").devices)
    path = folder / "here-with-eight-gpus.json"
    path.write_text(to_json(HostTopology(name="here-with-eight-gpus", numa_nodes=nodes, devices=gpus)))
    return str(path)


def test_eight_instances_each_see_their_gpu_and_run_on_its_nodes_cpus(tmp_path: Path) -> None:
    """--devices-per-instance 1, 8 instances: instance i sees GPU i, LOCAL_RANK i, and runs on GPU i's node's CPUs."""
    topology = this_machine_with_eight_gpus(tmp_path)
    halves = [CPUS[: len(CPUS) // 2], CPUS[len(CPUS) // 2:]] if len(CPUS) > 1 else [CPUS, CPUS]

    planned, seen = planned_and_seen("--num-instances", "8", "--num-replicas", "8", "--devices-per-instance", "1",
                                     cwd=tmp_path, topology=topology)

    assert {i: ([str(i)], str(i), str(i), halves[i // 4]) for i in range(8)} == planned
    assert {i: [str(i), str(i), [0], halves[i // 4]] for i in range(8)} == seen


def test_local_rank_zero_on_the_recorded_server(tmp_path: Path) -> None:
    """The recorded HGX H100 (its CPUs not here: placement disabled): 4 x 2 GPUs, each sees its two, LOCAL_RANK 0."""
    planned, seen = planned_and_seen("--num-instances", "4", "--num-replicas", "4", "--devices-per-instance", "2",
                                     "--device-visibility", "local-rank-zero", "--process-placement", "disabled",
                                     cwd=tmp_path, topology="hgx-h100-8gpu-2x-xeon-8480")

    expected = {0: "0,1", 1: "2,3", 2: "4,5", 3: "6,7"}
    assert {i: [v, "0", [0, 1], CPUS] for i, v in expected.items()} == seen
    assert {i: (v.split(","), v, "0", []) for i, v in expected.items()} == planned


def test_all_visible_names_each_instances_own_among_the_hosts(tmp_path: Path) -> None:
    """--device-visibility all: every instance sees GPUs 0-7; popdist.devices() is its own pair among them."""
    _, seen = planned_and_seen("--num-instances", "2", "--num-replicas", "2", "--devices-per-instance", "2",
                               "--device-visibility", "all", "--process-placement", "disabled",
                               cwd=tmp_path, topology="hgx-h100-8gpu-2x-xeon-8480")

    assert {0: ["0,1,2,3,4,5,6,7", "0", [0, 1], CPUS], 1: ["0,1,2,3,4,5,6,7", "1", [4, 5], CPUS]} == seen


def test_asking_for_more_gpus_than_the_server_has_starts_nothing(tmp_path: Path) -> None:
    """3 x 4 GPUs on the 8-GPU server: PR241, status 2, no instance output."""
    marker = tmp_path / "started"
    ran = poprun("--num-instances", "3", "--num-replicas", "3", "--devices-per-instance", "4", "touch", str(marker),
                 cwd=tmp_path, topology="hgx-h100-8gpu-2x-xeon-8480")

    assert (2, False) == (ran.returncode, marker.exists())
    assert "error[PR241]" in ran.stderr
