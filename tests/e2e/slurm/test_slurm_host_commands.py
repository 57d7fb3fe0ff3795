"""Host commands inside a real Slurm allocation: a one-task step beside the launch's, the script on its input."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.e2e.slurm.test_slurm_backend import environ
from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

# Inside the allocation: a step that takes every CPU of h2 runs, then commands go to h2 and to h3 (not allocated).
PROGRAM = """\
import json, os, subprocess, time
from poprun.backends.base import LaunchError
from poprun.backends.slurm.backend import SlurmBackend
busy = subprocess.Popen(["srun", "--ntasks=2", "sh", "-c", "echo up; sleep 60"], stdout=subprocess.PIPE)
busy.stdout.readline()
backend = SlurmBackend()
said = {}
status, out = backend.run_on_host("h2", "hostname; printf '%s\\\\n' \\"it's $(echo ok)\\"; exit 4",
                                  environ=os.environ, timeout_s=30)
said["h2"] = [status, out.decode()]
try:
    backend.run_on_host("h3", "hostname", environ=os.environ, timeout_s=30)
except LaunchError as exc:
    said["h3"] = exc.message
status, out = backend.run_on_host("h2", "sleep 30", environ=os.environ, timeout_s=1)
said["late"] = status
busy.kill()
busy.communicate()
print(json.dumps(said))
"""


def test_a_command_runs_on_a_node_beside_a_step_that_holds_every_cpu(slurm_hosts: TestHosts, tmp_path: Path):
    """h2 answers although the launch's step holds its CPUs; h3 (outside the allocation) is a LaunchError; bounded."""
    import subprocess

    done = subprocess.run(["salloc", "--quiet", "-N1", "-w", "h2", "--ntasks-per-node=2", sys.executable, "-c",
                           PROGRAM], cwd=tmp_path, capture_output=True, text=True, env=environ(slurm_hosts),
                          timeout=90, check=False)

    assert 0 == done.returncode, done.stderr
    said = json.loads(done.stdout.splitlines()[-1])
    assert [4, "h2\nit's ok\n"] == said["h2"]
    assert said["h3"].startswith("cannot run a command on node h3: srun: error:"), said
    assert 124 == said["late"]
