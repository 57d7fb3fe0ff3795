"""
What poprun does to a V-IPU partition: decide, act, verify, lease, and clean up at exit.

Layer: ``poprun.partitions``; imports ``poprun.core``, ``poprun.planner.plan`` and the rest of
this package (providers lazily, through :func:`~poprun.partitions.choice.provider_for`).

The rules are the seed's (sections 2.8 and 2.10, changelogs 2.0-2.2):

- no name: the only partition of the allocation is used; with several, a name is needed (PR503);
- a named partition that exists is checked: size, GCDs, ILDs and replicas (unless it is
  reconfigurable: then only that it is large enough), and the IPU-Link routing, GW-Link routing
  and sync types that were given; a mismatch is an error (PR504) unless ``update`` is set, which
  removes it and creates it again under the same name;
- a named partition that does not exist is created with ``update`` set, else it is an error (PR500);
- poprun creates non-reconfigurable partitions only, never resets one it has just made, and
  removes what it made at exit unless ``remove`` is false, on every exit path;
- an existing partition is reset when ``reset`` says so; by default a non-reconfigurable one is
  and a reconfigurable one is not;
- the final state after create or reset is polled until it settles and must be ``PS_ACTIVE``;
  create/reset is tried ``attempts`` times in all (PR507).

The partition is leased to this launch before it is checked or changed (created and leased in
one step), so two launches cannot both get it (PR506). :func:`probe` is the planning side: a
bounded look at the server that never fails the plan.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Self

from popdist import env as names
from poprun.core.diagnostic import Diagnostic, DiagnosticError
from poprun.core.record import record
from poprun.core.threads import spawn
from poprun.partitions import report
from poprun.partitions.choice import provider_for
from poprun.partitions.provider import (
    CapacityError,
    ExistsError,
    InUseError,
    MalformedAnswerError,
    NotFoundError,
    Owner,
    PartitionInfo,
    PartitionRequest,
    PartitionState,
    Provider,
    ProviderError,
    UnreachableError,
)
from poprun.planner import plan

LEASE_TTL_S = 60.0  # a dead launch's lease is free this long after its last renewal, at most
_POLL_FIRST_S, _POLL_MAX_S = 0.05, 1.0


@record
class Decision:
    """What to do with the partition ``name``: ``use``, ``create`` or ``update``, and whether to reset it."""

    name: str
    action: str
    reset: bool
    existing: PartitionInfo | None
    differences: tuple[str, ...] = ()

    def describe(self) -> tuple[str, ...]:
        """Return the decision as plan action lines."""
        if self.action == "use":
            lines = [f"use partition {report.describe(self.existing)}" if self.existing else f"use '{self.name}'"]
        elif self.action == "create":
            lines = [f"create partition '{self.name}' (non-reconfigurable)"]
        else:
            lines = [f"remove partition '{self.name}' and create it again: " + "; ".join(self.differences)]
        lines.append("reset it before running" if self.reset else "do not reset it")
        return tuple(lines)


def differences(partition: plan.Partition, info: PartitionInfo) -> tuple[str, ...]:
    """Return how ``info`` fails the plan's partition section (empty when it fits), changelogs 2.0-2.2."""
    found: list[str] = []
    if info.reconfigurable:
        if info.size < partition.num_ipus:
            found.append(f"{info.size} IPUs, the launch needs {partition.num_ipus}")
    else:
        for what, have, want in (("IPU", info.size, partition.num_ipus), ("GCD", info.num_gcds, partition.num_gcds),
                                 ("ILD", info.num_ilds or partition.num_ilds, partition.num_ilds),
                                 ("replica", info.num_replicas or partition.num_gcds, partition.num_gcds)):
            if have != want:
                found.append(f"{report.plural(have, what)}, the launch needs {want}")
    for kind, found_type, wanted in (("IPU-Link routing type", info.ipu_link_routing_type, partition.ipu_link_routing_type),
                             ("GW-Link routing type", info.gw_link_routing_type, partition.gw_link_routing_type),
                             ("sync type", info.sync_type, partition.sync_type)):
        if wanted and found_type and found_type.upper() != wanted.upper():
            found.append(f"{kind} {found_type}, the launch needs {wanted.upper()}")
    return tuple(found)


def choose_name(partition: plan.Partition, listed: Sequence[PartitionInfo], address: str) -> str:
    """
    Return the partition's name: the plan's, or the only one listed.

    Diagnostics:
        PR503: none named and several listed. PR500: none named and none listed.
    """
    if partition.name is not None:
        return partition.name
    if len(listed) == 1:
        return listed[0].name
    if not listed:
        raise DiagnosticError([report.not_found("(the only one)", (), address)])
    raise DiagnosticError([report.several(listed, address)])


def decide(partition: plan.Partition, name: str, existing: PartitionInfo | None,
           listed: Sequence[PartitionInfo], address: str) -> Decision:
    """
    Return what to do with ``name`` given the partition found (``existing``, None when absent).

    Diagnostics:
        PR500: absent and ``update`` not set. PR504: does not fit and ``update`` not set.
    """
    if existing is None:
        if not partition.update:
            raise DiagnosticError([report.not_found(name, listed, address)])
        return Decision(name=name, action="create", reset=False, existing=None)
    found = differences(partition, existing)
    if found and not partition.update:
        raise DiagnosticError([report.mismatch(name, found)])
    if found:
        return Decision(name=name, action="update", reset=False, existing=existing, differences=found)
    reset = partition.reset if partition.reset is not None else not existing.reconfigurable
    return Decision(name=name, action="use", reset=reset, existing=existing)


class Lease:
    """
    A partition held by this launch; a context manager whose exit releases it.

    ``release()`` ends the lease and, when poprun created the partition and the plan says
    ``remove``, removes it. It never raises: a failure becomes a PR508 warning in
    :attr:`warnings`, which the caller shows after the ``with`` block.
    """

    def __init__(self, *, partition: plan.Partition, provider: Provider, owner: Owner, decision: Decision,
                 info: PartitionInfo, ttl_s: float) -> None:
        self.name = decision.name
        self.info = info
        self.decision = decision
        self.created = decision.action in ("create", "update")
        self.warnings: list[Diagnostic] = []
        self._partition, self._provider, self._owner = partition, provider, owner
        self._stop = threading.Event()
        self._released = False
        self._heartbeat = spawn(self._renew, args=(ttl_s,), name="poprun-lease")

    @property
    def env(self) -> Mapping[str, str]:
        """The variables every instance needs to reach the partition (IPUOF_VIPU_API_*)."""
        return {names.VIPU_API_PARTITION_ID: self.name, names.VIPU_API_HOST: self._partition.server_host,
                names.VIPU_API_PORT: str(self._partition.server_port),
                names.VIPU_API_TIMEOUT: str(self._partition.timeout_s)}

    def _renew(self, ttl_s: float) -> None:
        while not self._stop.wait(ttl_s / 3):
            try:
                self._provider.lease(self.name, self._owner, ttl_s=ttl_s)
            except ProviderError:
                continue  # the server is away: the release at exit reports it

    def release(self) -> None:
        """Release the lease and remove what poprun created (unless ``remove`` is false); idempotent."""
        if self._released:
            return
        self._released = True
        self._stop.set()
        self._heartbeat.join()
        remove = self.created and self._partition.remove
        try:
            if remove:
                self._provider.remove(self.name, owner=self._owner)
            else:
                self._provider.release(self.name, self._owner)
        except NotFoundError:
            pass  # already gone: nothing left behind
        except ProviderError as exc:
            step = "remove the partition poprun created" if remove else "release its lease"
            self.warnings.append(report.not_released(self.name, step, exc.message))

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.release()


def acquire(partition: plan.Partition, provider: Provider, *, owner: str | Owner,
            ttl_s: float = LEASE_TTL_S, sleep: Callable[[float], None] = time.sleep) -> Lease:
    """
    Decide, act on and lease the plan's partition; return the :class:`Lease` (use it in ``with``).

    On an error, whatever this call leased or created is released or removed before it raises.

    Diagnostics:
        PR500, PR503, PR504 (the decision); PR501 server unreachable; PR505 not enough IPUs;
        PR506 in use by another launch; PR507 not active after create/reset; PR509 other refusals;
        PR510 an answer that is not a V-IPU answer (wrong shape, encoding or size).
    """
    who = owner if isinstance(owner, Owner) else Owner.this_process(owner)
    address, held, made = provider.address, "", [False]  # made[0]: this call created the partition
    try:
        name = choose_name(partition, provider.list() if partition.name is None else (), address)
        existing = provider.get(name)
        if existing is not None:
            provider.lease(name, who, ttl_s=ttl_s)
            held = name
            existing = provider.get(name) or existing  # as it is now that no one else can change it
        listed = provider.list() if existing is None and not partition.update else ()
        decision = decide(partition, name, existing, listed, address)
        held = name
        info = _act(partition, provider, decision, who, made=made, sleep=sleep)
        return Lease(partition=partition, provider=provider, owner=who, decision=decision, info=info, ttl_s=ttl_s)
    except BaseException as exc:
        if held:
            _undo(provider, held, who, remove=made[0] and partition.remove)
        if isinstance(exc, ProviderError):
            raise DiagnosticError([_diagnose(exc, partition, address)]) from exc
        raise


def connect(partition: plan.Partition, environ: Mapping[str, str]) -> Provider:
    """
    Return the provider of the plan's partition (:func:`~poprun.partitions.choice.provider_for`).

    Diagnostics:
        PR501: the in-process emulated service cannot be opened (its inventory or database).
    """
    try:
        return provider_for(partition, environ)
    except ProviderError as exc:
        raise DiagnosticError([_diagnose(exc, partition, f"{partition.server_host}:{partition.server_port}")]) from exc


def _act(partition: plan.Partition, provider: Provider, decision: Decision, owner: Owner, *,
         made: list[bool], sleep: Callable[[float], None]) -> PartitionInfo:
    """Create, update or reset as decided; return the partition once PS_ACTIVE (PR507 otherwise)."""
    request = PartitionRequest.from_plan(partition, decision.name)
    attempts = max(1, partition.attempts)
    for attempt in range(1, attempts + 1):
        if decision.action == "create" and attempt == 1:
            info = provider.create(request, owner=owner)
            made[0] = True
        elif decision.action in ("create", "update"):
            info = provider.update(request, owner=owner)
            made[0] = True
        elif decision.reset:
            info = provider.reset(decision.name)
        else:
            info = decision.existing or provider.get(decision.name) or _gone(decision.name)
        info = _settle(provider, info, deadline=time.monotonic() + partition.timeout_s, sleep=sleep)
        if info.state is PartitionState.PS_ACTIVE:
            return info
        if decision.action == "use" and not decision.reset:
            attempts = attempt
            break  # nothing to try again: poprun does not reset it
    step = {"create": "creation", "update": "removal and creation"}.get(decision.action,
                                                                           "reset" if decision.reset else "lookup")
    raise DiagnosticError([report.not_active(decision.name, info.state.value, step, attempts)])


def _gone(name: str) -> PartitionInfo:
    msg = f"partition {name} not found"
    raise NotFoundError(msg)


def _settle(provider: Provider, info: PartitionInfo, *, deadline: float,
            sleep: Callable[[float], None]) -> PartitionInfo:
    """Poll the partition while its state is settling (PS_PENDING, PS_RESETTING), until ``deadline``."""
    pause = _POLL_FIRST_S
    while info.state.settling and time.monotonic() < deadline:
        sleep(pause)
        pause = min(pause * 2, _POLL_MAX_S)
        info = provider.get(info.name) or _gone(info.name)
    return info


def _undo(provider: Provider, name: str, owner: Owner, *, remove: bool) -> None:
    """Give back what a failed acquisition holds; never raises (the first error is the one reported)."""
    try:
        if remove:
            provider.remove(name, owner=owner)
        else:
            provider.release(name, owner)
    except ProviderError:
        pass


def _diagnose(exc: ProviderError, partition: plan.Partition, address: str) -> Diagnostic:
    """Return the diagnostic of a provider error."""
    name = partition.name or "(the only one)"
    if isinstance(exc, UnreachableError):
        return report.unreachable(address, partition.timeout_s, exc.message)
    if isinstance(exc, MalformedAnswerError):
        return report.malformed(address, exc.message)
    if isinstance(exc, InUseError):
        return report.in_use(name, exc.holder)
    if isinstance(exc, ExistsError):  # another launch created it between our look and our create
        return report.in_use(name, "another launch created it first")
    if isinstance(exc, CapacityError):
        return report.capacity(name, partition.num_ipus, address, exc.message)
    if isinstance(exc, NotFoundError):
        return report.not_found(name, (), address)
    return report.request_failed(f"partition '{name}'", address, exc.message)


@record
class Probe:
    """What planning saw of the V-IPU server: its partitions, or why it did not answer."""

    address: str
    reachable: bool
    partitions: tuple[PartitionInfo, ...] = ()
    message: str = ""
    warnings: tuple[Diagnostic, ...] = ()


def probe(partition: plan.Partition, environ: Mapping[str, str], *, timeout_s: float = 0.5,
          provider: Provider | None = None) -> Probe:
    """
    Return the server's partitions, waiting at most about ``timeout_s``; never raises for the server.

    Diagnostics:
        PR502 (warning, in ``Probe.warnings``): unreachable; the partition actions are left to apply.
    """
    try:
        chosen = provider or provider_for(partition, environ, timeout_s=timeout_s)
    except ProviderError as exc:
        address = f"{partition.server_host}:{partition.server_port}"
        return Probe(address=address, reachable=False, message=exc.message,
                     warnings=(report.unreachable_at_planning(address, timeout_s, exc.message),))
    outcome: list[tuple[PartitionInfo, ...] | ProviderError] = []

    def look() -> None:
        try:
            outcome.append(chosen.list())
        except ProviderError as exc:
            outcome.append(exc)

    worker = spawn(look, name="poprun-probe")  # bounds DNS waits too
    worker.join(timeout_s)
    result = outcome[0] if outcome else UnreachableError(f"no answer within {timeout_s:g} s")
    if isinstance(result, ProviderError):
        why = result.message
        return Probe(address=chosen.address, reachable=False, message=why,
                     warnings=(report.unreachable_at_planning(chosen.address, timeout_s, why),))
    return Probe(address=chosen.address, reachable=True, partitions=result)


def plan_actions(partition: plan.Partition, seen: Probe) -> tuple[tuple[str, ...], tuple[Diagnostic, ...]]:
    """
    Return the partition actions as the probe lets planning decide them, and the diagnostics to show.

    Unreachable: the plan's actions, first marked as decided at apply time, with the probe's
    PR502 warning. Reachable: the decided actions; a decision that would fail at apply time
    (PR500, PR503, PR504) keeps the plan's actions and returns that diagnostic for the caller
    to show (planning does not stop for it: the world may change before apply).
    """
    if not seen.reachable:
        mark = f"decided at apply time: the V-IPU server at {seen.address} did not answer while planning"
        return (mark, *partition.actions), seen.warnings
    try:
        name = choose_name(partition, seen.partitions, seen.address)
        existing = next((i for i in seen.partitions if i.name == name), None)
        decision = decide(partition, name, existing, seen.partitions, seen.address)
    except DiagnosticError as exc:
        return partition.actions, exc.diagnostics
    at_exit = ("remove it at exit (poprun created it)" if partition.remove else "keep it at exit "
               "(--remove-partition=no)") if decision.action != "use" else "keep it at exit (poprun did not create it)"
    return (*decision.describe(), at_exit), ()
