"""MASTER_ADDR inside a real Slurm allocation whose node names only Slurm knows: instances meet at the NodeAddr."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

from tests.e2e.hosts.test_master_addr import PROGRAM
from tests.e2e.slurm.test_slurm_backend import environ, salloc
from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def test_instances_on_slurm_nodes_meet_at_the_first_nodes_address(slurm_hosts: TestHosts, tmp_path: Path) -> None:
    """salloc -N3, 6 instances: MASTER_ADDR is h1's NodeAddr, and gloo and popdist meet across the nodes."""
    program = tmp_path / "meet.py"
    program.write_text(PROGRAM)
    env = environ(slurm_hosts, MASTER_PORT=str(random.randrange(20000, 30000)))  # noqa: S311 - a port, not a secret

    done = salloc(slurm_hosts, "--num-replicas", "6", sys.executable, str(program), cwd=tmp_path, env=env, timeout=90)

    assert 0 == done.returncode, done.stderr
    records = sorted((json.loads(line) for line in done.stdout.splitlines()), key=lambda r: r["index"])
    assert [{"index": i, "master": slurm_hosts.addresses["h1"], "total": 21.0, "popdist": "tcp"}
            for i in range(6)] == records
    assert "PR309" not in done.stderr
