"""
Stdin under the slurm backend inside a real allocation: instance 0 reads poprun's (``srun --input=0``), the others nothing.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.slurm.test_slurm_backend import environ
from tests.e2e.stdin_helpers import (
    EMPTY,
    READER,
    big_input,
    expected,
    lines,
    run_with_file,
    run_with_pipe,
)
from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

# 3 hosts, 2 tasks each: instance 0 on h1, the others spread over h1..h3
ALLOCATION = ["salloc", "--quiet", "-N3", "--ntasks-per-node=2"]
POPRUN = [sys.executable, "-m", "poprun.cli.main", "--num-replicas", "6", "sh", "-c", READER]
SALLOC = [*ALLOCATION, *POPRUN]
NOTHING = [f"0 {EMPTY} 0"] + [f"{i} - 0" for i in range(1, 6)]


def test_a_10_mib_file_reaches_instance_0_byte_for_byte(slurm_hosts: TestHosts, tmp_path: Path) -> None:
    """``salloc ... poprun ... < file``: the slurm backend gives instance 0 the whole file exactly; the others nothing."""
    data = big_input(tmp_path / "input")

    done = run_with_file(SALLOC, tmp_path / "input", cwd=tmp_path, env=environ(slurm_hosts), timeout=150)

    assert (0, expected(data, 6)) == (done.returncode, lines(done.stdout)), done.stderr


def test_a_10_mib_pipe_reaches_instance_0_byte_for_byte(slurm_hosts: TestHosts, tmp_path: Path) -> None:
    """``producer | salloc ... poprun ...``: all of the pipe, and its end, reach instance 0."""
    data = big_input(tmp_path / "input")

    done = run_with_pipe(SALLOC, data, cwd=tmp_path, env=environ(slurm_hosts), timeout=150)

    assert (0, expected(data, 6)) == (done.returncode, lines(done.stdout)), done.stderr


def test_dev_null_closed_stdin_and_a_terminal_are_nothing_to_read(slurm_hosts: TestHosts, tmp_path: Path) -> None:
    """
    ``< /dev/null``, ``<&-``, a terminal nobody types on: every instance reads nothing and the run ends.

    poprun's stdin is closed, or the terminal, inside the allocation: salloc itself, started
    with stdin closed, leaves a socket of its own as its command's descriptor 0, and refuses a
    terminal that is not its controlling one.
    """
    env = environ(slurm_hosts)
    leader, follower = os.openpty()
    try:
        inside = [subprocess.run([*ALLOCATION, "sh", "-c", f"exec {shlex.join(POPRUN)} {redirect}"], cwd=tmp_path,
                                 env=env, capture_output=True, timeout=150, check=False)
                  for redirect in ("<&-", f"< {os.ttyname(follower)}")]
    finally:
        os.close(leader)
        os.close(follower)
    for done in (run_with_file(SALLOC, Path(os.devnull), cwd=tmp_path, env=env, timeout=150), *inside):
        assert (0, NOTHING) == (done.returncode, lines(done.stdout)), done.stderr
