"""The backend session on real hosts: one registry per command, so the topology probe's connections are the launch's."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.e2e.hosts.test_host_commands_on_hosts import accepted
from tests.e2e.hosts.test_host_faults import command_lines
from tests.e2e.hosts.test_ssh_backend import poprun, wait_for
from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def test_the_probe_and_the_launch_of_one_command_share_each_hosts_connection_and_leave_nothing(
        test_hosts: TestHosts, tmp_path: Path, short_tmp: Path) -> None:
    """
    GIVEN placement that needs h1's and h2's topologies (read over ssh while planning)
    WHEN poprun launches there
    THEN each host logged in once (the probe's connection, kept by the command's ssh backend, is the launch's),
    and once poprun returned no ssh connection and no control directory of it is left
    """
    # GIVEN
    strategy = "close" if len(os.sched_getaffinity(0)) >= 2 else "spreadnuma"  # close needs a core each
    before = {name: accepted(test_hosts, name) for name in ("h1", "h2")}

    # WHEN
    done = poprun(test_hosts, "--host", "h1,h2", "--num-instances", "2", "--num-replicas", "2",
                  "--process-placement", strategy, sys.executable, "-c", "print('ran')", cwd=tmp_path,
                  env={"TMPDIR": str(short_tmp)})

    # THEN
    needle = f"{short_tmp}/poprun-ssh-".encode()
    assert (0, ["ran", "ran"]) == (done.returncode, done.stdout.split()), done.stderr
    assert {"h1": 1, "h2": 1} == {name: accepted(test_hosts, name) - count for name, count in before.items()}
    assert wait_for(lambda: not [line for line in command_lines().values() if needle in line], within_s=5)
    assert [] == [p.name for p in short_tmp.iterdir() if p.name.startswith("poprun-ssh-")]
