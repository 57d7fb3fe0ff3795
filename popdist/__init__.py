"""
PopDist: what a program launched by poprun reads about its place in the launch.

Standalone: standard library only; never imports ``poprun``, nor PopTorch, TensorFlow or
PopART (``popdist.poptorch``, ``popdist.tensorflow`` and ``popdist.popart`` import them on use).
Cheap to import: sockets come with :func:`init` (and the first :func:`progress` that has
somewhere to send), ``dataclasses`` with :func:`current`.

- Pythonic: ``current()`` returns a frozen :class:`PopdistConfig`; ``shard_range`` and
  ``replica_indices`` share items out; ``device_id``; ``devices`` (the accelerators poprun gave the instance); the backend ``init``, ``barrier``,
  ``execute_on_instances``, ``finalize``.
- Health: ``progress(step, total, **metrics)`` and ``heartbeat()`` tell poprun how the
  instance is doing (:mod:`popdist._progress`, imported on first use; no-ops without poprun).
- Drop-in: the historical camelCase functions (``getInstanceIndex`` ...) of :mod:`popdist.compat`,
  also as ``popdist.popdist_core.<name>``. ``docs/popdist.md`` lists every function.
"""

from popdist import popdist_core  # noqa: F401 - so that `import popdist` gives popdist.popdist_core.<name>
from popdist._backend import (
    BackendError,
    PopdistWarning,
    backend_name,
    barrier,
    execute_on_instances,
    finalize,
    init,
    is_initialized,
)
from popdist._device import device_id, devices
from popdist._shard import replica_indices, shard_range
from popdist.compat import (
    checkNumIpusPerReplica,
    finalizeBackend,
    getDeviceId,
    getDevices,
    getInstanceIndex,
    getLocalInstanceIndex,
    getNumInstances,
    getNumIpusPerReplica,
    getNumLocalReplicas,
    getNumTotalReplicas,
    getReplicaIndexOffset,
    getRestartCount,
    initializeBackend,
    isBackendInitialized,
    isPopdistEnvSet,
    isUniformReplicasPerInstance,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    from popdist._progress import heartbeat, progress
    from popdist.config import PopdistConfig, current, from_environ
del TYPE_CHECKING

# Names from popdist.config, imported on first use (it needs dataclasses).
_FROM_CONFIG = frozenset({"PopdistConfig", "current", "from_environ"})
# Names from popdist._progress, imported on first use (a program that never reports loads nothing).
_FROM_PROGRESS = frozenset({"heartbeat", "progress"})

__all__ = [
    "BackendError",
    "PopdistConfig",
    "PopdistWarning",
    "backend_name",
    "barrier",
    "checkNumIpusPerReplica",
    "current",
    "device_id",
    "devices",
    "execute_on_instances",
    "finalize",
    "finalizeBackend",
    "from_environ",
    "getDeviceId",
    "getDevices",
    "getInstanceIndex",
    "getLocalInstanceIndex",
    "getNumInstances",
    "getNumIpusPerReplica",
    "getNumLocalReplicas",
    "getNumTotalReplicas",
    "getReplicaIndexOffset",
    "getRestartCount",
    "heartbeat",
    "init",
    "initializeBackend",
    "isBackendInitialized",
    "isPopdistEnvSet",
    "isUniformReplicasPerInstance",
    "is_initialized",
    "progress",
    "replica_indices",
    "shard_range",
]


def __getattr__(name: str) -> object:
    """Return a name imported on first use: ``PopdistConfig``, ``current``, ``from_environ``; ``progress``, ``heartbeat``."""
    if name in _FROM_CONFIG:
        from popdist import config as module
    elif name in _FROM_PROGRESS:
        from popdist import _progress as module  # type: ignore[no-redef] # either module, then the name from it
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """Return the module's names, the lazily imported ones included."""
    return sorted(set(globals()) | _FROM_CONFIG | _FROM_PROGRESS)
