"""
One instance's view of the launch as a frozen value: :class:`PopdistConfig`, :func:`current`.

Standalone: standard library only; never imports ``poprun``. Imported on first use (by
``popdist.current()`` and friends), not by ``import popdist``: ``dataclasses`` costs more to
import than the rest of popdist together. Every field is read by :mod:`popdist._contract`'s readers,
the same ones the camelCase API uses, so the two views always agree.
"""

from __future__ import annotations

import dataclasses
import os

from popdist import _contract as e

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping


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
    server = env.get(e.VIPU_API_HOST)
    if server and env.get(e.VIPU_API_PORT):
        server = f"{server}:{env[e.VIPU_API_PORT]}"
    gcd = env.get(e.VIPU_API_GCD_ID, "").strip()
    return PopdistConfig(
        is_set=e.is_set(env),
        num_total_replicas=e.num_total_replicas(env),
        num_ipus_per_replica=e.num_ipus_per_replica(env),
        num_local_replicas=e.num_local_replicas(env),
        uniform_replicas_per_instance=e.uniform_replicas_per_instance(env),
        replica_index_offset=e.replica_index_offset(env),
        local_instance_index=e.local_instance_index(env),
        instance_index=e.instance_index(env),
        num_instances=e.num_instances(env),
        executable_cache_path=env.get(e.EXECUTABLE_CACHE_PATH) or None,
        autoreport_directory=env.get(e.AUTOREPORT_DIRECTORY) or None,
        vipu_partition=env.get(e.VIPU_API_PARTITION_ID) or None,
        vipu_server=server or None,
        gcd_id=int(gcd) if gcd.isdigit() else None,
    )


def current() -> PopdistConfig:
    """Return this process's configuration, read from its environment now (never cached)."""
    return from_environ(os.environ)
