"""Placement end to end on this machine: each instance's real CPU affinity is the plan's, also under a narrower cpuset."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from poprun.planner.machine import parse_cpulist

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

PROBE = "import os, json; print(json.dumps([int(os.environ['POPDIST_INSTANCE_INDEX']), sorted(os.sched_getaffinity(0))]))"
CPUS = sorted(os.sched_getaffinity(0))


def poprun(*args: str, cwd: Path, cpus: list[int] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the CLI (pinned to ``cpus`` with taskset when given, as a cpuset would)."""
    command = [sys.executable, "-m", "poprun.cli.main", *args]
    if cpus is not None:
        command = ["taskset", "-c", ",".join(map(str, cpus)), *command]
    env = {k: v for k, v in os.environ.items() if k != "POPRUN_HOST_TOPOLOGY"}
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, env=env, timeout=30, check=False)


def planned_and_seen(*args: str, cwd: Path, cpus: list[int] | None = None) -> tuple[dict[int, list[int]],
                                                                                     dict[int, list[int]]]:
    """Return {instance: CPUs} as planned (poprun plan --format json) and as each instance saw it."""
    plan = poprun("plan", "--format", "json", *args, sys.executable, "-c", PROBE, cwd=cwd, cpus=cpus)
    assert 0 == plan.returncode, plan.stderr
    planned = {i["index"]: list(parse_cpulist(i["placement"]["cpus"])) for i in json.loads(plan.stdout)["instances"]}
    ran = poprun(*args, sys.executable, "-c", PROBE, cwd=cwd, cpus=cpus)
    assert 0 == ran.returncode, ran.stderr
    return planned, dict(json.loads(line) for line in ran.stdout.splitlines())


@pytest.mark.parametrize("strategy", ["spreadnuma", "close", "scatternuma", "scattersocket"])
def test_each_instance_runs_on_its_planned_cpus(tmp_path: Path, strategy: str) -> None:
    """Two instances on this host: each one's sched_getaffinity equals its planned CPUs."""
    if strategy != "spreadnuma" and len(CPUS) < 2:  # two instances need two cores
        pytest.skip("a core strategy with two instances needs two CPUs")
    planned, seen = planned_and_seen("--process-placement", strategy, "--num-instances", "2", "--num-replicas", "2",
                                     cwd=tmp_path)

    assert planned == seen
    assert all(planned.values())


def test_a_narrower_cpuset_is_never_left(tmp_path: Path) -> None:
    """Under taskset -c <one CPU>: both instances are planned for, and run on, that CPU only."""
    one = [CPUS[-1]]
    planned, seen = planned_and_seen("--num-instances", "2", "--num-replicas", "2", cwd=tmp_path, cpus=one)

    assert {0: one, 1: one} == planned == seen


def test_disabled_placement_binds_nothing(tmp_path: Path) -> None:
    """--process-placement disabled: no planned CPUs, and each instance keeps poprun's whole affinity."""
    planned, seen = planned_and_seen("--process-placement", "disabled", "--num-instances", "2", "--num-replicas", "2",
                                     cwd=tmp_path)

    assert ({0: [], 1: []}, {0: CPUS, 1: CPUS}) == (planned, seen)


@pytest.mark.skipif(shutil.which("numactl") is None, reason="numactl is not installed")
def test_bound_instances_prefer_their_numa_nodes_memory(tmp_path: Path) -> None:
    """spreadnuma: each instance's memory policy prefers its planned NUMA nodes (numactl --show); disabled: default."""
    show = "numactl --show | grep -E '^policy'"
    bound = poprun("--num-instances", "2", "--num-replicas", "2", "sh", "-c", show, cwd=tmp_path)
    free = poprun("--process-placement", "disabled", "--num-instances", "2", "--num-replicas", "2", "sh", "-c", show,
                  cwd=tmp_path)

    assert (0, 0) == (bound.returncode, free.returncode), bound.stderr + free.stderr
    assert {"policy: preferred-many", "policy: preferred"} >= set(bound.stdout.splitlines())
    assert ["policy: default"] * 2 == free.stdout.splitlines()
