"""Launches with a V-IPU partition, through the real CLI and a running ``poprun vipu-server``."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

PY = sys.executable
SHOW = 'echo "$POPDIST_INSTANCE_INDEX $IPUOF_VIPU_API_PARTITION_ID $IPUOF_VIPU_API_PORT"'


@pytest.fixture
def server(tmp_path: Path) -> Iterator[int]:
    """Run ``poprun vipu-server`` (a Pod64: 64 IPUs, ILDs of 16) on a free port; yield the port."""
    proc = subprocess.Popen([PY, "-m", "poprun.cli.main", "vipu-server", "--port", "0", "--db",
                             str(tmp_path / "vipu.sqlite"), "--ipus", "64", "--ild-size", "16"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("listening on "), line
    yield int(line.split()[2].rsplit(":", 1)[1])
    proc.terminate()
    proc.wait(timeout=10)
    proc.stdout.close()


def poprun(port: int, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run the classic CLI against the emulated V-IPU server on ``port``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IPUOF_", "POPRUN_"))}
    return subprocess.run([PY, "-m", "poprun.cli.main", "--vipu-server-host", "127.0.0.1", "--vipu-server-port",
                           str(port), *args], cwd=cwd, env=env | {"POPRUN_PARTITION_PROVIDER": "emulated"},
                          capture_output=True, text=True, timeout=30, check=False)


def partitions(port: int, cwd: Path) -> str:
    """Return what `poprun plan --explain` says the server holds (its partition actions)."""
    done = subprocess.run([PY, "-m", "poprun.cli.main", "plan", "--explain", "--vipu-server-host", "127.0.0.1",
                           "--vipu-server-port", str(port), "--num-replicas", "16", "true"], cwd=cwd,
                          env=os.environ | {"POPRUN_PARTITION_PROVIDER": "emulated"}, capture_output=True, text=True,
                          timeout=30, check=False)
    return done.stdout + done.stderr


def test_a_launch_creates_uses_and_removes_its_partition(server: int, tmp_path: Path) -> None:
    """--update-partition=yes with a new name: created, every instance sees it, removed at exit."""
    done = poprun(server, "--vipu-partition", "train16", "--update-partition", "yes", "--num-ilds", "1",
                  "--num-instances", "2", "--num-replicas", "16", "sh", "-c", SHOW, cwd=tmp_path)

    assert 0 == done.returncode, done.stderr
    assert [f"0 train16 {server}", f"1 train16 {server}"] == sorted(done.stdout.splitlines())
    assert "train16" not in partitions(server, tmp_path)


def test_a_missing_partition_without_update_is_pr500_and_nothing_runs(server: int, tmp_path: Path) -> None:
    """A named partition that does not exist, no --update-partition: PR500, exit 125, the program never ran."""
    done = poprun(server, "--vipu-partition", "nope", "--num-replicas", "4", "sh", "-c", "echo ran", cwd=tmp_path)

    assert (125, "") == (done.returncode, done.stdout)
    assert "error[PR500]" in done.stderr


def test_two_launches_racing_for_one_partition_one_wins(server: int, tmp_path: Path) -> None:
    """Two poprun at once for one partition: exactly one runs, the other gets PR506; nothing is left after."""
    args = ["--vipu-partition", "shared", "--update-partition", "yes", "--remove-partition", "yes", "--num-ilds", "1",
            "--num-replicas", "16", "sh", "-c", "sleep 1; echo ran"]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IPUOF_", "POPRUN_"))}
    command = [PY, "-m", "poprun.cli.main", "--vipu-server-host", "127.0.0.1", "--vipu-server-port", str(server), *args]
    procs = [subprocess.Popen(command, cwd=tmp_path, env=env | {"POPRUN_PARTITION_PROVIDER": "emulated"},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.wait(timeout=30), *p.communicate()) for p in procs]

    assert sorted(status for status, _, _ in results) == [0, 125], results
    loser = next(err for status, _, err in results if status == 125)
    assert "error[PR506]: partition 'shared' is in use" in loser, loser
    assert "shared" not in partitions(server, tmp_path)
