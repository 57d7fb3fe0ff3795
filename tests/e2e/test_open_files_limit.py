"""Launches of more instances than the usual limit on open files allows (1024: some 250 instances' pipes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PY = sys.executable


def _poprun(limits: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    command = f'{limits}; exec "$0" -m poprun.cli.main "$@"'
    return subprocess.run(["sh", "-c", command, PY, *args], cwd=cwd, capture_output=True, text=True, timeout=100,
                          check=False)


def test_poprun_raises_its_soft_limit_to_start_every_instance(tmp_path: Path) -> None:
    done = _poprun("ulimit -Sn 128", "--num-instances", "100", "--num-replicas", "100", "sh", "-c",
                   "echo $POPDIST_INSTANCE_INDEX", cwd=tmp_path)

    assert (0, set(range(100))) == (done.returncode, {int(line) for line in done.stdout.split()}), done.stderr[-500:]


def test_a_hard_limit_too_low_is_pr429_before_anything_starts(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    done = _poprun("ulimit -n 128", "--num-instances", "100", "--num-replicas", "100", "sh", "-c",
                   f"touch {marker}", cwd=tmp_path)

    assert 125 == done.returncode
    assert ("error[PR429]: not enough open files for the instances\n"
            "  --> open files (ulimit -n)\n"
            "   = 100 instances need about 464 open files, and this process may open 128 at most: raise the hard "
            "limit (ulimit -Hn, or limits.conf), or launch fewer instances\n"
            "   = hint: each instance holds about 4 open files in poprun: raise the hard limit on open files "
            "(ulimit -Hn, or nofile in /etc/security/limits.conf), or launch fewer instances\n") == done.stderr
    assert not marker.exists()
