"""An offline launch planned for remote hosts runs every instance here: a PyTorch process group meets at localhost."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ports import free_port_pair

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

PY = sys.executable
PROGRAM = """
import datetime, json, os

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))
total = torch.tensor([dist.get_rank() + 1.0])
dist.all_reduce(total)
dist.destroy_process_group()
print(json.dumps({"rank": int(os.environ["RANK"]), "master": os.environ["MASTER_ADDR"], "total": total.item()}))
"""


def test_offline_launch_for_remote_hosts_meets_on_this_machine(tmp_path: Path) -> None:
    """--offline-mode=1 --host=pod1,pod2: MASTER_ADDR is localhost, so torch's process group forms, not hangs."""
    program = tmp_path / "meet.py"
    program.write_text(PROGRAM)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POPDIST_", "MASTER_", "POPRUN_"))}

    done = subprocess.run([PY, "-m", "poprun.cli.main", "--offline-mode=1", "--host=pod1,pod2", "--num-instances=2",
                           "--num-replicas=2", PY, str(program)], cwd=tmp_path,
                          env=env | {"MASTER_PORT": str(free_port_pair())}, capture_output=True, text=True, timeout=80,
                          check=False)

    assert 0 == done.returncode, done.stderr
    assert [{"rank": i, "master": "localhost", "total": 3.0} for i in range(2)] == sorted(
        (json.loads(line) for line in done.stdout.splitlines()), key=lambda r: r["rank"])
