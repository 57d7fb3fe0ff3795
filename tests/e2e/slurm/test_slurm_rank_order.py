"""
Rank order inside a real Slurm allocation: Slurm's topology read, instance i on its planned host (slurm, mpirun).

The test cluster has ``TopologyPlugin=topology/tree`` and the topology.conf of
:func:`tests.testhosts.slurm_topology`: leaf1 holds h2, leaf2 holds h1 and h3, under one spine,
so the topology order (h2, h1, h3) differs from the given (the allocation's h1, h2, h3) and the
natural one.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.e2e.hosts.test_ssh_backend import PROBE
from tests.e2e.slurm.test_slurm_backend import POPRUN, PY, environ, salloc, values
from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

ORDER = ["h2", "h2", "h1", "h1", "h3", "h3"]  # instance i's host under the cluster's topology, 2 per host
GROUPS = [{"name": "leaf1", "hosts": ["h2"], "parents": ["spine"]},
          {"name": "leaf2", "hosts": ["h1", "h3"], "parents": ["spine"]}]


def planned(stdout: str) -> dict[str, object]:
    """Return what a JSON plan says of the order: the hosts, each instance's host and group, the groups."""
    plan = json.loads(stdout)
    return {"hosts": plan["topology"]["hosts"], "instances": [(i["host"], i.get("group")) for i in plan["instances"]],
            "groups": plan["rank_order"]["groups"], "kind": plan["rank_order"]["kind"]}


def test_scontrol_show_topology_is_what_the_cluster_was_given(slurm_hosts: TestHosts) -> None:
    """The cluster's own answer, as the plan reads it inside an allocation: two leaves under a spine."""
    done = subprocess.run(["scontrol", "show", "topology"], capture_output=True, text=True, env=environ(slurm_hosts),
                          timeout=30, check=False)

    assert 0 == done.returncode, done.stderr
    assert ["SwitchName=leaf1", "SwitchName=leaf2", "SwitchName=spine"] == [line.split()[0] for line in
                                                                            done.stdout.splitlines()]


def test_plan_inside_the_allocation_groups_the_hosts_by_slurms_switches(slurm_hosts: TestHosts, tmp_path: Path) -> None:
    """poprun plan --rank-order topology, no file: scontrol show topology is read; explain shows each group."""
    as_json = salloc(slurm_hosts, "plan", "--rank-order", "topology", "--num-replicas", "6", "--format", "json", "true",
                     cwd=tmp_path)
    explained = salloc(slurm_hosts, "plan", "--rank-order", "topology", "--num-replicas", "6", "--explain", "true",
                       cwd=tmp_path)

    assert 0 == as_json.returncode, as_json.stderr
    assert {"hosts": ["h2", "h1", "h3"], "instances": [(h, "leaf1" if h == "h2" else "leaf2") for h in ORDER],
            "groups": GROUPS, "kind": "tree"} == planned(as_json.stdout)
    assert "scontrol show topology" == json.loads(as_json.stdout)["rank_order"]["source"]
    assert 0 == explained.returncode, explained.stderr
    assert "rank order: topology, from scontrol show topology (2 groups" in explained.stdout
    assert "  leaf1  h2      0-1        spine\n  leaf2  h[1,3]  2-5        spine\n" in explained.stdout


def test_the_same_file_outside_the_allocation_gives_the_same_plan(slurm_hosts: TestHosts, tmp_path: Path) -> None:
    """The cluster's topology.conf given with --network-topology, outside any allocation: the same order and groups."""
    assert slurm_hosts.slurm_conf is not None
    inside = salloc(slurm_hosts, "plan", "--rank-order", "topology", "--num-replicas", "6", "--format", "json", "true",
                    cwd=tmp_path)
    outside = subprocess.run([*POPRUN, "plan", "-H", "h[1-3]", "--num-instances", "6", "--num-replicas", "6",
                              "--backend", "slurm", "--network-topology", str(slurm_hosts.slurm_conf.parent / "topology.conf"),
                              "--format", "json", "true"], cwd=tmp_path, capture_output=True, text=True,
                             env=environ(slurm_hosts), timeout=60, check=False)

    assert 0 == inside.returncode, inside.stderr
    assert 0 == outside.returncode, outside.stderr
    assert planned(inside.stdout) == planned(outside.stdout)


@pytest.mark.parametrize("backend", ["slurm", "mpirun"])
def test_instance_i_runs_on_its_planned_host(slurm_hosts: TestHosts, tmp_path: Path, backend: str) -> None:
    """A run in the topology order: each instance prints its host and POPDIST_INSTANCE_INDEX; both follow the plan."""
    env = {k: v for k, v in environ(slurm_hosts).items() if k not in ("OMPI_MCA_plm_rsh_args", "POPRUN_SSH_CONFIG")}
    done = salloc(slurm_hosts, "--backend", backend, "--rank-order", "topology", "--num-replicas", "6",
                  PY, "-c", PROBE, cwd=tmp_path, env=env)

    assert 0 == done.returncode, done.stderr
    assert [(h, i) for i, h in enumerate(ORDER)] == [(v["host"], v["index"]) for v in values(done.stdout)]


def test_mpirun_in_the_allocation_follows_hosts_listed_out_of_order(slurm_hosts: TestHosts, tmp_path: Path) -> None:
    """-H h3,h1,h2 in the given order under mpirun through Slurm: rank i on the i-th listed host (OpenMPI took -H badly)."""
    env = {k: v for k, v in environ(slurm_hosts).items() if k not in ("OMPI_MCA_plm_rsh_args", "POPRUN_SSH_CONFIG")}
    done = salloc(slurm_hosts, "--backend", "mpirun", "-H", "h3,h1,h2", "--num-instances", "6", "--num-replicas", "6",
                  PY, "-c", PROBE, cwd=tmp_path, env=env)

    assert 0 == done.returncode, done.stderr
    assert [("h3", 0), ("h3", 1), ("h1", 2), ("h1", 3), ("h2", 4), ("h2", 5)] == [
        (v["host"], v["index"]) for v in values(done.stdout)]
