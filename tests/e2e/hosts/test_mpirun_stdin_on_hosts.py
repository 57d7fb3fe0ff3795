"""
Stdin under the mpirun backend on real hosts: instance 0, on another host, reads poprun's through mpirun; the others nothing.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.e2e.stdin_helpers import EMPTY, READER, big_input, expected, lines, run_with_file, run_with_pipe
from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

POPRUN = [sys.executable, "-m", "poprun.cli.main", "--backend", "mpirun", "--host", "h1,h2,h3", "--num-instances", "3",
          "--num-replicas", "3", "sh", "-c", READER]


def test_a_10_mib_file_reaches_instance_0_on_another_host_byte_for_byte(test_hosts: TestHosts, tmp_path: Path) -> None:
    """``< file``: instance 0 on h1 reads the whole file exactly; instances 1 and 2 (h2, h3) read nothing."""
    data = big_input(tmp_path / "input")

    done = run_with_file(POPRUN, tmp_path / "input", cwd=tmp_path, env=os.environ | test_hosts.env(), timeout=150)

    assert (0, expected(data, 3)) == (done.returncode, lines(done.stdout)), done.stderr


def test_a_10_mib_pipe_reaches_instance_0_on_another_host_byte_for_byte(test_hosts: TestHosts, tmp_path: Path) -> None:
    """``producer | poprun``: all of the pipe, and its end, reach instance 0 on h1."""
    data = big_input(tmp_path / "input")

    done = run_with_pipe(POPRUN, data, cwd=tmp_path, env=os.environ | test_hosts.env(), timeout=150)

    assert (0, expected(data, 3)) == (done.returncode, lines(done.stdout)), done.stderr


def test_dev_null_is_nothing_to_read_on_any_host(test_hosts: TestHosts, tmp_path: Path) -> None:
    """``< /dev/null``: every instance reads nothing and the run ends."""
    done = run_with_file(POPRUN, Path(os.devnull), cwd=tmp_path, env=os.environ | test_hosts.env(), timeout=150)

    assert (0, [f"0 {EMPTY} 0", "1 - 0", "2 - 0"]) == (done.returncode, lines(done.stdout)), done.stderr
