"""
The backend registry: a backend name to a factory that imports its module lazily.

Layer: ``poprun.backends``; imports ``poprun.core`` and :mod:`poprun.backends.base`. A
registry is an object passed in (:func:`default_registry` builds the built-in one), never a
global cache, so tests can make their own.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from poprun.backends.base import Backend
from poprun.core.hint import suggestion_hint

Factory = Callable[[], Backend]

# Names that belong to backends of the design that this version does not ship yet.
PLANNED = ("mpirun", "slurm", "ssh")


def _local() -> Backend:
    from poprun.backends.local import LocalBackend

    return LocalBackend()


def _offline() -> Backend:
    from poprun.backends.offline import OfflineBackend

    return OfflineBackend()


class BackendRegistry:
    """Backends by name. A name registered twice must be registered with the same factory."""

    def __init__(self, factories: Mapping[str, Factory] | None = None) -> None:
        self._factories: dict[str, Factory] = dict(factories or {})

    def register(self, name: str, factory: Factory) -> None:
        """
        Register ``factory`` under ``name``.

        Raises:
            ValueError: when a different factory already has that name.
        """
        known = self._factories.get(name)
        if known is not None and known is not factory:
            msg = f"backend '{name}' is already registered with another factory"
            raise ValueError(msg)
        self._factories[name] = factory

    def names(self) -> tuple[str, ...]:
        """Return the registered names, sorted."""
        return tuple(sorted(self._factories))

    def get(self, name: str) -> Backend:
        """
        Return a new backend of the given name.

        Raises:
            KeyError: for a name that is not registered; its one argument is a one-line
                message with a did-you-mean (PR401 once that code is registered).
        """
        factory = self._factories.get(name)
        if factory is not None:
            return factory()
        if name in PLANNED:
            msg = f"backend '{name}' is not available in this version"
        else:
            hint = suggestion_hint(name, self.names(), noun="backend")
            msg = f"unknown backend '{name}': {hint}"
        raise KeyError(msg)


def default_registry() -> BackendRegistry:
    """Return a registry of the built-in backends (``local``, ``offline``)."""
    return BackendRegistry({"local": _local, "offline": _offline})
