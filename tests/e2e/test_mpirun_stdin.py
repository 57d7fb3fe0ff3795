"""
Stdin under the mpirun backend on this machine, with real mpirun: instance 0 reads poprun's, the others nothing.

mpirun forwards its own stdin to rank 0 (its ``--stdin`` default); poprun must hand it its own.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from tests.e2e.stdin_helpers import (
    EMPTY,
    READER,
    big_input,
    expected,
    lines,
    run_with_closed_stdin,
    run_with_file,
    run_with_pipe,
    run_with_terminal,
)

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120),
              pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun is not on PATH")]

THREE = ["--backend", "mpirun", "--num-instances", "3", "--num-replicas", "3"]
POPRUN = [sys.executable, "-m", "poprun.cli.main", *THREE, "sh", "-c", READER]
NOTHING = [f"0 {EMPTY} 0", "1 - 0", "2 - 0"]


def test_a_10_mib_file_reaches_instance_0_byte_for_byte(tmp_path: Path) -> None:
    """``poprun --backend mpirun ... < file``: instance 0 reads the whole file exactly; the others read nothing."""
    data = big_input(tmp_path / "input")

    done = run_with_file(POPRUN, tmp_path / "input", cwd=tmp_path, timeout=90)

    assert (0, expected(data, 3)) == (done.returncode, lines(done.stdout)), done.stderr


def test_a_10_mib_pipe_reaches_instance_0_byte_for_byte(tmp_path: Path) -> None:
    """``producer | poprun --backend mpirun ...``: all of the pipe, and its end, reach instance 0."""
    data = big_input(tmp_path / "input")

    done = run_with_pipe(POPRUN, data, cwd=tmp_path, timeout=90)

    assert (0, expected(data, 3)) == (done.returncode, lines(done.stdout)), done.stderr


def test_a_short_pipe_reaches_instance_0(tmp_path: Path) -> None:
    """``echo hi | poprun --backend mpirun ... cat``: hi once."""
    done = run_with_pipe([sys.executable, "-m", "poprun.cli.main", *THREE, "cat"], b"hi\n", cwd=tmp_path,
                         timeout=90)

    assert (0, b"hi\n") == (done.returncode, done.stdout), done.stderr


def test_dev_null_is_nothing_to_read(tmp_path: Path) -> None:
    """``< /dev/null``: every instance reads nothing and ends."""
    done = run_with_file(POPRUN, Path(os.devnull), cwd=tmp_path, timeout=90)

    assert (0, NOTHING) == (done.returncode, lines(done.stdout)), done.stderr


def test_a_closed_stdin_is_nothing_to_read(tmp_path: Path) -> None:
    """``<&-``: every instance reads nothing, and nothing fails."""
    done = run_with_closed_stdin(POPRUN, cwd=tmp_path, timeout=90)

    assert (0, NOTHING) == (done.returncode, lines(done.stdout)), done.stderr


def test_a_terminal_is_never_read(tmp_path: Path) -> None:
    """A terminal as stdin (nobody typing): no instance waits on it; it stays the shell's."""
    done = run_with_terminal(POPRUN, cwd=tmp_path, timeout=90)

    assert (0, NOTHING) == (done.returncode, lines(done.stdout)), done.stderr
