"""Placement on remote hosts: the ssh and mpirun backends bind each instance to its planned CPUs."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from poprun.planner.machine import discover, parse_cpulist, to_json
from poprun.planner.placement import place
from tests.e2e.hosts.test_ssh_backend import poprun
from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PROBE = "import os, json; print(json.dumps([int(os.environ['POPDIST_INSTANCE_INDEX']), sorted(os.sched_getaffinity(0))]))"


@pytest.mark.parametrize("backend", ["ssh", "mpirun"])
def test_remote_instances_run_on_their_planned_cpus(test_hosts: TestHosts, tmp_path: Path, backend: str) -> None:
    """The hosts' topology given as a file (they are this machine's namespaces): each instance's affinity is the plan's."""
    (tmp_path / "host.json").write_text(to_json(discover()))
    strategy = "close" if len(os.sched_getaffinity(0)) >= 2 else "spreadnuma"  # close needs a core each
    args = ["--backend", backend, "--host", "h1,h2", "--num-instances", "4", "--num-replicas", "4",
            "--process-placement", strategy]
    env = {"POPRUN_HOST_TOPOLOGY": str(tmp_path / "host.json")}
    planned = poprun(test_hosts, "plan", "--format", "json", *args, sys.executable, "-c", PROBE, cwd=tmp_path, env=env)
    assert 0 == planned.returncode, planned.stderr
    expected = {i["index"]: list(parse_cpulist(i["placement"]["cpus"])) for i in json.loads(planned.stdout)["instances"]}

    done = poprun(test_hosts, *args, sys.executable, "-c", PROBE, cwd=tmp_path, env=env)

    assert 0 == done.returncode, done.stderr
    assert expected == dict(json.loads(line) for line in done.stdout.splitlines())
    assert all(expected.values())


def test_a_launch_reads_the_hosts_topologies_through_ssh(test_hosts: TestHosts, tmp_path: Path) -> None:
    """No POPRUN_HOST_TOPOLOGY: the launch reads each host's topology over ssh and binds as placement says."""
    strategy = "close" if len(os.sched_getaffinity(0)) >= 2 else "spreadnuma"  # close needs a core each
    expected_per_host = [list(b.cpus) for b in place(discover(), 2, strategy)]

    done = poprun(test_hosts, "-vv", "--host", "h1,h2", "--num-instances", "4", "--num-replicas", "4",
                  "--process-placement", strategy, sys.executable, "-c", PROBE, cwd=tmp_path)

    assert 0 == done.returncode, done.stderr
    assert {i: expected_per_host[i % 2] for i in range(4)} == dict(json.loads(line) for line in done.stdout.splitlines())
