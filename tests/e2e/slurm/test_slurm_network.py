"""The interface collectives use, read on the nodes of a real Slurm allocation (docs/network.md)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.e2e.slurm.test_slurm_backend import environ, salloc
from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PROGRAM = ("import json, os; print(json.dumps({'index': int(os.environ['POPDIST_INSTANCE_INDEX']), "
           "'gloo': os.environ.get('GLOO_SOCKET_IFNAME'), 'nccl': os.environ.get('NCCL_SOCKET_IFNAME')}), flush=True)")


def test_each_node_of_the_allocation_is_read_and_its_instances_get_its_interface(slurm_hosts: TestHosts,
                                                                                  tmp_path: Path) -> None:
    """salloc -N3: each node's route to h1's NodeAddr is read through srun; every instance gets eth0; the run keeps it."""
    runs = tmp_path / "runs"
    env = environ(slurm_hosts, POPRUN_RUNS_DIR=str(runs))

    done = salloc(slurm_hosts, "--num-replicas", "6", sys.executable, "-c", PROGRAM, cwd=tmp_path, env=env, timeout=90)

    assert 0 == done.returncode, done.stderr
    seen = sorted((json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")),
                  key=lambda v: v["index"])
    assert [{"index": i, "gloo": "eth0", "nccl": "eth0"} for i in range(6)] == seen
    (plan_path,) = runs.glob("*/plan.json")
    network = json.loads(plan_path.read_text())["network"]
    h1 = slurm_hosts.addresses["h1"]
    assert [(h["host"], h["interface"], h["how"].split(" -> ")[0]) for h in network["hosts"]] == \
        [(name, "eth0", f"route get {h1}") for name in ("h1", "h2", "h3")]
