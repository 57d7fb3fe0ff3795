"""
The host-side backend of PopDist: ``init``, ``barrier``, ``execute_on_instances``, ``finalize``.

Standalone: standard library only (mpi4py when present); never imports ``poprun``. Sockets
and mpi4py are imported by :func:`init`, never by ``import popdist``. Which backend it opens:

- one instance (or no launcher at all): ``"single"``, nothing to connect, barriers return at once;
- a real MPI launcher started the process (``PMIX_RANK``/``PMI_RANK`` set: mpirun, real poprun)
  and ``mpi4py`` imports: ``"mpi"``, barriers on ``MPI.COMM_WORLD`` and its sub-communicators;
- otherwise (poprun's local and offline backends, which set ``OMPI_COMM_WORLD_*`` for
  compatibility but start no MPI runtime, or no mpi4py): ``"tcp"``, a standard-library
  rendezvous at instance 0 on ``MASTER_ADDR:MASTER_PORT+1`` (see :mod:`popdist._tcp`).

``execute_on_instances(instances, func)`` runs ``func`` on those instances only; while it runs,
:func:`barrier` there waits for those instances only, and afterwards every instance of the
enclosing group (all of them, at top level) waits for the others. Without :func:`init` there is
no barrier: ``func`` still runs only where asked, and a :class:`PopdistWarning` says so once.
Not thread-safe: call these from one thread, in the same order on every instance.
"""

from __future__ import annotations

import os
import warnings

from popdist import _contract as env
from popdist._contract import BackendError, PopdistWarning

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Collection
    from typing import Literal, ParamSpec, TypeVar

    from popdist._contract import Backend

    P = ParamSpec("P")
    R = TypeVar("R")

__all__ = ["DEFAULT_TIMEOUT_S", "BackendError", "PopdistWarning", "SingleBackend", "backend_name", "barrier",
           "execute_on_instances", "finalize", "init", "is_initialized"]

DEFAULT_TIMEOUT_S = 300.0


class SingleBackend:
    """The backend of a single instance: there is nobody to wait for."""

    name = "single"

    def barrier(self, group: frozenset[int], timeout_s: float | None) -> None:
        """Return at once."""

    def close(self) -> None:
        """Do nothing."""


class _State:
    """The backend of this process and the stack of ``execute_on_instances`` groups it is inside."""

    def __init__(self) -> None:
        self.backend: Backend | None = None
        self.groups: list[frozenset[int]] = []
        self.warned = False


_STATE = _State()


def init(*, backend: Literal["auto", "mpi", "tcp"] = "auto", timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """
    Initialise the backend; collective: every instance calls it, and it returns when all have.

    Calling it again does nothing until :func:`finalize`.

    Args:
        backend: ``"auto"`` (the module docstring's choice), ``"mpi"`` or ``"tcp"``.
        timeout_s: how long to wait for all instances to join (TCP only).

    Raises:
        BackendError: when the instances cannot meet within ``timeout_s``.
        ValueError: for an unknown ``backend``.
    """
    if _STATE.backend is None:
        _STATE.backend = _open(backend, timeout_s)


def _open(choice: str, timeout_s: float) -> Backend:
    """Return the backend ``init`` opens for ``choice`` in this process's environment."""
    if choice not in {"auto", "mpi", "tcp"}:
        raise ValueError(f"popdist backend must be 'auto', 'mpi' or 'tcp', not {choice!r}")
    index, count = env.instance_index(os.environ), env.num_instances(os.environ)
    if not 0 <= index < count:
        raise BackendError(f"instance index {index} is out of range for {count} instances")
    if count == 1:
        return SingleBackend()
    if choice == "mpi" or (choice == "auto" and env.launched_by_mpi(os.environ) and _has_mpi4py()):
        from popdist._mpi import MpiBackend

        return MpiBackend.open(index=index, count=count)
    from popdist._rendezvous import open_tcp

    host, port = env.master_address(os.environ)
    return open_tcp(index=index, count=count, host=host, port=port + 1, timeout_s=timeout_s)


def _has_mpi4py() -> bool:
    """Return whether mpi4py imports (``mpi4py`` alone: it does not start MPI)."""
    import importlib

    try:
        importlib.import_module("mpi4py")
    except ImportError:
        return False
    return True


def is_initialized() -> bool:
    """Return whether :func:`init` was called (and :func:`finalize` not since)."""
    return _STATE.backend is not None


def backend_name() -> str | None:
    """Return the open backend's name, ``"single"``, ``"tcp"`` or ``"mpi"``; ``None`` before :func:`init`."""
    return None if _STATE.backend is None else _STATE.backend.name


def finalize() -> None:
    """Close the backend; collective, like ``MPI_Finalize``. Does nothing when none is open."""
    backend, _STATE.backend = _STATE.backend, None
    if backend is not None:
        backend.close()


def barrier(*, timeout_s: float | None = None) -> None:
    """
    Wait until every instance of the current group has called ``barrier``.

    The current group is all instances, or inside ``execute_on_instances`` its instances.

    Raises:
        BackendError: without :func:`init` (and more than one instance), when an instance
            left, or after ``timeout_s`` seconds.
    """
    group = _current_group()
    if len(group) <= 1:
        return
    if _STATE.backend is None:
        raise BackendError("popdist.barrier() needs popdist.init() first: without a backend, instances cannot meet")
    _STATE.backend.barrier(group, timeout_s)


def execute_on_instances(
    instances: Collection[int], func: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs
) -> R | None:
    """
    Run ``func(*args, **kwargs)`` on the given instances only, then wait for them everywhere.

    Args:
        instances: instance indices, e.g. ``{0}``.
        func: what to run; inside it, :func:`barrier` waits for those instances only.
        *args: ``func``'s positional arguments.
        **kwargs: ``func``'s keyword arguments.

    Returns:
        ``func``'s result on the instances that ran it; ``None`` on the others.

    Raises:
        ValueError: for an index out of ``range(getNumInstances())``.
    """
    enclosing = _current_group()
    members = _members(instances, enclosing)
    result = None
    if env.instance_index(os.environ) in members:
        _STATE.groups.append(members)
        try:
            result = func(*args, **kwargs)
        finally:
            _STATE.groups.pop()
    _synchronise(enclosing, members)
    return result


def _current_group() -> frozenset[int]:
    """Return the instances that take part in a barrier called now."""
    if _STATE.groups:
        return _STATE.groups[-1]
    return frozenset(range(env.num_instances(os.environ)))


def _members(instances: Collection[int], enclosing: frozenset[int]) -> frozenset[int]:
    """Return the instances of ``enclosing`` that run the function; refuse indices out of range."""
    count = env.num_instances(os.environ)
    wrong = sorted(str(i) for i in instances if not isinstance(i, int) or not 0 <= i < count)
    if wrong:
        raise ValueError(f"no instance {', '.join(wrong)}: instance indices run from 0 to {count - 1}")
    return frozenset(instances) & enclosing


def _synchronise(group: frozenset[int], ran: frozenset[int]) -> None:
    """Wait for ``group`` after a function ran on ``ran``; warn once when no backend can."""
    if len(group) <= 1:
        return
    if _STATE.backend is not None:
        _STATE.backend.barrier(group, None)
    elif not _STATE.warned:
        _STATE.warned = True
        warnings.warn(f"popdist.init() was not called, so no instance waits for instances {sorted(ran)} to finish "
                      "in execute_on_instances; call popdist.init() first", PopdistWarning, stacklevel=3)
