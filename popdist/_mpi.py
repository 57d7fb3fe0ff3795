"""
The MPI backend: barriers on ``MPI.COMM_WORLD`` through mpi4py, when a real MPI launcher started us.

Standalone: mpi4py (optional; found at run time) and the standard library; never imports
``poprun``; imported by ``popdist.init()`` only. Importing ``mpi4py.MPI`` initialises MPI; mpi4py
finalises it at exit, so :meth:`MpiBackend.close` leaves MPI running for Horovod and friends.
A barrier of a group of instances runs on a sub-communicator made for that group (collective
over its members only, ``MPI_Comm_create_group``) and kept for the next barrier of that group.
MPI barriers have no timeout.
"""

from __future__ import annotations

import importlib

from popdist._contract import BackendError

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


class MpiBackend:
    """Barriers on MPI communicators; the world communicator's ranks are the instance indices."""

    name = "mpi"

    def __init__(self, world: Any, count: int) -> None:
        self._world = world
        self._count = count
        self._groups: dict[frozenset[int], Any] = {}

    @classmethod
    def open(cls, *, index: int, count: int) -> MpiBackend:
        """
        Return the backend on ``MPI.COMM_WORLD``, checked against poprun's instance index and count.

        Raises:
            BackendError: when mpi4py is missing or MPI's ranks disagree with the launch.
        """
        try:
            mpi = importlib.import_module("mpi4py.MPI")
        except ImportError as exc:
            raise BackendError("popdist's MPI backend needs mpi4py (pip install mpi4py); it is not installed") from exc
        world = mpi.COMM_WORLD
        rank, size = int(world.Get_rank()), int(world.Get_size())
        if (rank, size) != (index, count):
            raise BackendError(f"MPI says rank {rank} of {size}, poprun says instance {index} of {count}: "
                               "was this process started by the mpirun that poprun ran?")
        return cls(world, count)

    def barrier(self, group: frozenset[int], timeout_s: float | None) -> None:  # noqa: ARG002 - MPI has no timeout
        """Return when every instance of ``group`` has called it."""
        self._communicator(group).Barrier()

    def _communicator(self, group: frozenset[int]) -> Any:
        if len(group) == self._count:
            return self._world
        if group not in self._groups:
            members = self._world.Get_group().Incl(sorted(group))
            self._groups[group] = self._world.Create_group(members)
        return self._groups[group]

    def close(self) -> None:
        """Wait for every instance, then free the group communicators (MPI itself stays up)."""
        try:
            self._world.Barrier()
        finally:
            for communicator in self._groups.values():
                communicator.Free()
            self._groups.clear()
