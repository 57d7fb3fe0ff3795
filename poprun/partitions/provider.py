"""
The V-IPU model: partitions, their states, the provider protocol and its errors.

Layer: ``poprun.partitions``; imports ``poprun.core`` and ``poprun.planner.plan`` only, never
backends, render or the CLI, and never a provider: the providers (:mod:`poprun.partitions.vipu`,
the real ``vipu`` tool; :mod:`poprun.partitions.emulated`, the emulated V-IPU service;
:mod:`poprun.partitions.store`, the service's in-process store) import their types from here,
and :func:`poprun.partitions.choice.provider_for`, above them all, picks one.

A provider reports problems as :class:`ProviderError` subclasses that carry facts, not
prose; :mod:`poprun.partitions.actions` turns them into ``PR5xx`` diagnostics.
"""

from __future__ import annotations

import enum
import os
import socket
import threading
from typing import Protocol

from poprun.core.record import record
from poprun.planner import plan

PROVIDER_ENV = "POPRUN_PARTITION_PROVIDER"  # "vipu", "emulated", or unset/"auto"
EMULATOR_DB_ENV = "POPRUN_VIPU_EMULATOR_DB"  # an in-process emulated service on this SQLite file
EMULATOR_INVENTORY_ENV = "POPRUN_VIPU_EMULATOR_INVENTORY"  # its inventory (JSON), for a new database


class PartitionState(enum.Enum):
    """A partition's state, as the V-IPU server names it (``PS_ACTIVE`` is the usable one)."""

    PS_PENDING = "PS_PENDING"
    PS_ACTIVE = "PS_ACTIVE"
    PS_RESETTING = "PS_RESETTING"
    PS_ERROR = "PS_ERROR"
    PS_REMOVING = "PS_REMOVING"
    PS_UNKNOWN = "PS_UNKNOWN"

    @classmethod
    def from_text(cls, text: str) -> PartitionState:
        """Return the state named ``text`` (``ACTIVE`` or ``PS_ACTIVE``, any case); PS_UNKNOWN otherwise."""
        name = text.strip().upper()
        name = name if name.startswith("PS_") else f"PS_{name}"
        return cls.__members__.get(name, cls.PS_UNKNOWN)

    @property
    def settling(self) -> bool:
        """Whether the state is on its way somewhere (poll again)."""
        return self in (PartitionState.PS_PENDING, PartitionState.PS_RESETTING)


@record
class Owner:
    """
    Who holds a lease: a label (what launched), and the process, so that a dead owner's lease expires.

    ``id`` is unique per launch (``label`` plus host and pid); two owners with one ``id`` are one owner.
    """

    label: str
    host: str
    pid: int

    @property
    def id(self) -> str:
        """The owner's identity: ``label@host:pid``."""
        return f"{self.label}@{self.host}:{self.pid}"

    @classmethod
    def this_process(cls, label: str) -> Owner:
        """Return the owner for this process."""
        return cls(label=label, host=socket.gethostname(), pid=os.getpid())


@record
class PartitionInfo:
    """
    A partition as the server reports it.

    ``num_replicas`` and ``reconfigurable`` are None when the server's output does not say
    (the ``vipu list`` table has neither); routing and sync types are upper case
    (``DEFAULT``, ``DNC``, ``RINGSWNC``) or None when not reported. ``leased_by`` is the
    holder's owner id, or None (always None from ``vipu``: the real server has no leases).
    """

    name: str
    size: int
    num_gcds: int
    num_ilds: int
    state: PartitionState
    num_replicas: int | None = None
    cluster: str | None = None
    allocation: str | None = None
    ipu_link_routing_type: str | None = None
    gw_link_routing_type: str | None = None
    sync_type: str | None = None
    reconfigurable: bool | None = None
    leased_by: str | None = None


@record
class PartitionRequest:
    """What to create: poprun itself always asks for a non-reconfigurable partition."""

    name: str
    size: int
    num_gcds: int
    num_ilds: int
    allocation: str | None = None
    ipu_link_routing_type: str | None = None
    gw_link_routing_type: str | None = None
    sync_type: str | None = None
    reconfigurable: bool = False

    @classmethod
    def from_plan(cls, partition: plan.Partition, name: str) -> PartitionRequest:
        """Return the request that makes a partition meeting ``partition`` under ``name``."""
        return cls(name=name, size=partition.num_ipus, num_gcds=partition.num_gcds, num_ilds=partition.num_ilds,
                   allocation=partition.allocation, ipu_link_routing_type=partition.ipu_link_routing_type,
                   gw_link_routing_type=partition.gw_link_routing_type, sync_type=partition.sync_type)


class ProviderError(Exception):
    """The server refused or failed a request; ``message`` is the server's (or the tool's) own words."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UnreachableError(ProviderError):
    """The server could not be contacted (refused, timed out, no route, tool missing)."""


class MalformedAnswerError(ProviderError):
    """The server (or the ``vipu`` tool) answered, but not with a V-IPU answer: wrong shape, encoding or size."""


class NotFoundError(ProviderError):
    """The named partition does not exist."""


class ExistsError(ProviderError):
    """A partition of that name already exists (someone else created it first)."""


class CapacityError(ProviderError):
    """The allocation has not enough free IPUs matching the request."""


class InUseError(ProviderError):
    """The partition is leased by another launch; ``holder`` is its owner id."""

    def __init__(self, message: str, holder: str) -> None:
        super().__init__(message)
        self.holder = holder


class Provider(Protocol):
    """
    A V-IPU partition service.

    Every method may raise :class:`UnreachableError` or :class:`ProviderError`; the others
    are named per method. ``create`` and ``update`` with an ``owner`` lease the new partition
    to it in the same step, so no one can take it in between.
    """

    @property
    def address(self) -> str:
        """Where the server is, for messages (``host:port``)."""
        ...

    def list(self) -> tuple[PartitionInfo, ...]:
        """Return every partition, sorted by name."""
        ...

    def get(self, name: str) -> PartitionInfo | None:
        """Return the partition ``name``, or None when it does not exist."""
        ...

    def create(self, request: PartitionRequest, *, owner: Owner | None = None) -> PartitionInfo:
        """Create a partition. Raises ExistsError, CapacityError."""
        ...

    def update(self, request: PartitionRequest, *, owner: Owner | None = None) -> PartitionInfo:
        """Remove the partition ``request.name`` (if any) and create it again. Raises CapacityError, InUseError."""
        ...

    def reset(self, name: str) -> PartitionInfo:
        """Reset the partition. Raises NotFoundError."""
        ...

    def remove(self, name: str, *, owner: Owner | None = None) -> None:
        """Remove the partition (leased by ``owner`` or by no one). Raises NotFoundError, InUseError."""
        ...

    def lease(self, name: str, owner: Owner, *, ttl_s: float) -> None:
        """Lease the partition to ``owner`` for ``ttl_s`` (renewable). Raises NotFoundError, InUseError."""
        ...

    def release(self, name: str, owner: Owner) -> None:
        """End ``owner``'s lease on the partition; no-op when it holds none."""
        ...


class LeaseTokens:
    """The secret tokens of the leases a provider holds, by (partition, owner); safe to use from several threads."""

    def __init__(self) -> None:
        self._tokens: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()  # a lease's heartbeat renews from its own thread

    def get(self, name: str, owner: Owner | None) -> str | None:
        """Return the token of ``owner``'s lease on partition ``name``, or None."""
        with self._lock:
            return None if owner is None else self._tokens.get((name, owner.id))

    def keep(self, name: str, owner: Owner | None, token: str | None) -> None:
        """Remember ``token`` for ``owner``'s lease on ``name`` (None: forget it)."""
        if owner is None:
            return
        with self._lock:
            if token is None:
                self._tokens.pop((name, owner.id), None)
            else:
                self._tokens[(name, owner.id)] = token
