"""
The environment contract as applications and the launcher import it: names, readers, config.

The variables' names, their readers, and (on use) :class:`~popdist.config.PopdistConfig` and
``from_environ``.

Standalone: standard library only; never imports ``poprun``. The names and readers live in
:mod:`popdist._contract` (which imports no other popdist module) and are re-exported here, so
that the launcher imports them from one public place. ``PopdistConfig`` and ``from_environ``
live in :mod:`popdist.config`, which reads through :mod:`popdist._contract`; this module sits
above both and imports ``popdist.config`` on first use only (it needs ``dataclasses``).
"""

from __future__ import annotations

from popdist._contract import (
    ALWAYS_FORWARDED,
    AUTOREPORT_DIRECTORY,
    DEFAULT_MASTER_ADDR,
    DEFAULT_MASTER_PORT,
    EXECUTABLE_CACHE_PATH,
    INSTANCE_INDEX,
    IPUOF_CONFIG_PATH,
    IPUOF_LOG_LEVEL,
    LOCAL_INSTANCE_INDEX,
    MPI_RUNTIME_MARKERS,
    NUM_INSTANCES,
    NUM_IPUS_PER_REPLICA,
    NUM_LOCAL_REPLICAS,
    NUM_TOTAL_REPLICAS,
    OMPI_LOCAL_RANK,
    OMPI_LOCAL_SIZE,
    OMPI_RANK,
    OMPI_SIZE,
    POPLAR_ENGINE_OPTIONS,
    POPLAR_TARGET_OPTIONS,
    REPLICA_INDEX_OFFSET,
    TORCH_LOCAL_RANK,
    TORCH_LOCAL_WORLD_SIZE,
    TORCH_MASTER_ADDR,
    TORCH_MASTER_PORT,
    TORCH_RANK,
    TORCH_WORLD_SIZE,
    UNIFORM_REPLICAS_PER_INSTANCE,
    VIPU_API_GCD_ID,
    VIPU_API_HOST,
    VIPU_API_PARTITION_ID,
    VIPU_API_PORT,
    VIPU_API_TIMEOUT,
    instance_index,
    integer,
    is_set,
    launched_by_mpi,
    local_instance_index,
    master_address,
    num_instances,
    num_ipus_per_replica,
    num_local_replicas,
    num_total_replicas,
    replica_index_offset,
    uniform_replicas_per_instance,
)

TYPE_CHECKING = False
if TYPE_CHECKING:
    # Re-exported for type checkers: at run time, __getattr__ below imports them on use.
    from popdist.config import PopdistConfig as PopdistConfig  # noqa: PLC0414
    from popdist.config import from_environ as from_environ  # noqa: PLC0414

__all__ = [
    "ALWAYS_FORWARDED",
    "AUTOREPORT_DIRECTORY",
    "DEFAULT_MASTER_ADDR",
    "DEFAULT_MASTER_PORT",
    "EXECUTABLE_CACHE_PATH",
    "INSTANCE_INDEX",
    "IPUOF_CONFIG_PATH",
    "IPUOF_LOG_LEVEL",
    "LOCAL_INSTANCE_INDEX",
    "MPI_RUNTIME_MARKERS",
    "NUM_INSTANCES",
    "NUM_IPUS_PER_REPLICA",
    "NUM_LOCAL_REPLICAS",
    "NUM_TOTAL_REPLICAS",
    "OMPI_LOCAL_RANK",
    "OMPI_LOCAL_SIZE",
    "OMPI_RANK",
    "OMPI_SIZE",
    "POPLAR_ENGINE_OPTIONS",
    "POPLAR_TARGET_OPTIONS",
    "REPLICA_INDEX_OFFSET",
    "TORCH_LOCAL_RANK",
    "TORCH_LOCAL_WORLD_SIZE",
    "TORCH_MASTER_ADDR",
    "TORCH_MASTER_PORT",
    "TORCH_RANK",
    "TORCH_WORLD_SIZE",
    "UNIFORM_REPLICAS_PER_INSTANCE",
    "VIPU_API_GCD_ID",
    "VIPU_API_HOST",
    "VIPU_API_PARTITION_ID",
    "VIPU_API_PORT",
    "VIPU_API_TIMEOUT",
    "PopdistConfig",
    "from_environ",
    "instance_index",
    "integer",
    "is_set",
    "launched_by_mpi",
    "local_instance_index",
    "master_address",
    "num_instances",
    "num_ipus_per_replica",
    "num_local_replicas",
    "num_total_replicas",
    "replica_index_offset",
    "uniform_replicas_per_instance",
]


def __getattr__(name: str) -> object:
    """Return ``PopdistConfig`` or ``from_environ``, which moved to :mod:`popdist.config` (imported on use)."""
    if name in {"PopdistConfig", "from_environ"}:
        from popdist import config

        return getattr(config, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
