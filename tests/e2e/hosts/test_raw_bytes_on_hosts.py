"""Bytes that are not UTF-8 in argv and a value reach instances on other hosts exactly, by ssh and by mpirun."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

LATIN1 = os.fsdecode(b"caf\xe9.txt")  # as Python reads the byte 0xe9 from argv: U+DCE9
SHOW = "import os, sys; print(os.environ['POPDIST_INSTANCE_INDEX'], os.fsencode(sys.argv[1]), os.environb.get(b'F'))"


@pytest.mark.parametrize("backend", ["ssh", "mpirun"])
def test_a_latin1_argument_and_value_reach_every_host_exactly(test_hosts: TestHosts, tmp_path: Path,
                                                              backend: str) -> None:
    """Each instance on h1 and h2 prints the argument's and F's bytes as given: 0xe9, not U+FFFD or a crash."""
    done = subprocess.run([sys.executable, "-m", "poprun.cli.main", "--backend", backend, "--host",
                           ",".join(test_hosts.names[:2]), "--num-instances", "2", "--num-replicas", "2",
                           f"--mpi-local-args=-x F={LATIN1}", sys.executable, "-c", SHOW, LATIN1],
                          cwd=tmp_path, capture_output=True, timeout=90, check=False,
                          env=os.environ | test_hosts.env() | {"POPRUN_RUNS_DIR": str(tmp_path / "runs")})

    assert 0 == done.returncode, done.stderr
    assert [f"{i} b'caf\\xe9.txt' b'caf\\xe9.txt'".encode() for i in (0, 1)] == sorted(done.stdout.splitlines())

