"""Devices on remote hosts: read through the real ssh probe at launch, and each instance sees what its plan gives it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from poprun.core.record import evolve
from poprun.planner.machine import discover, load, parse_cpulist, to_json
from tests.e2e.hosts.test_ssh_backend import poprun
from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

PROBE = ("import os, json, popdist; print(json.dumps([int(os.environ['POPDIST_INSTANCE_INDEX']), "
         "os.environ.get('CUDA_VISIBLE_DEVICES'), os.environ.get('LOCAL_RANK'), list(popdist.devices()), "
         "sorted(os.sched_getaffinity(0))]))")


def test_a_launch_reads_the_hosts_devices_through_ssh(test_hosts: TestHosts, tmp_path: Path) -> None:
    """No POPRUN_HOST_TOPOLOGY: the launch's probe runs the device script on each host; these have no GPU: PR243, nothing started."""
    marker = tmp_path / "started"

    done = poprun(test_hosts, "--host", "h1,h2", "--num-instances", "2", "--num-replicas", "2",
                  "--devices-per-instance", "1", "touch", str(marker), cwd=tmp_path)

    assert (2, False) == (done.returncode, marker.exists()), done.stderr
    assert "error[PR243]" in done.stderr
    assert "h1 has no NVIDIA or AMD GPU (its devices as read from probe: none)" in done.stderr


@pytest.mark.parametrize("backend", ["ssh", "mpirun"])
def test_remote_instances_see_their_devices_and_run_on_their_devices_cpus(test_hosts: TestHosts, tmp_path: Path,
                                                                         backend: str) -> None:
    """The hosts described as this machine with eight GPUs over its NUMA nodes: each remote instance's variables and affinity are the plan's."""
    here = discover()
    nodes = [n.index for n in here.numa_nodes]
    gpus = tuple(evolve(d, numa_node=nodes[d.index * len(nodes) // 8]) for d in load("hgx-h100-8gpu-2x-xeon-8480").devices)
    (tmp_path / "host.json").write_text(to_json(evolve(here, name="gpu-host", devices=gpus)))
    args = ["--backend", backend, "--host", "h1,h2", "--num-instances", "4", "--num-replicas", "4",
            "--devices-per-instance", "2"]
    env = {"POPRUN_HOST_TOPOLOGY": str(tmp_path / "host.json")}
    planned = poprun(test_hosts, "plan", "--format", "json", *args, sys.executable, "-c", PROBE, cwd=tmp_path, env=env)
    assert 0 == planned.returncode, planned.stderr
    instances = json.loads(planned.stdout)["instances"]

    done = poprun(test_hosts, *args, sys.executable, "-c", PROBE, cwd=tmp_path, env=env)

    assert 0 == done.returncode, done.stderr
    seen = {index: rest for index, *rest in map(json.loads, done.stdout.splitlines())}
    expected = {i["index"]: [i["env"]["CUDA_VISIBLE_DEVICES"], i["env"]["LOCAL_RANK"], [0, 1],
                             list(parse_cpulist(i["placement"]["cpus"]))] for i in instances}
    assert expected == seen
    assert all(cpus for *_, cpus in seen.values())
    assert [["0", "1"], ["4", "5"] if len(nodes) > 1 else ["2", "3"]] * 2 == [i["devices"] for i in instances]
