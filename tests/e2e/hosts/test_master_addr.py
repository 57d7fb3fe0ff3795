"""
MASTER_ADDR on real hosts named only by ssh_config: a PyTorch process group and popdist meet across them.

The test hosts ``h1..h4`` are ssh_config aliases (``Host h1`` / ``HostName 10.77.X.11``) that
nothing else resolves, as hosts often are. Their instances must meet at an address, not at the alias.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PY = sys.executable
PROGRAM = """
import datetime, json, os

import torch
import torch.distributed as dist

import popdist

# The hosts' own names do not resolve either: gloo is told its interface, as under torchrun.
os.environ["GLOO_SOCKET_IFNAME"] = "eth0"
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))
total = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(total)
dist.destroy_process_group()
popdist.init(timeout_s=20)
popdist.barrier()
print(json.dumps({"index": popdist.getInstanceIndex(), "master": os.environ["MASTER_ADDR"],
                  "total": total.item(), "popdist": popdist.backend_name()}), flush=True)
popdist.finalize()
"""


def test_instances_on_hosts_named_by_ssh_config_meet_at_instance_0(test_hosts: TestHosts, tmp_path: Path) -> None:
    """h1,h2 (aliases only ssh_config knows): MASTER_ADDR is h1's address, and gloo and popdist meet across hosts."""
    program = tmp_path / "meet.py"
    program.write_text(PROGRAM)
    env = os.environ | test_hosts.env() | {"MASTER_PORT": str(random.randrange(20000, 30000))}  # noqa: S311

    done = subprocess.run([PY, "-m", "poprun.cli.main", "--host", "h1,h2", "--num-instances", "4",
                           "--num-replicas", "4", PY, str(program)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=90, check=False)

    assert 0 == done.returncode, done.stderr
    records = sorted((json.loads(line) for line in done.stdout.splitlines()), key=lambda r: r["index"])
    assert [{"index": i, "master": test_hosts.addresses["h1"], "total": 10.0, "popdist": "tcp"}
            for i in range(4)] == records
    assert "PR309" not in done.stderr
