"""The health check inside a real Slurm allocation: a step of its own on each node, hostile checks, SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.hosts.test_ssh_backend import wait_for
from tests.e2e.slurm.test_slurm_backend import environ
from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]
ROOT = Path(__file__).parents[3]

# Inside the allocation: a plan made by the solver for h1 and h2 with the check in $CHECK, checked on both.
PROGRAM = """\
import json, os, sys
sys.path.insert(0, os.environ["ROOT"])
from poprun.apply.health import check_hosts, health_problems
from poprun.backends.slurm.backend import SlurmBackend
from tests.e2e.helpers import plan_of
plan = plan_of("--host", "h1,h2", "--health-check", os.environ["CHECK"], "--health-check-timeout", os.environ["LIMIT"],
               "--num-instances", "2", "--num-replicas", "2", "true")
told = []
checks = check_hosts(SlurmBackend(), plan, ["h1", "h2"], environ=os.environ, emit=told.append)
print(json.dumps({"backend": plan.backend.name, "events": len(told),
                  "checks": [[c.host, c.outcome, c.status, list(c.tail)] for c in checks.checks],
                  "codes": [d.code for d in health_problems(checks)]}))
"""


def run(hosts: TestHosts, tmp_path: Path, check: str, limit: str) -> subprocess.Popen[str]:
    """Start the program in an allocation of h1 and h2; return the process (its output is one JSON line)."""
    return subprocess.Popen(["salloc", "--quiet", "-N2", "-w", "h1,h2", sys.executable, "-c", PROGRAM], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=environ(hosts, CHECK=check, LIMIT=limit, ROOT=str(ROOT)))


def test_each_node_is_checked_in_a_step_and_a_hanging_check_leaves_nothing(slurm_hosts: TestHosts, tmp_path: Path):
    """h1 passes; on h2 the check forks a daemon and hangs: timed out at its deadline, nothing of it left on h2."""
    check = 'echo "on $(hostname)"; [ "$(hostname)" != h2 ] || { setsid sleep 3191 & exec sleep 3192; }'

    proc = run(slurm_hosts, tmp_path, check, "3")
    out, err = proc.communicate(timeout=120)

    assert 0 == proc.returncode, err
    said = json.loads(out.splitlines()[-1])
    assert {"backend": "slurm", "events": 2, "codes": ["PR445"],
            "checks": [["h1", "passed", 0, ["on h1"]], ["h2", "timed out", None, ["on h2"]]]} == said
    assert wait_for(lambda: not slurm_hosts.processes("h2", "sleep 319"), within_s=10), slurm_hosts.processes("h2", "sleep 319")


def test_the_checking_process_killed_leaves_nothing_on_the_nodes(slurm_hosts: TestHosts, tmp_path: Path):
    """SIGKILL of the process running the checks (salloc's child): the checks and their daemons end on both nodes."""
    proc = run(slurm_hosts, tmp_path, "setsid sleep 3193 & exec sleep 3194", "300")
    try:
        assert wait_for(lambda: len(slurm_hosts.processes("h1", "sleep 319")) + len(
            slurm_hosts.processes("h2", "sleep 319")) == 4, within_s=60)
        children = Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()  # salloc's: the program
        assert 1 == len(children)

        os.kill(int(children[0]), signal.SIGKILL)

        assert wait_for(lambda: not slurm_hosts.processes("h1", "sleep 319") + slurm_hosts.processes("h2", "sleep 319"),
                        within_s=20), slurm_hosts.processes("h1", "sleep 319") + slurm_hosts.processes("h2", "sleep 319")
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate(timeout=60)
