"""
The mpirun backend's output relay on real hosts when its connections are reset: every line once.

poprun listens in this machine's namespace; each instance's relay connects from its host's
namespace. ``ss -K`` resets every relay connection mid-run, on poprun's side or on the hosts'.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.test_mpirun_relay_faults import PROGRAM, PY, Running, expected, started  # noqa: F401 - a fixture
from tests.golden.harness import assert_golden
from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180),
              pytest.mark.skipif(shutil.which("mpirun") is None or shutil.which("ss") is None,
                                 reason="mpirun or ss is not on PATH")]
GOLDEN = Path(__file__).parent / "golden_mpirun"


@pytest.mark.parametrize("side", ["poprun", "hosts"])
def test_relay_connections_reset_on_every_host_lose_and_repeat_no_line(test_hosts: TestHosts, tmp_path: Path,
                                                                       side: str, started: list[Running]) -> None:  # noqa: F811
    """2 hosts x 2 instances; ss -K of every relay connection (poprun's end, or each host's): every line once, exit 0."""
    hosts = test_hosts.names[:2]
    run = Running("--host", ",".join(hosts), "--num-instances=4", "--num-replicas=4", PY, "-c", PROGRAM,
                  cwd=tmp_path, runs=started, env=test_hosts.env())
    for index in range(4):
        run.wait_for(b"out %d 24" % index, 1, within_s=120)
    port = run.relay_port()

    if side == "poprun":
        subprocess.run(["ss", "-K", "sport", "=", f":{port}"], capture_output=True, check=True)
    else:
        for name in hosts:
            subprocess.run(["ip", "netns", "exec", test_hosts.namespaces[name], "ss", "-K", "dport", "=", f":{port}"],
                           capture_output=True, check=True)
    (tmp_path / "go").touch()
    status = run.finish()

    out, err = expected(4)
    assert 0 == status, bytes(run.err[-3000:])
    assert sorted(out) == sorted(run.out.splitlines()), bytes(run.err[-3000:])
    assert sorted(err) == sorted(line for line in run.err.splitlines() if line.startswith(b"err ")), bytes(run.err[-3000:])


@pytest.fixture
def h1_cannot_call_back(test_hosts: TestHosts) -> Iterator[TestHosts]:
    """Keep h1 from connecting to this machine's ephemeral ports (the relay's), not to ssh's or mpirun's fixed ones."""
    namespace, poprun_address = test_hosts.namespaces["h1"], test_hosts.subnet.rsplit(".", 1)[0] + ".1"
    low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
    rules = [(100, ["sport", "22", "lookup", "main"]),  # ssh's answers to mpirun's ssh client
             (101, ["sport", MPIRUN_PORTS, "lookup", "main"]),  # the MPI daemon's, to mpirun
             (102, ["dport", f"{low}-{high}", "prohibit"])]  # any new connection to this machine (the relay)
    try:
        for pref, what in rules:
            subprocess.run(["ip", "netns", "exec", namespace, "ip", "rule", "add", "to", poprun_address, "ipproto",
                            "tcp", *what, "pref", str(pref)], check=True, capture_output=True)
        yield test_hosts
    finally:
        for pref, _ in rules:
            subprocess.run(["ip", "netns", "exec", namespace, "ip", "rule", "del", "pref", str(pref)],
                           check=False, capture_output=True)


MPIRUN_PORTS = "6100-6110"  # mpirun and its daemons listen here (OMPI_MCA_oob_tcp_static_ipv4_ports)


def test_instances_that_cannot_reach_the_relay_are_named_pr416(h1_cannot_call_back: TestHosts, tmp_path: Path) -> None:
    """h1 cannot connect back to poprun's relay: its instances' output comes through mpirun, every line, and PR416 names them."""
    hosts = h1_cannot_call_back
    done = subprocess.run([PY, "-m", "poprun.cli.main", "--backend", "mpirun", "--host", "h1,h2", "--num-instances=2",
                           "--num-replicas=2", "sh", "-c", 'echo "out $POPDIST_INSTANCE_INDEX"'], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, check=False,
                          env=os.environ | hosts.env() | {"OMPI_MCA_oob_tcp_static_ipv4_ports": MPIRUN_PORTS,
                                                          "POPRUN_RUNS_DIR": str(tmp_path / "runs")})

    assert 0 == done.returncode, done.stderr[-3000:]
    assert ["out 0", "out 1"] == sorted(done.stdout.splitlines())
    assert "poprun: instance 0 cannot reach poprun at " in done.stderr
    found = done.stderr[done.stderr.index("warning[PR416]"):]
    assert_golden(GOLDEN / "PR416_a_host_cannot_connect_back_to_the_relay", f"{found}exit {done.returncode}\n")
