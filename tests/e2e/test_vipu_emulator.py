"""
The partition actions against a running emulated V-IPU server (a real process, HTTP, SQLite).

The emulated server stands in for Graphcore's V-IPU server, which cannot run here (design.md 10).
"""

import contextlib
import hashlib
import http.client
import json
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from poprun.core.diagnostic import DiagnosticError
from poprun.core.record import evolve
from poprun.partitions.actions import Lease, acquire, probe
from poprun.partitions.emulated import EmulatedProvider
from poprun.partitions.provider import PROVIDER_ENV, Owner, PartitionRequest
from poprun.planner import plan

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]


class Server:
    """``python -m poprun.partitions.emulator`` on a free port, with its database in a folder."""

    def __init__(self, db: Path) -> None:
        self.db = db
        self.process = subprocess.Popen(
            [sys.executable, "-m", "poprun.partitions.emulator", "--port", "0", "--db", str(db), "--ipus", "64",
             "--ild-size", "16"], stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line.startswith("listening on 127.0.0.1:"), line
        self.port = int(line.split()[2].rsplit(":", 1)[1])

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            assert self.process.wait(timeout=10) == 0
        if self.process.stdout is not None:
            self.process.stdout.close()


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    running = Server(tmp_path / "vipu.sqlite")
    yield running
    running.stop()


def partition(port: int, **changes: object) -> plan.Partition:
    base = plan.Partition(
        name="pod16", allocation=None, server_host="127.0.0.1", server_port=port, timeout_s=5, num_ipus=16,
        num_gcds=2, num_ilds=1, sync_type=None, ipu_link_routing_type=None, gw_link_routing_type=None,
        update=True, reset=None, remove=True, attempts=1, actions=())
    return evolve(base, **changes)


def client(server: Server) -> EmulatedProvider:
    return EmulatedProvider("127.0.0.1", server.port, timeout_s=5)


def test_create_use_and_remove(server):
    """poprun creates the partition, the launch sees it leased, and it is gone after exit."""
    vipu = client(server)
    with acquire(partition(server.port), vipu, owner="launch") as lease:
        (info,) = vipu.list()

        assert ("pod16", 16, 2, "PS_ACTIVE") == (info.name, info.size, info.num_gcds, info.state.value)
        assert info.leased_by is not None
        assert str(server.port) == lease.env["IPUOF_VIPU_API_PORT"]

    assert () == vipu.list()
    assert [] == lease.warnings


def test_mismatch_then_update_recreates_it(server):
    """A partition of the wrong size is PR504 without update; with update=yes it is made again to fit."""
    vipu = client(server)
    vipu.create(PartitionRequest(name="pod16", size=8, num_gcds=1, num_ilds=0))
    with pytest.raises(DiagnosticError) as caught:
        acquire(partition(server.port, update=False), vipu, owner="launch")

    assert ["PR504"] == [d.code for d in caught.value.diagnostics]

    with acquire(partition(server.port, remove=False), vipu, owner="launch"):
        info = vipu.get("pod16")

        assert info is not None
        assert (16, 2) == (info.size, info.num_gcds)
    info = vipu.get("pod16")

    assert info is not None
    assert (16, None) == (info.size, info.leased_by)


def test_server_stopped_mid_run_gives_a_warning_at_exit(server):
    """The release at exit fails cleanly: a PR508 warning, no exception."""
    with acquire(partition(server.port), client(server), owner="launch") as lease:
        server.stop()

    assert ["PR508"] == [w.code for w in lease.warnings]
    assert "Connection refused" in lease.warnings[0].detail


def test_two_launches_racing_for_one_partition(server):
    """Exactly one of two concurrent acquisitions wins; the other is PR506; nothing is left behind."""
    gate = threading.Barrier(2)
    release = threading.Event()
    outcomes: list[object] = []

    def launch(label: str) -> None:
        gate.wait()
        try:
            with acquire(partition(server.port), client(server), owner=label) as lease:
                outcomes.append(lease)
                release.wait(10)
        except DiagnosticError as exc:
            outcomes.append(exc)
            release.set()

    threads = [threading.Thread(target=launch, args=(f"launch{i}",)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    won = [o for o in outcomes if isinstance(o, Lease)]
    lost = [o for o in outcomes if isinstance(o, DiagnosticError)]

    assert (1, 1) == (len(won), len(lost))
    assert ["PR506"] == [d.code for d in lost[0].diagnostics]
    assert () == client(server).list()


def test_a_restart_keeps_the_partitions(server, tmp_path):
    """Partitions live in SQLite: a new server on the same database still has them."""
    with acquire(partition(server.port, remove=False), client(server), owner="launch"):
        pass
    server.stop()
    again = Server(server.db)
    try:
        seen = probe(partition(again.port), {PROVIDER_ENV: "emulated"})

        assert (True, ["pod16"]) == (seen.reachable, [p.name for p in seen.partitions])
    finally:
        again.stop()


def call(port: int, method: str, path: str, doc: dict[str, object] | None = None) -> tuple[int, dict[str, object]]:
    """One raw request to the server, as any client on the network may send it."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, path, body=None if doc is None else json.dumps(doc).encode())
        response = conn.getresponse()
        return response.status, json.loads(response.read())
    finally:
        conn.close()


def test_a_lease_is_held_by_its_token_not_by_the_name_anyone_can_read(server):
    """Knowing leased_by (shown by GET) is not enough to renew, release, update or remove someone's lease."""
    # GIVEN a partition leased by a launch, through the client (which keeps its token)
    holder = client(server)
    owner = Owner(label="launch", host="pod7", pid=1)
    holder.create(PartitionRequest(name="pod16", size=16, num_gcds=1, num_ilds=1), owner=owner)
    status, listed = call(server.port, "GET", "/v1/partitions")
    (shown,) = listed["partitions"]  # type: ignore[misc]
    token = holder._tokens.get("pod16", owner)
    as_holder = {"owner": {"label": "launch", "host": "pod7", "pid": 1}}

    # WHEN another client presents the holder's name, or a guessed token
    attempts = {
        "renew": call(server.port, "PUT", "/v1/partitions/pod16/lease", as_holder),
        "renew with a guess": call(server.port, "PUT", "/v1/partitions/pod16/lease", {**as_holder, "token": "x" * 43}),
        "release": call(server.port, "DELETE", "/v1/partitions/pod16/lease", as_holder),
        "update": call(server.port, "PUT", "/v1/partitions/pod16", {"request": {"size": 8}, **as_holder}),
        "remove": call(server.port, "DELETE", "/v1/partitions/pod16", as_holder),
    }

    # THEN each is refused as in use, the lease stays, and no GET shows the token
    assert dict.fromkeys(attempts, (409, "in_use")) == {w: (s, d["error"]) for w, (s, d) in attempts.items()}
    assert (200, "launch@pod7:1") == (status, shown["leased_by"])  # type: ignore[index]
    assert token not in json.dumps(listed) + json.dumps(call(server.port, "GET", "/v1/partitions/pod16")[1])
    info = holder.get("pod16")
    assert info is not None
    assert (16, "launch@pod7:1") == (info.size, info.leased_by)


def test_the_holder_renews_and_releases_with_its_token(server):
    """The holder's token renews (the same token back) and releases; only its hash is in the database."""
    holder = client(server)
    owner = Owner(label="launch", host="pod7", pid=1)
    holder.create(PartitionRequest(name="pod16", size=16, num_gcds=1, num_ilds=1), owner=owner)
    token = holder._tokens.get("pod16", owner)
    with contextlib.closing(sqlite3.connect(server.db)) as db:
        stored = db.execute("SELECT token_hash FROM leases").fetchall()

    assert [(hashlib.sha256(token.encode()).hexdigest(),)] == stored
    assert (200, {"token": token}) == call(server.port, "PUT", "/v1/partitions/pod16/lease",
                                           {"owner": {"label": "x", "host": "y", "pid": 2}, "token": token})
    assert (200, {}) == call(server.port, "DELETE", "/v1/partitions/pod16/lease", {"token": token})
    info = holder.get("pod16")
    assert info is not None
    assert info.leased_by is None
