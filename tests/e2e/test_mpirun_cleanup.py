"""The mpirun backend leaves nothing behind on this machine, not even what an instance started in the background."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import Marked

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60),
              pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun is not on PATH")]


def test_a_background_child_of_an_instance_does_not_outlive_poprun(tmp_path: Path, marked: Marked) -> None:
    """
    Each instance leaves a writing loop in the background and ends: poprun ends soon, and so does the loop.

    (mpirun puts each instance in a process group of its own, out of the watchdog's reach.)
    """
    program = "(while :; do echo bg; sleep 100; done) & echo fg"

    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "poprun.cli.main", "--backend", "mpirun", "--num-instances", "2",
                           "--num-replicas", "2", "sh", "-c", program], cwd=tmp_path, env=marked.env,
                          capture_output=True, text=True, timeout=30, check=False)
    took = time.monotonic() - started

    assert 0 == done.returncode, done.stderr
    assert ["fg", "fg"] == sorted(line for line in done.stdout.splitlines() if line == "fg")
    assert {} == marked.survivors(within_s=2)
    assert took < 10, f"poprun took {took:.1f} s"
