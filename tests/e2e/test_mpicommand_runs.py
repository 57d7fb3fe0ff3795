"""The mpirun command of a plan, run by the real OpenMPI ``mpirun`` (skipped where there is none)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from poprun.backends.mpirun.command import mpirun_command
from poprun.backends.mpirun.mpiout import TagSplitter
from poprun.core.record import evolve
from poprun.planner.context import Context
from poprun.planner.flags import parse_flags
from poprun.planner.plan import LaunchPlan
from poprun.planner.solve import solve

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120),
              pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun is not on PATH")]

PROBE = ("import os; e = os.environ; print(e['POPDIST_INSTANCE_INDEX'], e['OMPI_COMM_WORLD_RANK'], "
         "e.get('IPUOF_CONFIG_PATH', '-'), repr(e.get('MESSAGE')), os.getcwd())")
ROOT = ["--allow-run-as-root=yes"] if os.geteuid() == 0 else []


def plan_in(cwd: Path, *argv: str) -> LaunchPlan:
    """Return the plan of ``poprun ARGV`` made in this process, for instances that work in ``cwd``."""
    ctx = evolve(Context.from_process(), cwd=str(cwd))
    return solve(parse_flags(["--backend=mpirun", *ROOT, *argv], environ=ctx.environ).spec, ctx).plan


def run(command: tuple[str, ...], *, env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    """Run ``command`` in its own session; kill the whole session if mpirun hangs (4.1.4 sometimes does)."""
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd="/",
                          start_new_session=True) as process:
        try:
            out, err = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            raise
    return subprocess.CompletedProcess(command, process.returncode, out, err)


def lines_by_instance(stdout: bytes) -> dict[int | None, list[str]]:
    """Return mpirun's tagged stdout as each instance's lines."""
    splitter = TagSplitter("stdout")
    found: dict[int | None, list[str]] = {}
    for index, _, data in splitter.feed(stdout) + splitter.end():
        found.setdefault(index, []).extend(data.decode().splitlines())
    return found


def test_each_instance_runs_as_its_rank_in_its_directory(tmp_path: Path) -> None:
    """
    Two local instances under real mpirun: rank = POPDIST_INSTANCE_INDEX, cwd = the planned one.

    mpirun itself runs in '/', so the directory comes from -wdir. The command also shows that a
    value with a space and a newline arrives whole and that IPUOF_CONFIG_PATH is removed.
    """
    # GIVEN
    plan = plan_in(tmp_path, "--num-instances=2", "--num-replicas=2", "--mpi-global-args=--oversubscribe --tag-output",
                   "--mpi-local-args=-x 'MESSAGE=a b\nc'", sys.executable, "-c", PROBE)
    env = os.environ | {"IPUOF_CONFIG_PATH": "/etc/ipuof.conf"}

    # WHEN
    done = run(mpirun_command(plan, environ=env), env=env)

    # THEN
    assert 0 == done.returncode, done.stderr.decode()
    lines = lines_by_instance(done.stdout)
    assert {0: [f"0 0 - 'a b\\nc' {tmp_path}"], 1: [f"1 1 - 'a b\\nc' {tmp_path}"]} == lines


def test_slots_make_oversubscribe_unneeded(tmp_path: Path) -> None:
    """Four instances on one host run without --oversubscribe, whatever the cores: -H gives four slots."""
    plan = plan_in(tmp_path, "--num-instances=4", "--num-replicas=4", "--mpi-global-args=--tag-output", sys.executable,
                   "-c", PROBE)

    done = run(mpirun_command(plan, environ=os.environ), env=dict(os.environ))

    assert 0 == done.returncode, done.stderr.decode()
    lines = lines_by_instance(done.stdout)
    assert [0, 1, 2, 3] == sorted(i for i in lines if i is not None)
    assert all(lines[i][0].startswith(f"{i} {i} ") for i in range(4))


def test_mpirun_maps_each_instance_to_its_planned_host(tmp_path: Path) -> None:
    """With --display-map --do-not-launch, mpirun shows instances 0-1 on the first host and 2-3 on the second."""
    plan = plan_in(tmp_path, "--num-instances=4", "--num-replicas=4", "--host=10.1.3.101,10.1.3.102",
                   "--host-subnet=10.1.3.0/24", "--mpi-global-args=--display-map --do-not-launch", "true")

    done = run(mpirun_command(plan), env=dict(os.environ))

    text = done.stdout.decode() + done.stderr.decode()
    nodes = {block.split()[0]: re.findall(r"Process rank: (\d+)", block) for block in text.split("Data for node: ")[1:]}
    assert {"10.1.3.101": ["0", "1"], "10.1.3.102": ["2", "3"]} == nodes, text


def test_mpirun_backend_passes_every_line_whole_and_once(tmp_path: Path) -> None:
    """
    4 instances x 5,000 lines of 40 bytes through the mpirun backend: every line arrives once, whole.

    (Lines under about 14 bytes written in bulk are where OpenMPI 4.1.4's --tag-output drops
    output; see poprun.backends.mpirun.command. Lines of real programs are longer.)
    """
    program = 'i=0; while [ $i -lt 5000 ]; do echo "instance $POPDIST_INSTANCE_INDEX line $i padding...."; i=$((i+1)); done'
    done = subprocess.run([sys.executable, "-m", "poprun.cli.main", "--backend", "mpirun", "--num-instances", "4",
                           "--num-replicas", "4", "sh", "-c", program], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, check=False)

    assert 0 == done.returncode, done.stderr
    expected = sorted(f"instance {k} line {i} padding...." for k in range(4) for i in range(5000))
    assert expected == sorted(done.stdout.splitlines())
