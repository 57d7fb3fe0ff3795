"""The conformance suite over the slurm backend, in a real allocation of the test cluster's hosts h1 and h2."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from poprun.backends import conformance
from poprun.backends.slurm.backend import SlurmBackend
from tests.e2e.gate_helpers import check_teardown_awaits_the_gate
from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def allocation(slurm_hosts: TestHosts) -> Iterator[conformance.Target]:
    """Yield a target inside an allocation of h1 and h2 (``salloc --no-shell``), cancelled at the end."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")} | slurm_hosts.env()
    done = subprocess.run(["salloc", "--no-shell", "-N2", "--ntasks-per-node=1", "--nodelist=h1,h2"],
                          capture_output=True, text=True, env=env, timeout=60, check=False)
    granted = re.search(r"Granted job allocation (\d+)", done.stderr)
    assert granted is not None, done.stderr
    job = granted[1]
    try:
        yield conformance.Target(hosts=("h1", "h2"), env=tuple(sorted(
            (slurm_hosts.env() | {"SLURM_JOB_ID": job, "SLURM_JOB_NODELIST": "h[1-2]"}).items())))
    finally:
        subprocess.run(["scancel", job], env=env, capture_output=True, timeout=30, check=False)


@conformance.parametrize(SlurmBackend)
def test_slurm_backend_passes_the_conformance_suite_in_an_allocation(check, allocation: conformance.Target,
                                                                     tmp_path: Path) -> None:
    """Each check that the slurm backend's capabilities allow passes, one instance a task on h1 and on h2."""
    check(SlurmBackend, tmp_path, allocation)


def test_slurm_backend_stops_the_step_only_after_the_gate(allocation: conformance.Target, tmp_path: Path) -> None:
    """Task 1 fails on h2; the backend awaits the gate (launch(gate=)) before scancel reaches task 0 on h1."""
    check_teardown_awaits_the_gate(SlurmBackend(), tmp_path, hosts=allocation.hosts, env=dict(allocation.env))
