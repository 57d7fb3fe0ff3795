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

A lease is held by a secret, not by a name: granting one makes a token
(``secrets.token_urlsafe``) that goes to the holder alone, and only its SHA-256 is stored.
Renewing, releasing, updating or removing a leased partition needs the token (the ``*_as``
methods, which the HTTP server calls); the owner id that anyone may read (``leased_by``) is
never enough. Used directly as a :class:`Provider` (in-process), a Store keeps the tokens it
granted per partition and owner, as the HTTP client does.

``faults`` inject failures for tests: ``create-error`` / ``reset-error`` leave the partition
in ``PS_ERROR``; ``create-refused`` / ``remove-refused`` make the request fail.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
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
    LeaseTokens,
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
    expires REAL NOT NULL, token_hash TEXT NOT NULL DEFAULT '');
"""
# A database made before leases had tokens: its leases get an empty hash, which no token matches.
_MIGRATE = "ALTER TABLE leases ADD COLUMN token_hash TEXT NOT NULL DEFAULT ''"


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
        if "token_hash" not in {row[1] for row in self._db.execute("PRAGMA table_info(leases)")}:
            self._db.execute(_MIGRATE)
        self._tokens = LeaseTokens()  # (partition, owner id) -> the lease's secret
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
            self.create_as(seed.request, owner=seed.leased_by, state=seed.state, ttl_s=365 * 86400.0)  # no holder

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

    # Changing, as a Provider (in-process: the tokens this Store granted are kept here) ------

    def create(self, request: PartitionRequest, *, owner: Owner | None = None,
               state: PartitionState | None = None, ttl_s: float = DEFAULT_TTL_S) -> PartitionInfo:
        """Create a partition, leased to ``owner`` in the same transaction."""
        info, token = self.create_as(request, owner=owner, state=state, ttl_s=ttl_s)
        self._keep(request.name, owner, token)
        return info

    def update(self, request: PartitionRequest, *, owner: Owner | None = None,
               ttl_s: float = DEFAULT_TTL_S) -> PartitionInfo:
        """Remove the partition (if any) and create it again, in one transaction: a failure keeps the old one."""
        info, token = self.update_as(request, owner=owner, token=self._token(request.name, owner), ttl_s=ttl_s)
        self._keep(request.name, owner, token)
        return info

    def remove(self, name: str, *, owner: Owner | None = None) -> None:
        """Remove the partition, unless another live owner leases it."""
        self.remove_as(name, token=self._token(name, owner))
        self._keep(name, owner, None)

    def lease(self, name: str, owner: Owner, *, ttl_s: float = DEFAULT_TTL_S) -> None:
        """Lease (or renew) the partition for ``owner``; InUseError when another live owner has it."""
        self._keep(name, owner, self.lease_as(name, owner, token=self._token(name, owner), ttl_s=ttl_s))

    def release(self, name: str, owner: Owner) -> None:
        """End ``owner``'s lease on the partition, if it holds one."""
        token = self._token(name, owner)
        if token is not None:
            self.release_as(name, token=token)
            self._keep(name, owner, None)

    def _token(self, name: str, owner: Owner | None) -> str | None:
        return self._tokens.get(name, owner)

    def _keep(self, name: str, owner: Owner | None, token: str | None) -> None:
        self._tokens.keep(name, owner, token)

    # Changing, as the holder of a token (the HTTP server's calls) --------------------------

    def create_as(self, request: PartitionRequest, *, owner: Owner | None = None,
                  state: PartitionState | None = None,
                  ttl_s: float = DEFAULT_TTL_S) -> tuple[PartitionInfo, str | None]:
        """Create a partition, leased to ``owner``; return it and the lease's token (None without an owner)."""
        inv = self.inventory
        if self._fault(request.name, "create-refused"):
            raise ProviderError(f"create partition {request.name}: refused (injected fault)")
        with self._tx() as db:
            if db.execute("SELECT 1 FROM partitions WHERE name = ?", (request.name,)).fetchone():
                raise ExistsError(f"partition {request.name} already exists")
            self._insert(db, request, inv, state=state)
            token = None if owner is None else _grant(db, request.name, owner, ttl_s, None)
        return self._must_get(request.name), token

    def update_as(self, request: PartitionRequest, *, owner: Owner | None = None, token: str | None = None,
                  ttl_s: float = DEFAULT_TTL_S) -> tuple[PartitionInfo, str | None]:
        """Remove and create again (needs the token if it is leased); return it and the new lease's token."""
        inv = self.inventory
        with self._tx() as db:
            held = _check_holder(db, request.name, token)
            db.execute("DELETE FROM leases WHERE partition = ?", (request.name,))
            db.execute("DELETE FROM partitions WHERE name = ?", (request.name,))
            self._insert(db, request, inv, state=None)
            granted = None if owner is None else _grant(db, request.name, owner, ttl_s, token if held else None)
        return self._must_get(request.name), granted

    def reset(self, name: str) -> PartitionInfo:
        """Reset the partition: it becomes PS_ACTIVE (PS_ERROR under the ``reset-error`` fault)."""
        state = PartitionState.PS_ERROR if self._fault(name, "reset-error") else PartitionState.PS_ACTIVE
        with self._tx() as db:
            if db.execute("UPDATE partitions SET state = ? WHERE name = ?", (state.value, name)).rowcount == 0:
                raise NotFoundError(f"partition {name} not found")
        return self._must_get(name)

    def remove_as(self, name: str, *, token: str | None = None) -> None:
        """Remove the partition; a leased one only with its lease's token."""
        if self._fault(name, "remove-refused"):
            raise ProviderError(f"remove partition {name}: refused (injected fault)")
        with self._tx() as db:
            _check_holder(db, name, token)
            db.execute("DELETE FROM leases WHERE partition = ?", (name,))
            if db.execute("DELETE FROM partitions WHERE name = ?", (name,)).rowcount == 0:
                raise NotFoundError(f"partition {name} not found")

    def lease_as(self, name: str, owner: Owner, *, token: str | None = None, ttl_s: float = DEFAULT_TTL_S) -> str:
        """Renew the lease ``token`` holds, or lease a free partition to ``owner``; return the token in effect."""
        with self._tx() as db:
            if not db.execute("SELECT 1 FROM partitions WHERE name = ?", (name,)).fetchone():
                raise NotFoundError(f"partition {name} not found")
            if _check_holder(db, name, token):
                db.execute("UPDATE leases SET expires = ? WHERE partition = ?", (time.time() + ttl_s, name))
                assert token is not None
                return token
            return _grant(db, name, owner, ttl_s, None)

    def release_as(self, name: str, *, token: str | None) -> None:
        """End the lease ``token`` holds; InUseError when another live holder has the partition."""
        with self._tx() as db:
            if _check_holder(db, name, token, step="release it"):
                db.execute("DELETE FROM leases WHERE partition = ?", (name,))

    # Helpers -------------------------------------------------------------------------------

    def _must_get(self, name: str) -> PartitionInfo:
        info = self.get(name)
        if info is None:
            raise NotFoundError(f"partition {name} not found")
        return info

    def _insert(self, db: sqlite3.Connection, request: PartitionRequest, inv: Inventory, *,
                state: PartitionState | None) -> None:
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


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _grant(db: sqlite3.Connection, name: str, owner: Owner, ttl_s: float, token: str | None) -> str:
    """Lease ``name`` to ``owner`` (with ``token``, or a new one); return the token. Only its hash is stored."""
    token = token or secrets.token_urlsafe(32)
    db.execute("INSERT OR REPLACE INTO leases (partition, owner, host, pid, expires, token_hash) "
               "VALUES (?, ?, ?, ?, ?, ?)", (name, owner.id, owner.host, owner.pid, time.time() + ttl_s, _hash(token)))
    return token


def _check_holder(db: sqlite3.Connection, name: str, token: str | None, *, step: str = "") -> bool:
    """
    Return whether ``token`` holds the live lease on ``name``; False when no one holds it (a dead lease is dropped).

    Raises InUseError when someone else holds it (``step``: what the refused caller wanted, for the message).
    """
    row = db.execute("SELECT owner, host, pid, expires, token_hash FROM leases WHERE partition = ?",
                     (name,)).fetchone()
    if row is None:
        return False
    if row[3] < time.time() or not _alive(row[1], row[2]):
        db.execute("DELETE FROM leases WHERE partition = ?", (name,))
        return False
    if token is not None and row[4] and hmac.compare_digest(row[4], _hash(token)):
        return True
    why = f"; only its holder can {step}" if step else ""
    raise InUseError(f"partition {name} is in use by {row[0]}{why}", holder=row[0])


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
