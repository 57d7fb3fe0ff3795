"""
Elastic membership inside a real Slurm allocation of five nodes, running on four (docs/membership.md).

The cluster is this module's own (h1..h5, each a node with 2 CPUs): its tests drain nodes,
which the session's cluster must never see. A drained node is left out of the next attempt,
whose srun step runs on the spare node instead; it is not used again.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.helpers import session_hosts
from tests.e2e.hosts.test_ssh_backend import wait_for
from tests.e2e.slurm.test_slurm_backend import POPRUN, PY, environ
from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

PROGRAM = ("import os, socket, sys, time; n = os.environ['POPRUN_RESTART_COUNT']; i = os.environ['POPDIST_INSTANCE_INDEX']\n"
           "print('run', n, i, socket.gethostname(), os.environ['WORLD_SIZE'], flush=True)\n"
           "time.sleep(120 if n == '0' else 0)")


@pytest.fixture(scope="module")
def five_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestHosts]:
    """Bring up h1..h5 with a Slurm cluster of their own for this module."""
    yield from session_hosts(tmp_path_factory.mktemp("slurmfive"), 5, slurm=True, what="the membership Slurm cluster")


def scontrol(hosts: TestHosts, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["scontrol", *args], capture_output=True, text=True, env=environ(hosts), timeout=30,
                          check=False)


@pytest.fixture
def drained(five_nodes: TestHosts) -> Iterator[list[str]]:
    """Yield a list to put the nodes the test drains in; resume them after."""
    nodes: list[str] = []
    try:
        yield nodes
    finally:
        for node in nodes:
            scontrol(five_nodes, "update", f"NodeName={node}", "State=RESUME")
        assert wait_for(lambda: all("DRAIN" not in scontrol(five_nodes, "show", "node", n).stdout for n in nodes),
                        within_s=20)


def test_a_drained_node_is_replaced_by_the_spare_node(five_nodes: TestHosts, tmp_path: Path,
                                                      drained: list[str]) -> None:
    """salloc -N5, four instances on h1..h4, spare h5: h3 is drained and its instance killed; attempt 1 runs on h5."""
    runs = tmp_path / "runs"
    proc = subprocess.Popen(["salloc", "--quiet", "-N5", "--ntasks-per-node=1", *POPRUN, "--backend", "slurm",
                             "--host", "h1,h2,h3,h4", "--spare-host", "h5", "--num-replicas", "4",
                             "--max-restarts", "1", "--restart-backoff", "0.1", PY, "-c", PROGRAM],
                            cwd=tmp_path, env=environ(five_nodes, POPRUN_RUNS_DIR=str(runs)), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    first = [proc.stdout.readline().split() for _ in range(4)]
    assert sorted(line[3] for line in first) == ["h1", "h2", "h3", "h4"], first
    drained.append("h3")
    assert 0 == scontrol(five_nodes, "update", "NodeName=h3", "State=DRAIN", "Reason=disk-failing").returncode
    (victim,) = [int(line.split()[0]) for line in five_nodes.processes("h3", r"POPRUN_RESTART_COUNT")]
    os.kill(victim, signal.SIGKILL)
    out, err = proc.communicate(timeout=120)

    assert 0 == proc.returncode, err
    second = sorted((line.split()[2], line.split()[3], line.split()[4]) for line in out.splitlines()
                    if line.startswith("run 1 "))
    assert [("0", "h1", "4"), ("1", "h2", "4"), ("2", "h5", "4"), ("3", "h4", "4")] == second, out
    (run,) = list(runs.iterdir())
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    (replan,) = [e for e in events if e["event"] == "replan"]
    assert (["h3"], ["h5"]) == (replan["removed"], replan["added"])
    assert "DRAIN" in str(replan["reason"]) and "disk-failing" in str(replan["reason"]), replan


def test_a_node_that_fails_its_health_check_is_replaced_by_the_spare_node(five_nodes: TestHosts,
                                                                          tmp_path: Path) -> None:
    """The check runs on each node through srun inside the allocation: h2 fails it, the step runs on h1, h5, h3, h4."""
    check = 'if [ "$(hostname)" = h2 ]; then echo "scratch full"; exit 1; fi'
    done = subprocess.run(["salloc", "--quiet", "-N5", "--ntasks-per-node=1", *POPRUN, "--backend", "slurm",
                           "--host", "h1,h2,h3,h4", "--spare-host", "h5", "--num-replicas", "4", "--health-check",
                           check, PY, "-c", ("import os, socket; print(os.environ['POPDIST_INSTANCE_INDEX'], "
                                            "socket.gethostname())")],
                          cwd=tmp_path, env=environ(five_nodes, POPRUN_RUNS_DIR=str(tmp_path / "runs")),
                          capture_output=True, text=True, timeout=120, check=False)

    assert 0 == done.returncode, done.stderr
    assert ["0 h1", "1 h5", "2 h3", "3 h4"] == sorted(done.stdout.splitlines())
    (run,) = list((tmp_path / "runs").iterdir())
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    assert [("h2", False, ["scratch full"])] == [(e["host"], e["ok"], e["tail"]) for e in events
                                                  if e["event"] == "health-check" and not e["ok"]]
