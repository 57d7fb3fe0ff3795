"""
The interface collectives use, on real hosts that each have a decoy interface first in order (docs/network.md).

Two namespace hosts made with ``decoy=True`` (:mod:`tests.testhosts`): each has ``aaa0`` (the
lowest ifindex, the first name) on a subnet of its own that no other host reaches, and its own
name resolves to that address on it, as on a multi-homed server. Gloo's default binds to the
address the hostname resolves to, so a torch job over both hosts without ``GLOO_SOCKET_IFNAME``
fails; under poprun, which reads the route to MASTER_ADDR on each host, the same program runs
and trains the model torchrun trains when told ``GLOO_SOCKET_IFNAME=eth0`` by hand.

A module fixture of its own (the session's hosts have no decoy: see the module's docstring in
tests/testhosts.py for why the decoy is an option).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.helpers import session_hosts
from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

PY = sys.executable
BIN = Path(__file__).parents[1] / "bin"
ARGS = ["3", "100", "--batch_size", "64", "--backend", "gloo", "--device", "cpu"]  # 3 epochs, snapshot at 0
MPI_PROGRAM = """
import json, os, socket
from mpi4py import MPI

world = MPI.COMM_WORLD
total = world.allreduce(world.Get_rank() + 1)
print(json.dumps({"rank": world.Get_rank(), "size": world.Get_size(), "total": total, "host": socket.gethostname(),
                  "gloo": os.environ.get("GLOO_SOCKET_IFNAME")}), flush=True)
"""


@pytest.fixture(scope="module")
def decoy_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestHosts]:
    """Hosts h1, h2, each with the decoy interface aaa0 first and its name resolving to it."""
    yield from session_hosts(tmp_path_factory.mktemp("decoyhosts"), 2, what="the decoy hosts", decoy=True)


def _app(tmp_path: Path, name: str) -> Path:
    """Return a new folder holding the adapted multinode.py and its datautils.py."""
    app = tmp_path / name
    app.mkdir()
    for file in ("multinode.py", "datautils.py"):
        shutil.copyfile(BIN / file, app / file)
    return app


def _env(hosts: TestHosts, *, mpi_interfaces: bool = False) -> dict[str, str]:
    """The launching environment: the hosts' ssh settings; mpirun's *_if_include only when asked (poprun decides)."""
    env = os.environ | hosts.env() | {"MASTER_PORT": str(random.randrange(20000, 30000))}  # noqa: S311
    if not mpi_interfaces:
        env = {k: v for k, v in env.items() if not k.endswith("_if_include")}
    return {k: v for k, v in env.items() if k not in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")}


def _checksum(text: str) -> str:
    found = re.findall(r"^(?:\S+ )?checksum (\S+ \S+)$", text, re.MULTILINE)
    assert len(found) == 1, text
    return found[0]


def _torchrun(hosts: TestHosts, app: Path, *, ifname: str | None, port: int, timeout: float) -> list[subprocess.Popen[str]]:
    """Start one torchrun per host (``ip netns exec``), as its users do; GLOO_SOCKET_IFNAME set by hand when given."""
    procs = []
    for rank, name in enumerate(("h1", "h2")):
        env = {"PATH": os.environ["PATH"], "HOME": str(app), "PYTHONPATH": os.environ.get("PYTHONPATH", ""),
               **({"GLOO_SOCKET_IFNAME": ifname} if ifname else {})}
        script = f'hostname {name} 2>/dev/null; exec timeout -s KILL {int(timeout)} "$@"'
        command = ["ip", "netns", "exec", hosts.namespaces[name], "unshare", "--uts", "--mount", "sh", "-c",
                   f"mount --bind {hosts.state}/hosts_{name} /etc/hosts && {script}", "sh",
                   PY, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1", "--node-rank", str(rank),
                   "--master-addr", hosts.addresses["h1"], "--master-port", str(port), "multinode.py", *ARGS]
        procs.append(subprocess.Popen(command, cwd=app, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, start_new_session=True))
    return procs


def _outputs(hosts: TestHosts, procs: list[subprocess.Popen[str]], timeout: float) -> tuple[list[str], bool]:
    """
    Return each process's output, and whether they all ended within ``timeout``.

    Else every process of the two hosts but their sshd is killed (the module's own hosts: only
    these jobs run there; torchrun starts its workers in sessions of their own).
    """
    deadline = time.monotonic() + timeout
    ended = True
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            ended = False
    if not ended:
        for name in ("h1", "h2"):
            hosts.kill_sessions(name)
        for proc in procs:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)  # the test's own sessions (ip netns exec), by their ids
    return [proc.communicate()[0] for proc in procs], ended


def test_each_host_has_the_decoy_first_its_name_resolves_to_it_and_no_other_host_reaches_it(
        decoy_hosts: TestHosts) -> None:
    """aaa0 sorts first and has a lower ifindex than eth0; hN resolves to its decoy there; h2 has no route to h1's."""
    for name in decoy_hosts.names:
        links = decoy_hosts.ssh(name, "ip -o link show").stdout.splitlines()
        order = [line.split(": ")[1].split("@")[0] for line in links]
        assert order.index("aaa0") < order.index("eth0"), order
        assert min(n for n in order if n != "lo").startswith("aaa"), order
        said = decoy_hosts.ssh(name, "getent ahosts $(hostname) | head -n 1").stdout.split()
        assert said[:1] == [decoy_hosts.decoys[name]], said
    route = decoy_hosts.ssh("h2", f"ip -o route get {decoy_hosts.decoys['h1']} 2>&1")
    assert "unreachable" in route.stdout.lower(), route.stdout


def test_gloo_default_takes_the_decoy_and_the_job_fails(decoy_hosts: TestHosts, tmp_path: Path) -> None:
    """GIVEN the decoy hosts WHEN torchrun runs the job without GLOO_SOCKET_IFNAME THEN it does not complete."""
    pytest.importorskip("torch")
    app = _app(tmp_path, "without")
    procs = _torchrun(decoy_hosts, app, ifname=None, port=random.randrange(30000, 40000), timeout=200)  # noqa: S311
    outputs, ended = _outputs(decoy_hosts, procs, 60)

    # it hangs (the peers wait for the decoy's address) or fails: either way it never completes
    assert not ended or any(p.returncode != 0 for p in procs), outputs
    assert not any("checksum" in out for out in outputs), outputs


def test_ddp_multinode_under_poprun_matches_torchrun(decoy_hosts: TestHosts, tmp_path: Path) -> None:
    """
    GIVEN the decoy hosts WHEN poprun runs multinode.py over h1,h2 with no GLOO_SOCKET_IFNAME THEN it completes,
    the run's plan names eth0 and the route on each host, and the weights equal torchrun's (eth0 by hand).
    """
    pytest.importorskip("torch")
    app = _app(tmp_path, "poprun")
    runs = tmp_path / "runs"
    env = _env(decoy_hosts) | {"POPRUN_RUNS_DIR": str(runs)}
    done = subprocess.run([PY, "-m", "poprun.cli.main", "--backend", "ssh", "-H", "h1,h2", "--num-instances", "2",
                           "--num-replicas", "2", PY, "multinode.py", *ARGS], cwd=app, env=env, capture_output=True,
                          text=True, timeout=240, check=False)
    assert 0 == done.returncode, done.stderr[-3000:]
    ours = _checksum(done.stdout)

    (plan_path,) = runs.glob("*/plan.json")
    plan = json.loads(plan_path.read_text())
    h1, h2 = decoy_hosts.addresses["h1"], decoy_hosts.addresses["h2"]
    assert [(h["host"], h["interface"], h["address"]) for h in plan["network"]["hosts"]] == \
        [("h1", "eth0", h1), ("h2", "eth0", h2)]
    assert [i["env"]["GLOO_SOCKET_IFNAME"] for i in plan["instances"]] == ["eth0", "eth0"]
    explained = subprocess.run([PY, "-m", "poprun.cli.main", "plan", str(plan_path), "--explain"], env=env,
                               capture_output=True, text=True, timeout=60, check=True).stdout
    assert f"h2    eth0       {h2}  route get {h1} -> eth0 src {h2}" in explained, explained
    assert f"h1    eth0       {h1}  route get {h1} -> eth0 src {h1}" in explained, explained
    assert "GLOO_SOCKET_IFNAME=eth0" in explained
    report = subprocess.run([PY, "-m", "poprun.cli.main", "report", plan_path.parent.name], env=env,
                            capture_output=True, text=True, timeout=60, check=True).stdout
    assert f"network: h1 eth0 {h1} (route get {h1} -> eth0 src {h1}); h2 eth0 {h2} (route get {h1} -> eth0 src {h2})" \
        in report, report

    torchrun_app = _app(tmp_path, "torchrun")
    procs = _torchrun(decoy_hosts, torchrun_app, ifname="eth0", port=random.randrange(30000, 40000),  # noqa: S311
                      timeout=200)
    outputs, ended = _outputs(decoy_hosts, procs, 240)
    assert ended, outputs
    assert [0, 0] == [p.returncode for p in procs], outputs
    assert ours == _checksum(outputs[0])


def test_mpi4py_allreduce_under_mpirun_gets_the_route_subnets(decoy_hosts: TestHosts, tmp_path: Path) -> None:
    """GIVEN the decoy hosts and no *_if_include anywhere WHEN mpirun runs an allreduce THEN poprun's subnet is in its line."""
    pytest.importorskip("mpi4py")
    (tmp_path / "allreduce.py").write_text(MPI_PROGRAM)
    runs = tmp_path / "runs"
    env = _env(decoy_hosts) | {"POPRUN_RUNS_DIR": str(runs)}
    done = subprocess.run([PY, "-m", "poprun.cli.main", "--backend", "mpirun", "-H", "h1,h2", "--num-instances", "2",
                           "--num-replicas", "2", PY, "allreduce.py"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert 0 == done.returncode, done.stderr[-3000:]
    records = sorted((json.loads(line[line.index("{"):]) for line in done.stdout.splitlines() if "{" in line),
                     key=lambda r: r["rank"])
    assert [(r["rank"], r["size"], r["total"], r["gloo"]) for r in records] == [(0, 2, 3, "eth0"), (1, 2, 3, "eth0")]
    (plan_path,) = runs.glob("*/plan.json")
    shown = subprocess.run([PY, "-m", "poprun.cli.main", "plan", str(plan_path)], env=env, capture_output=True,
                           text=True, timeout=60, check=True).stdout
    subnet = decoy_hosts.subnet
    assert f"'--mca' 'oob_tcp_if_include' '{subnet}' '--mca' 'btl_tcp_if_include' '{subnet}' '-H'" in shown, shown


def test_mpi4py_allreduce_with_host_subnet(decoy_hosts: TestHosts, tmp_path: Path) -> None:
    """GIVEN --host-subnet WHEN mpirun runs an allreduce THEN the subnet's interface on each host, and the run completes."""
    pytest.importorskip("mpi4py")
    (tmp_path / "allreduce.py").write_text(MPI_PROGRAM)
    runs = tmp_path / "runs"
    env = _env(decoy_hosts) | {"POPRUN_RUNS_DIR": str(runs)}
    done = subprocess.run([PY, "-m", "poprun.cli.main", "--backend", "mpirun", "-H", "h1,h2", "--num-instances", "2",
                           "--num-replicas", "2", "--host-subnet", decoy_hosts.subnet, PY, "allreduce.py"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert 0 == done.returncode, done.stderr[-3000:]
    (plan_path,) = runs.glob("*/plan.json")
    plan = json.loads(plan_path.read_text())
    assert plan["network"]["source"] == "host-subnet"
    assert [h["interface"] for h in plan["network"]["hosts"]] == ["eth0", "eth0"]
    assert "3" in done.stdout


def test_a_host_without_a_route_to_master_addr_is_refused_before_the_launch(decoy_hosts: TestHosts,
                                                                            tmp_path: Path) -> None:
    """GIVEN MASTER_ADDR that no host routes to WHEN poprun starts THEN PR474 per host, exit 125, nothing ran."""
    (tmp_path / "train.py").write_text("open('ran', 'w').close()\n")
    env = _env(decoy_hosts)
    done = subprocess.run([PY, "-m", "poprun.cli.main", "-H", "h1,h2", "--num-instances", "2", "--num-replicas", "2",
                           "--mpi-global-args=-x MASTER_ADDR=10.79.0.1", PY, "train.py"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert 125 == done.returncode, done.stderr
    assert done.stderr.count("error[PR474]") == 2, done.stderr
    assert "h2 has no route to MASTER_ADDR 10.79.0.1: the kernel says 'RTNETLINK answers: Network is unreachable'" \
        in done.stderr
    assert not (tmp_path / "ran").exists()
