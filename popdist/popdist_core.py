"""
The older spelling ``popdist.popdist_core.<function>``, as PopDist's compiled core module was named.

Standalone: standard library only; never imports ``poprun``. The same functions as ``popdist``'s
camelCase API (``popdist.popdist_core.getInstanceIndex() == popdist.getInstanceIndex()``).
"""

from __future__ import annotations

from popdist._backend import execute_on_instances, init
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
    initializeBackend,
    isBackendInitialized,
    isPopdistEnvSet,
    isUniformReplicasPerInstance,
)

__all__ = [
    "checkNumIpusPerReplica",
    "execute_on_instances",
    "finalizeBackend",
    "getDeviceId",
    "getDevices",
    "getInstanceIndex",
    "getLocalInstanceIndex",
    "getNumInstances",
    "getNumIpusPerReplica",
    "getNumLocalReplicas",
    "getNumTotalReplicas",
    "getReplicaIndexOffset",
    "init",
    "initializeBackend",
    "isBackendInitialized",
    "isPopdistEnvSet",
    "isUniformReplicasPerInstance",
]
