"""
The environment contract between the launcher (which writes it) and applications (which read it).

Standalone: standard library only; never imports ``poprun``. The launcher imports the
names from here, so they live in one place.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

# Set by real poprun for every instance (names and formats as it wrote them).
NUM_TOTAL_REPLICAS = "POPDIST_NUM_TOTAL_REPLICAS"
NUM_IPUS_PER_REPLICA = "POPDIST_NUM_IPUS_PER_REPLICA"
NUM_LOCAL_REPLICAS = "POPDIST_NUM_LOCAL_REPLICAS"
UNIFORM_REPLICAS_PER_INSTANCE = "POPDIST_UNIFORM_REPLICAS_PER_INSTANCE"
REPLICA_INDEX_OFFSET = "POPDIST_REPLICA_INDEX_OFFSET"
LOCAL_INSTANCE_INDEX = "POPDIST_LOCAL_INSTANCE_INDEX"
EXECUTABLE_CACHE_PATH = "POPDIST_EXECUTABLE_CACHE_PATH"
AUTOREPORT_DIRECTORY = "POPDIST_AUTOREPORT_DIRECTORY"
VIPU_API_HOST = "IPUOF_VIPU_API_HOST"
VIPU_API_PORT = "IPUOF_VIPU_API_PORT"
VIPU_API_PARTITION_ID = "IPUOF_VIPU_API_PARTITION_ID"
VIPU_API_TIMEOUT = "IPUOF_VIPU_API_TIMEOUT"
VIPU_API_GCD_ID = "IPUOF_VIPU_API_GCD_ID"
IPUOF_LOG_LEVEL = "IPUOF_LOG_LEVEL"
IPUOF_CONFIG_PATH = "IPUOF_CONFIG_PATH"
POPLAR_TARGET_OPTIONS = "POPLAR_TARGET_OPTIONS"
POPLAR_ENGINE_OPTIONS = "POPLAR_ENGINE_OPTIONS"

# Real poprun left the instance index and count to MPI; PopTorch reads these.
OMPI_RANK = "OMPI_COMM_WORLD_RANK"
OMPI_SIZE = "OMPI_COMM_WORLD_SIZE"
OMPI_LOCAL_RANK = "OMPI_COMM_WORLD_LOCAL_RANK"
OMPI_LOCAL_SIZE = "OMPI_COMM_WORLD_LOCAL_SIZE"

# Beyond poprun: explicit instance variables, and torchrun's, so its programs run unchanged.
INSTANCE_INDEX = "POPDIST_INSTANCE_INDEX"
NUM_INSTANCES = "POPDIST_NUM_INSTANCES"
TORCH_RANK = "RANK"
TORCH_WORLD_SIZE = "WORLD_SIZE"
TORCH_LOCAL_RANK = "LOCAL_RANK"
TORCH_LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
TORCH_MASTER_ADDR = "MASTER_ADDR"
TORCH_MASTER_PORT = "MASTER_PORT"

# Variables that real poprun always forwarded from the launching shell.
ALWAYS_FORWARDED = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH")


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    try:
        return int(raw)
    except ValueError:
        return default


@dataclasses.dataclass(frozen=True, kw_only=True)
class PopdistConfig:
    """
    One instance's view of the launch, as read from its environment.

    Every field has the documented default of the PopDist API when its variable is unset,
    so a program started without the launcher reads a single-instance, single-replica run.
    """

    is_set: bool
    num_total_replicas: int
    num_ipus_per_replica: int
    num_local_replicas: int
    uniform_replicas_per_instance: bool
    replica_index_offset: int
    local_instance_index: int
    instance_index: int
    num_instances: int
    executable_cache_path: str | None
    autoreport_directory: str | None
    vipu_partition: str | None
    vipu_server: str | None
    gcd_id: int | None


def from_environ(env: Mapping[str, str]) -> PopdistConfig:
    """Return the configuration the launcher gave to a process with environment ``env``."""
    total = max(_int(env, NUM_TOTAL_REPLICAS, 1), 1)
    local = max(_int(env, NUM_LOCAL_REPLICAS, 1), 1)
    offset = _int(env, REPLICA_INDEX_OFFSET, 0)
    # Fall back on MPI's rank and on the replica arithmetic third-party readers used.
    index = _int(env, INSTANCE_INDEX, _int(env, OMPI_RANK, offset // local))
    count = _int(env, NUM_INSTANCES, _int(env, OMPI_SIZE, max(total // local, 1)))
    server = env.get(VIPU_API_HOST)
    if server and env.get(VIPU_API_PORT):
        server = f"{server}:{env[VIPU_API_PORT]}"
    gcd = env.get(VIPU_API_GCD_ID)
    return PopdistConfig(
        is_set=NUM_TOTAL_REPLICAS in env,
        num_total_replicas=total,
        num_ipus_per_replica=max(_int(env, NUM_IPUS_PER_REPLICA, 1), 1),
        num_local_replicas=local,
        uniform_replicas_per_instance=env.get(UNIFORM_REPLICAS_PER_INSTANCE, "1") != "0",
        replica_index_offset=offset,
        local_instance_index=_int(env, LOCAL_INSTANCE_INDEX, 0),
        instance_index=index,
        num_instances=count,
        executable_cache_path=env.get(EXECUTABLE_CACHE_PATH) or None,
        autoreport_directory=env.get(AUTOREPORT_DIRECTORY) or None,
        vipu_partition=env.get(VIPU_API_PARTITION_ID) or None,
        vipu_server=server or None,
        gcd_id=int(gcd) if gcd and gcd.strip().isdigit() else None,
    )
