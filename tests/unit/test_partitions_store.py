"""The emulated service's leases: held by a secret token, of which the database keeps only a hash."""

import contextlib
import sqlite3

import pytest

from poprun.partitions.provider import InUseError, Owner, PartitionRequest
from poprun.partitions.store import Inventory, Store

OWNER = Owner(label="launch", host="pod7", pid=1)  # another host: its liveness cannot be checked here


def request() -> PartitionRequest:
    return PartitionRequest(name="p16", size=16, num_gcds=1, num_ilds=0)


def test_another_store_with_the_same_owner_id_is_not_the_holder(tmp_path):
    """A second process on the same database, claiming the holder's owner id, cannot renew, release or remove."""
    # GIVEN a lease granted through one Store (one process)
    first = Store(str(tmp_path / "vipu.sqlite"), Inventory())
    first.create(request(), owner=OWNER)
    other = Store(str(tmp_path / "vipu.sqlite"))

    # WHEN another Store (another process) names the same owner, THEN each change is refused
    for attempt in (lambda: other.lease("p16", OWNER), lambda: other.remove("p16", owner=OWNER),
                    lambda: other.update(request(), owner=OWNER), lambda: other.release_as("p16", token=None)):
        with pytest.raises(InUseError):
            attempt()
    info = first.get("p16")

    assert info is not None
    assert "launch@pod7:1" == info.leased_by
    first.release("p16", OWNER)
    assert None is other.get("p16").leased_by  # type: ignore[union-attr]


def test_the_holder_keeps_its_token_across_an_update_and_renewals(tmp_path):
    """update_as and lease_as with the holder's token keep that token; the database has only its SHA-256."""
    store = Store(str(tmp_path / "vipu.sqlite"), Inventory())
    _, token = store.create_as(request(), owner=OWNER)
    assert token is not None
    _, again = store.update_as(request(), owner=OWNER, token=token)

    assert token == again == store.lease_as("p16", OWNER, token=token)
    with contextlib.closing(sqlite3.connect(tmp_path / "vipu.sqlite")) as db:
        (stored,) = db.execute("SELECT token_hash FROM leases").fetchone()
    assert token not in stored
    assert 64 == len(stored)


def test_a_database_from_before_tokens_is_migrated(tmp_path):
    """A leases table without token_hash gains it; its old leases match no token, so they only expire."""
    path = tmp_path / "old.sqlite"
    with contextlib.closing(sqlite3.connect(path)) as db:
        db.execute("CREATE TABLE leases (partition TEXT PRIMARY KEY, owner TEXT NOT NULL, host TEXT NOT NULL, "
                   "pid INTEGER NOT NULL, expires REAL NOT NULL)")
        db.execute("INSERT INTO leases VALUES ('p16', 'launch@pod7:1', 'pod7', 1, 1e12)")
        db.commit()
    store = Store(str(path), Inventory())
    store.create_as(request())  # the partition row for the old lease

    with pytest.raises(InUseError):
        store.lease("p16", OWNER)
