"""Rank order on the ssh namespace hosts: instance i runs on the host the plan's order gives it (natural, topology)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.hosts.test_ssh_backend import PROBE, PY, poprun
from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def hosts_of(stdout: str) -> list[tuple[int, str, str]]:
    """Return (index, host, MASTER_ADDR) of each instance's line, by index."""
    seen = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return sorted((v["index"], v["host"], v["master"]) for v in seen)


PROBE_MASTER = PROBE.replace("'index': c.instance_index,", "'index': c.instance_index, 'master': os.environ['MASTER_ADDR'],")


def test_natural_order_puts_instance_i_on_the_ith_host_in_natural_order(test_hosts: TestHosts, tmp_path: Path) -> None:
    """-H h3,h1,h4,h2 --rank-order natural, 2 per host: instances 0-1 on h1, ... 6-7 on h4; MASTER_ADDR is h1's."""
    names = test_hosts.names
    given = [names[2], names[0], names[3], names[1]]
    done = poprun(test_hosts, "--host", ",".join(given), "--num-instances", "8", "--num-replicas", "8",
                  "--rank-order", "natural", PY, "-c", PROBE_MASTER, cwd=tmp_path)

    assert 0 == done.returncode, done.stderr
    assert [(i, names[i // 2], test_hosts.addresses[names[0]]) for i in range(8)] == hosts_of(done.stdout)


def test_topology_order_from_a_file_groups_the_hosts_by_leaf(test_hosts: TestHosts, tmp_path: Path) -> None:
    """A topology file with h4,h2 under one leaf and h1,h3 under another: instances follow h2, h4, h1, h3."""
    h1, h2, h3, h4 = test_hosts.names[:4]
    (tmp_path / "topology.conf").write_text(f"SwitchName=a Nodes={h4},{h2}\nSwitchName=b Nodes={h3},{h1}\n"
                                            "SwitchName=top Switches=a,b\n")
    done = poprun(test_hosts, "--host", ",".join(test_hosts.names[:4]), "--num-replicas", "4",
                  "--network-topology", "topology.conf", PY, "-c", PROBE_MASTER, cwd=tmp_path)

    assert 0 == done.returncode, done.stderr
    master = test_hosts.addresses[h2]  # instance 0's host, as ssh_config names it
    assert [(0, h2, master), (1, h4, master), (2, h1, master), (3, h3, master)] == hosts_of(done.stdout)
