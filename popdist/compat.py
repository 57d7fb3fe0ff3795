"""
PopDist's historical camelCase API, kept exactly as applications call it.

Standalone: standard library only. This module is the one place where camelCase names
are allowed (the naming lint is switched off for it).
"""

from __future__ import annotations

import os

from popdist.env import from_environ


def isPopdistEnvSet() -> bool:
    """Return whether the process was launched by poprun."""
    return from_environ(os.environ).is_set


def getNumTotalReplicas() -> int:
    """Return the total number of replicas (1 when unset)."""
    return from_environ(os.environ).num_total_replicas


def getNumLocalReplicas() -> int:
    """Return the number of replicas this instance controls (1 when unset)."""
    return from_environ(os.environ).num_local_replicas


def getNumIpusPerReplica() -> int:
    """Return the number of IPUs per replica (1 when unset)."""
    return from_environ(os.environ).num_ipus_per_replica


def checkNumIpusPerReplica(ipus_per_replica: int) -> bool:
    """Return False when the launcher set IPUs per replica to another value."""
    config = from_environ(os.environ)
    return not config.is_set or config.num_ipus_per_replica == ipus_per_replica


def getReplicaIndexOffset() -> int:
    """Return the global index of this instance's first replica (0 when unset)."""
    return from_environ(os.environ).replica_index_offset


def getInstanceIndex() -> int:
    """Return this instance's index in ``[0, getNumInstances())``."""
    return from_environ(os.environ).instance_index


def getNumInstances() -> int:
    """Return the number of instances (1 when unset)."""
    return from_environ(os.environ).num_instances


def getLocalInstanceIndex() -> int:
    """Return this instance's index among the instances of its host (0 when unset)."""
    return from_environ(os.environ).local_instance_index


def isUniformReplicasPerInstance() -> bool:
    """Return whether every instance controls the same number of replicas."""
    return from_environ(os.environ).uniform_replicas_per_instance


def getDeviceId(ipusPerReplica: int = 0) -> int:
    """
    Return the id of the Poplar device this instance should attach to.

    Without IPUs there is no device server to ask; the id follows the layout of a
    Poplar device list, where multi-IPU devices of ``n`` IPUs are numbered after the
    single-IPU ones: the device of this instance's local replicas.
    """
    config = from_environ(os.environ)
    per_replica = ipusPerReplica or config.num_ipus_per_replica
    return config.local_instance_index * per_replica * config.num_local_replicas
