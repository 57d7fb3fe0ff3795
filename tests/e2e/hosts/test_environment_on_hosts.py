"""The environment on real ssh hosts: what explain shows is what the instances get, and torch uses the CPUs it may."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PY = sys.executable
PROGRAM = """
import json, os
import torch
print(json.dumps({"index": int(os.environ["POPDIST_INSTANCE_INDEX"]), "threads": torch.get_num_threads(),
                  "cpus": len(os.sched_getaffinity(0)), "mkl_dynamic": os.environ.get("MKL_DYNAMIC"),
                  "ipuof_config": os.environ.get("IPUOF_CONFIG_PATH")}), flush=True)
"""


def test_an_instance_alone_on_a_remote_host_uses_every_cpu_and_gets_the_users_variables(
        test_hosts: TestHosts, tmp_path: Path) -> None:
    """h1,h2 over ssh (CPUs unknown when planning): torch uses every CPU there, and -x IPUOF_CONFIG_PATH arrives."""
    pytest.importorskip("torch")
    program = tmp_path / "show.py"
    program.write_text(PROGRAM)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMP_", "MKL_", "IPUOF_"))} | test_hosts.env()
    command = ["--host", "h1,h2", "--num-instances", "2", "--num-replicas", "2",
               "--mpi-local-args=-x IPUOF_CONFIG_PATH=/etc/ipuof.conf", PY, str(program)]

    plan = subprocess.run([PY, "-m", "poprun.cli.main", "plan", "--explain", *command], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=90, check=False)
    done = subprocess.run([PY, "-m", "poprun.cli.main", *command], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=90, check=False)

    assert 0 == done.returncode, done.stderr
    records = sorted((json.loads(line) for line in done.stdout.splitlines()), key=lambda r: r["index"])
    assert [{"index": i, "threads": r["cpus"], "cpus": r["cpus"], "mkl_dynamic": "FALSE",
             "ipuof_config": "/etc/ipuof.conf"} for i, r in enumerate(records)] == records
    assert "  IPUOF_CONFIG_PATH=/etc/ipuof.conf" in plan.stdout.splitlines()
    assert "  MKL_DYNAMIC=FALSE" in plan.stdout.splitlines()
    assert "removed: IPUOF_CONFIG_PATH" not in plan.stdout
