"""
What a popdist backend is: the ``Backend`` protocol and the errors every backend raises.

Standalone: standard library only; never imports ``poprun``, nor any backend. The backends
(:mod:`popdist._mpi`, :mod:`popdist._tcp` through :mod:`popdist._rendezvous`) import their
types from here, and :mod:`popdist._backend`, above them all, chooses which one ``init`` opens.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Protocol

    class Backend(Protocol):
        """What ``init`` opens: barriers among groups of instances, and a collective close."""

        name: str

        def barrier(self, group: frozenset[int], timeout_s: float | None) -> None:
            """Return once every instance of ``group`` (which holds this one) has called it."""

        def close(self) -> None:
            """Wait for every instance to close, then release the connections."""


class BackendError(RuntimeError):
    """The instances could not meet: one left, could not be reached, or a barrier timed out."""


class PopdistWarning(RuntimeWarning):
    """popdist did less than asked, e.g. no synchronisation because ``popdist.init()`` was not called."""
