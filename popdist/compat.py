"""
PopDist's historical camelCase API, kept exactly as applications call it.

Standalone: standard library only; never imports ``poprun``. This module is the one place
where camelCase names are allowed (the naming lint is switched off for it): the core
functions re-exported by ``popdist`` and ``popdist.popdist_core``, the backend's C++-style
names, and PopART's two (re-exported by ``popdist.popart``, which imports PopART on use).
Every function reads the environment at call time, with the documented defaults when unset.
"""

from __future__ import annotations

import os

from popdist import _backend, _device, _framework
from popdist import _contract as env

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any


def isPopdistEnvSet() -> bool:
    """Return whether the process was launched by poprun."""
    return env.is_set(os.environ)


def getNumTotalReplicas() -> int:
    """Return the total number of replicas (1 when unset)."""
    return env.num_total_replicas(os.environ)


def getNumLocalReplicas() -> int:
    """Return the number of replicas this instance controls (1 when unset)."""
    return env.num_local_replicas(os.environ)


def getNumIpusPerReplica() -> int:
    """Return the number of IPUs per replica (1 when unset)."""
    return env.num_ipus_per_replica(os.environ)


def checkNumIpusPerReplica(expected: int) -> bool:
    """Return False when the launcher set IPUs per replica to another value than ``expected`` (True when unset)."""
    return not env.is_set(os.environ) or env.num_ipus_per_replica(os.environ) == expected


def getReplicaIndexOffset() -> int:
    """Return the global index of this instance's first replica (0 when unset)."""
    return env.replica_index_offset(os.environ)


def getInstanceIndex() -> int:
    """Return this instance's index in ``[0, getNumInstances())`` (0 when unset)."""
    return env.instance_index(os.environ)


def getRestartCount() -> int:
    """Return how many times poprun restarted the instances before this attempt (0 when unset)."""
    return env.restart_count(os.environ)


def getNumInstances() -> int:
    """Return the number of instances (1 when unset)."""
    return env.num_instances(os.environ)


def getLocalInstanceIndex() -> int:
    """Return this instance's index among the instances of its host (0 when unset)."""
    return env.local_instance_index(os.environ)


def isUniformReplicasPerInstance() -> bool:
    """Return whether every instance controls the same number of replicas (True when unset)."""
    return env.uniform_replicas_per_instance(os.environ)


def getDeviceId(ipusPerReplica: int | None = 0, *, ipus_per_replica: int | None = None) -> int:
    """
    Return the id of the Poplar device this instance attaches to (see :mod:`popdist._device`).

    Args:
        ipusPerReplica: IPUs per replica; 0 or None reads ``POPDIST_NUM_IPUS_PER_REPLICA``.
        ipus_per_replica: the same, as the user guide spells it (``getDeviceId(ipus_per_replica=2)``).
    """
    return _device.device_id(ipus_per_replica or ipusPerReplica)


def getDevices() -> list[int]:
    """Return this instance's accelerators as the program numbers them (``POPDIST_DEVICES``; empty: none assigned)."""
    return list(_device.devices())


def isBackendInitialized() -> bool:
    """Return whether the host-side backend is initialised (``popdist.init()``)."""
    return _backend.is_initialized()


def initializeBackend() -> None:
    """Initialise the host-side backend; the same as ``popdist.init()``."""
    _backend.init()


def finalizeBackend() -> None:
    """Close the host-side backend; the same as ``popdist.finalize()``."""
    _backend.finalize()


def configureSessionOptions(opts: Any) -> None:
    """
    Configure PopART session options for this instance's share of the launch.

    Sets distributed replicated graphs (global replication factor and replica offset), the
    local replication factor and, when poprun gave one, the executable cache.

    Args:
        opts: a ``popart.SessionOptions``.

    Raises:
        ImportError: when PopART is not installed.
    """
    _framework.require_popart()
    opts.enableDistributedReplicatedGraphs = True
    opts.globalReplicationFactor = getNumTotalReplicas()
    opts.globalReplicaOffset = getReplicaIndexOffset()
    opts.enableReplicatedGraphs = True
    opts.replicatedGraphCount = getNumLocalReplicas()
    cache = os.environ.get(env.EXECUTABLE_CACHE_PATH)
    if cache:
        opts.enableEngineCaching = True
        opts.cachePath = cache


def getDevice(ipusPerReplica: int) -> Any:
    """
    Return this instance's PopART device, attached.

    Raises:
        ImportError: when PopART is not installed.
        RuntimeError: when the device cannot be acquired.
    """
    popart = _framework.require_popart()
    device_id = getDeviceId(ipusPerReplica)
    device = popart.DeviceManager().acquireDeviceById(device_id)
    if device is None:
        raise RuntimeError(f"popdist could not acquire IPU device {device_id} (IPUs per replica: {ipusPerReplica}, "
                           f"local replicas: {getNumLocalReplicas()}); is it free, and in this partition?")
    return device
