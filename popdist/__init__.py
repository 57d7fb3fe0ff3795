"""
PopDist: what a program launched by poprun reads about its place in the launch.

Standalone: standard library only; never imports ``poprun``. ``popdist.current()`` returns
a :class:`PopdistConfig`; the historical camelCase functions (``getInstanceIndex`` ...) are
kept for drop-in compatibility with existing applications.
"""

from __future__ import annotations

import os

from popdist.compat import (
    checkNumIpusPerReplica,
    getDeviceId,
    getInstanceIndex,
    getLocalInstanceIndex,
    getNumInstances,
    getNumIpusPerReplica,
    getNumLocalReplicas,
    getNumTotalReplicas,
    getReplicaIndexOffset,
    isPopdistEnvSet,
    isUniformReplicasPerInstance,
)
from popdist.env import PopdistConfig, from_environ

__all__ = [
    "PopdistConfig",
    "checkNumIpusPerReplica",
    "current",
    "from_environ",
    "getDeviceId",
    "getInstanceIndex",
    "getLocalInstanceIndex",
    "getNumInstances",
    "getNumIpusPerReplica",
    "getNumLocalReplicas",
    "getNumTotalReplicas",
    "getReplicaIndexOffset",
    "isPopdistEnvSet",
    "isUniformReplicasPerInstance",
]


def current() -> PopdistConfig:
    """Return this process's configuration, read from its environment now."""
    return from_environ(os.environ)
