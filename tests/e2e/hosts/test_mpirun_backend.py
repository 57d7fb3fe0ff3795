"""The mpirun backend on real hosts: placement and popdist values, an mpi4py probe, teardown."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.e2e.hosts.test_ssh_backend import PROBE, SLEEPER, marked_anywhere, poprun, wait_for
from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PY = sys.executable
MPI_PROBE = ("import json, os, socket; from mpi4py import MPI; import popdist; c = popdist.current(); "
             "w = MPI.COMM_WORLD; total = w.allreduce(c.instance_index); "
             "print(json.dumps({'rank': w.Get_rank(), 'size': w.Get_size(), 'index': c.instance_index, "
             "'instances': c.num_instances, 'host': socket.gethostname(), 'sum': total}))")


def test_four_hosts_two_instances_each_see_their_planned_values(test_hosts: TestHosts, tmp_path: Path) -> None:
    """--backend mpirun, 4 hosts x 2 instances: each instance on its planned host with its popdist values."""
    done = poprun(test_hosts, "--backend", "mpirun", "--host", ",".join(test_hosts.names), "--num-instances", "8",
                  "--num-replicas", "16", PY, "-c", PROBE, cwd=tmp_path)

    assert 0 == done.returncode, done.stderr
    seen = sorted((json.loads(line) for line in done.stdout.splitlines()), key=lambda v: v["index"])
    assert [{"host": test_hosts.names[i // 2], "cwd": str(tmp_path), "index": i, "instances": 8, "offset": 2 * i,
             "local": 2, "total": 16, "local_index": i % 2} for i in range(8)] == seen


def test_mpi4py_rank_and_size_are_the_plans_instance_index_and_count(test_hosts: TestHosts, tmp_path: Path) -> None:
    """An mpi4py probe: COMM_WORLD rank = instance index, size = instance count, and an allreduce works."""
    pytest.importorskip("mpi4py")
    done = poprun(test_hosts, "--backend", "mpirun", "--host", "h1,h2,h3", "--num-instances", "6",
                  "--num-replicas", "6", PY, "-c", MPI_PROBE, cwd=tmp_path)

    assert 0 == done.returncode, done.stderr
    seen = sorted((json.loads(line) for line in done.stdout.splitlines()), key=lambda v: v["rank"])
    assert [{"rank": i, "size": 6, "index": i, "instances": 6, "host": f"h{i // 2 + 1}", "sum": 15}
            for i in range(6)] == seen


def test_failing_instance_ends_the_launch_on_every_host(test_hosts: TestHosts, tmp_path: Path) -> None:
    """Instance 5 (on h3) exits 3: poprun exits 3 naming it, and nothing of the launch is left on any host."""
    mark = f"poprun-mark-{uuid.uuid4().hex[:8]}"
    program = f'if [ "$POPDIST_INSTANCE_INDEX" = 5 ]; then sleep 0.5; exit 3; fi; {SLEEPER.format(mark=mark)}'
    done = poprun(test_hosts, "--backend", "mpirun", "--host", ",".join(test_hosts.names), "--num-instances", "8",
                  "--num-replicas", "8", "sh", "-c", program, mark, cwd=tmp_path)

    assert 3 == done.returncode, done.stderr
    assert "Root cause: instance 5 on h3 exited with status 3" in done.stderr
    assert wait_for(lambda: not marked_anywhere(test_hosts, mark), within_s=3), marked_anywhere(test_hosts, mark)


def test_sigkilled_poprun_leaves_nothing_on_any_host(test_hosts: TestHosts, tmp_path: Path) -> None:
    """kill -9 of poprun while mpirun runs 4 remote instances: within 3 s nothing of the launch is left."""
    mark = f"poprun-mark-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen([PY, "-m", "poprun.cli.main", "--backend", "mpirun", "--host", ",".join(test_hosts.names),
                             "--num-instances", "4", "--num-replicas", "4", "sh", "-c", SLEEPER.format(mark=mark),
                             mark], cwd=tmp_path, env=os.environ | test_hosts.env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        assert wait_for(lambda: len(marked_anywhere(test_hosts, mark)) == 4, within_s=20), "the instances never ran"
    finally:
        proc.kill()
        proc.wait()

    assert wait_for(lambda: not marked_anywhere(test_hosts, mark), within_s=3), marked_anywhere(test_hosts, mark)
