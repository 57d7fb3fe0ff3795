"""
The emulated V-IPU service's model: an IPU inventory and its partitions and leases, in SQLite.

Layer: ``poprun.partitions``; the standard library and :mod:`poprun.partitions.provider`.

A :class:`Store` is a :class:`~poprun.partitions.provider.Provider` that works on a SQLite
file: the HTTP server of :mod:`poprun.partitions.emulator` wraps one, and tests (or a single
machine without a server) use one directly. This is a fake of Graphcore's V-IPU server, which
cannot run here; it keeps the parts poprun relies on: partitions of a size made of GCDs and
IPU-Link domains (ILDs) of a fixed inventory, routing and sync types, states, and a lease
per partition that V-IPU lacks (it fixes the seed's known issue 7.1: two launches racing for
one partition cannot both get it). Every change is one ``BEGIN IMMEDIATE`` transaction, so
racing processes on one file are serialised by SQLite itself. A lease ends when released, when
its time to live passes without renewal, or when its owner process (on this host) is gone.

``faults`` inject failures for tests: ``create-error`` / ``reset-error`` leave the partition
in ``PS_ERROR``; ``create-refused`` / ``remove-refused`` make the request fail.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from poprun.core.record import field, record
from poprun.partitions.provider import (
    CapacityError,
    ExistsError,
    InUseError,
    NotFoundError,
    Owner,
    PartitionInfo,
    PartitionRequest,
    PartitionState,
    ProviderError,
)

DEFAULT_TTL_S = 60.0
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS partitions (
    name TEXT PRIMARY KEY, size INTEGER NOT NULL, num_gcds INTEGER NOT NULL, num_ilds INTEGER NOT NULL,
    num_replicas INTEGER NOT NULL, ipu_link_routing_type TEXT NOT NULL, gw_link_routing_type TEXT NOT NULL,
    sync_type TEXT NOT NULL, reconfigurable INTEGER NOT NULL, state TEXT NOT NULL, ipus TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS leases (
    partition TEXT PRIMARY KEY, owner TEXT NOT NULL, host TEXT NOT NULL, pid INTEGER NOT NULL,
    expires REAL NOT NULL);
"""


@record
class Seed:
    """A partition an inventory starts with, possibly leased (for tests of a busy Pod)."""

    request: PartitionRequest
    state: PartitionState = PartitionState.PS_ACTIVE
    leased_by: Owner | None = None


@record
class Inventory:
    """The IPUs the service has: ``ipus`` in ILDs of ``ild_size``; used only when a database is new."""

    ipus: int = 64
    ild_size: int = 16
    cluster: str = "emulated"
    allocation: str = "emulated"
    seeds: tuple[Seed, ...] = ()
    faults: tuple[tuple[str, str], ...] = field(default=())  # (partition name, fault), sorted

    @classmethod
    def from_file(cls, path: str) -> Inventory:
        """Return the inventory of a JSON file: ``{"ipus": 64, "ild_size": 16, "partitions": [...], "faults": {...}}``."""
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
        seeds = tuple(_seed(item) for item in doc.get("partitions", ()))
        faults = tuple(sorted((name, fault) for name, fs in doc.get("faults", {}).items() for fault in fs))
        return cls(ipus=int(doc.get("ipus", 64)), ild_size=int(doc.get("ild_size", 16)),
                   cluster=str(doc.get("cluster", "emulated")), allocation=str(doc.get("allocation", "emulated")),
                   seeds=seeds, faults=faults)


def _seed(item: dict[str, object]) -> Seed:
    lease = item.get("leased_by")
    owner = Owner(label=str(lease["label"]), host=str(lease["host"]), pid=int(str(lease["pid"]))) \
        if isinstance(lease, dict) else None
    request = PartitionRequest(
        name=str(item["name"]), size=int(str(item["size"])), num_gcds=int(str(item.get("num_gcds", 1))),
        num_ilds=int(str(item.get("num_ilds", 0))), ipu_link_routing_type=_opt(item.get("ipu_link_routing_type")),
        gw_link_routing_type=_opt(item.get("gw_link_routing_type")), sync_type=_opt(item.get("sync_type")),
        reconfigurable=bool(item.get("reconfigurable", False)))
    return Seed(request=request, state=PartitionState.from_text(str(item.get("state", "PS_ACTIVE"))), leased_by=owner)


def _opt(value: object) -> str | None:
    return None if value is None else str(value)


def _alive(host: str, pid: int) -> bool:
    """Whether the owner process may be alive: only one on this host can be checked."""
    if host != socket.gethostname():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class Store:
    """The emulated service on one SQLite database (a :class:`Provider`)."""

    def __init__(self, path: str, inventory: Inventory | None = None, *, address: str | None = None) -> None:
        self.path = path
        self._address = address or f"emulated V-IPU service at {path}"
        self._lock = threading.Lock()  # one connection per Store, shared by the server's threads
        self._db = sqlite3.connect(path, timeout=10.0, isolation_level=None, check_same_thread=False)
        self._db.executescript(_SCHEMA)
        self.inventory = Inventory()  # until the database's own is read
        self._init(inventory or Inventory())

    @property
    def address(self) -> str:
        """Where the service is, for messages."""
        return self._address

    def close(self) -> None:
        """Close the database."""
        with self._lock:
            self._db.close()

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken at once (BEGIN IMMEDIATE), so no two writers interleave."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                yield self._db
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    def _init(self, inventory: Inventory) -> None:
        with self._tx() as db:
            known = db.execute("SELECT 1 FROM meta WHERE key = 'inventory'").fetchone()
            if not known:
                doc = {"ipus": inventory.ipus, "ild_size": inventory.ild_size, "cluster": inventory.cluster,
                       "allocation": inventory.allocation, "faults": [list(f) for f in inventory.faults]}
                db.execute("INSERT INTO meta VALUES ('inventory', ?)", (json.dumps(doc),))
        self.inventory = self._load_inventory()  # the database's own wins: its partitions were made from it
        if known:
            return
        for seed in inventory.seeds:
            self.create(seed.request, owner=seed.leased_by, state=seed.state, ttl_s=365 * 86400.0)

    def _load_inventory(self) -> Inventory:
        with self._lock:
            doc = json.loads(self._db.execute("SELECT value FROM meta WHERE key = 'inventory'").fetchone()[0])
        return Inventory(ipus=doc["ipus"], ild_size=doc["ild_size"], cluster=doc["cluster"],
                         allocation=doc["allocation"], faults=tuple(tuple(f) for f in doc["faults"]))

    def _fault(self, name: str, fault: str) -> bool:
        return (name, fault) in self.inventory.faults

    # Reading -------------------------------------------------------------------------------

    def list(self) -> tuple[PartitionInfo, ...]:
        """Return every partition, sorted by name."""
        inv = self.inventory
        with self._lock:
            rows = self._db.execute(_SELECT + " ORDER BY p.name").fetchall()
        return tuple(_info(row, inv) for row in rows)

    def get(self, name: str) -> PartitionInfo | None:
        """Return the partition ``name``, or None."""
        inv = self.inventory
        with self._lock:
            row = self._db.execute(_SELECT + " WHERE p.name = ?", (name,)).fetchone()
        return None if row is None else _info(row, inv)

    # Changing ------------------------------------------------------------------------------

    def create(self, request: PartitionRequest, *, owner: Owner | None = None,
               state: PartitionState | None = None, ttl_s: float = DEFAULT_TTL_S) -> PartitionInfo:
        """Create a partition, leased to ``owner`` in the same transaction."""
        inv = self.inventory
        if self._fault(request.name, "create-refused"):
            raise ProviderError(f"create partition {request.name}: refused (injected fault)")
        with self._tx() as db:
            if db.execute("SELECT 1 FROM partitions WHERE name = ?", (request.name,)).fetchone():
                raise ExistsError(f"partition {request.name} already exists")
            self._insert(db, request, inv, state=state, owner=owner, ttl_s=ttl_s)
        return self._must_get(request.name)

    def update(self, request: PartitionRequest, *, owner: Owner | None = None,
               ttl_s: float = DEFAULT_TTL_S) -> PartitionInfo:
        """Remove the partition (if any) and create it again, in one transaction: a failure keeps the old one."""
        inv = self.inventory
        with self._tx() as db:
            self._check_lease(db, request.name, owner)
            db.execute("DELETE FROM leases WHERE partition = ?", (request.name,))
            db.execute("DELETE FROM partitions WHERE name = ?", (request.name,))
            self._insert(db, request, inv, state=None, owner=owner, ttl_s=ttl_s)
        return self._must_get(request.name)

    def reset(self, name: str) -> PartitionInfo:
        """Reset the partition: it becomes PS_ACTIVE (PS_ERROR under the ``reset-error`` fault)."""
        state = PartitionState.PS_ERROR if self._fault(name, "reset-error") else PartitionState.PS_ACTIVE
        with self._tx() as db:
            if db.execute("UPDATE partitions SET state = ? WHERE name = ?", (state.value, name)).rowcount == 0:
                raise NotFoundError(f"partition {name} not found")
        return self._must_get(name)

    def remove(self, name: str, *, owner: Owner | None = None) -> None:
        """Remove the partition, unless another live owner leases it."""
        if self._fault(name, "remove-refused"):
            raise ProviderError(f"remove partition {name}: refused (injected fault)")
        with self._tx() as db:
            self._check_lease(db, name, owner)
            db.execute("DELETE FROM leases WHERE partition = ?", (name,))
            if db.execute("DELETE FROM partitions WHERE name = ?", (name,)).rowcount == 0:
                raise NotFoundError(f"partition {name} not found")

    def lease(self, name: str, owner: Owner, *, ttl_s: float = DEFAULT_TTL_S) -> None:
        """Lease (or renew) the partition for ``owner``; InUseError when another live owner has it."""
        with self._tx() as db:
            if not db.execute("SELECT 1 FROM partitions WHERE name = ?", (name,)).fetchone():
                raise NotFoundError(f"partition {name} not found")
            self._check_lease(db, name, owner)
            db.execute("INSERT OR REPLACE INTO leases VALUES (?, ?, ?, ?, ?)",
                       (name, owner.id, owner.host, owner.pid, time.time() + ttl_s))

    def release(self, name: str, owner: Owner) -> None:
        """End ``owner``'s lease on the partition, if it holds one."""
        with self._tx() as db:
            db.execute("DELETE FROM leases WHERE partition = ? AND owner = ?", (name, owner.id))

    # Helpers -------------------------------------------------------------------------------

    def _must_get(self, name: str) -> PartitionInfo:
        info = self.get(name)
        if info is None:
            raise NotFoundError(f"partition {name} not found")
        return info

    @staticmethod
    def _check_lease(db: sqlite3.Connection, name: str, owner: Owner | None) -> None:
        """Raise InUseError when a live owner other than ``owner`` leases ``name``; drop a dead one's lease."""
        row = db.execute("SELECT owner, host, pid, expires FROM leases WHERE partition = ?", (name,)).fetchone()
        if row is None or (owner is not None and row[0] == owner.id):
            return
        if row[3] < time.time() or not _alive(row[1], row[2]):
            db.execute("DELETE FROM leases WHERE partition = ?", (name,))
            return
        raise InUseError(f"partition {name} is in use by {row[0]}", holder=row[0])

    def _insert(self, db: sqlite3.Connection, request: PartitionRequest, inv: Inventory, *,
                state: PartitionState | None, owner: Owner | None, ttl_s: float) -> None:
        used = {ipu for (ipus,) in db.execute("SELECT ipus FROM partitions") for ipu in json.loads(ipus)}
        ilds, ipus = _place(request, inv, used)
        if state is None:
            fault = self._fault(request.name, "create-error")
            state = PartitionState.PS_ERROR if fault else PartitionState.PS_ACTIVE
        sync = request.sync_type or ("C2-COMPATIBLE" if request.reconfigurable else "DEFAULT")
        db.execute("INSERT INTO partitions VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", (
            request.name, request.size, request.num_gcds, ilds, request.num_gcds,
            (request.ipu_link_routing_type or "DEFAULT").upper(), (request.gw_link_routing_type or "DEFAULT").upper(),
            sync.upper(), int(request.reconfigurable), state.value, json.dumps(ipus)))
        if owner is not None:
            db.execute("INSERT OR REPLACE INTO leases VALUES (?, ?, ?, ?, ?)",
                       (request.name, owner.id, owner.host, owner.pid, time.time() + ttl_s))


_SELECT = ("SELECT p.name, p.size, p.num_gcds, p.num_ilds, p.num_replicas, p.ipu_link_routing_type, "
           "p.gw_link_routing_type, p.sync_type, p.reconfigurable, p.state, l.owner, l.expires "
           "FROM partitions p LEFT JOIN leases l ON l.partition = p.name")


def _info(row: tuple[object, ...], inv: Inventory) -> PartitionInfo:
    name, size, gcds, ilds, replicas, ipu_routing, gw_routing, sync, reconf, state, owner, expires = row
    live = owner is not None and isinstance(expires, float) and expires >= time.time()
    return PartitionInfo(
        name=str(name), size=int(str(size)), num_gcds=int(str(gcds)), num_ilds=int(str(ilds)),
        num_replicas=int(str(replicas)), state=PartitionState.from_text(str(state)), cluster=inv.cluster,
        allocation=inv.allocation, ipu_link_routing_type=str(ipu_routing), gw_link_routing_type=str(gw_routing),
        sync_type=str(sync), reconfigurable=bool(reconf), leased_by=str(owner) if live else None)


def _place(request: PartitionRequest, inv: Inventory, used: set[int]) -> tuple[int, list[int]]:
    """Return the ILD count and the IPUs of a new partition; ProviderError/CapacityError when it cannot be made."""
    size, gcds = request.size, request.num_gcds
    if size < 1 or size & (size - 1) or gcds < 1 or size % gcds:
        msg = f"invalid partition: size {size} must be a power of 2 and a multiple of the {gcds} GCDs"
        raise ProviderError(msg)
    ilds = request.num_ilds or max(1, -(-size // inv.ild_size))
    per = size // ilds
    if size % ilds or per > inv.ild_size:
        msg = f"invalid partition: {size} IPUs cannot be split into {ilds} ILDs of at most {inv.ild_size} IPUs"
        raise ProviderError(msg)
    domains = inv.ipus // inv.ild_size
    for first in range(domains - ilds + 1):
        blocks = [_free_block(d * inv.ild_size, inv.ild_size, per, used) for d in range(first, first + ilds)]
        if all(b is not None for b in blocks):
            return ilds, [ipu for b in blocks if b is not None for ipu in b]
    free = inv.ipus - len(used)
    msg = f"not enough free IPUs: {size} requested in {ilds} ILD(s), {free} of {inv.ipus} free"
    raise CapacityError(msg)


def _free_block(start: int, ild_size: int, per: int, used: set[int]) -> list[int] | None:
    """Return ``per`` free IPUs aligned to ``per`` in the ILD starting at ``start``, or None."""
    for offset in range(0, ild_size - per + 1, per):
        block = list(range(start + offset, start + offset + per))
        if not used.intersection(block):
            return block
    return None
