"""
The Spec: what the user asked for, from any front end, with where each value came from.

Layer: ``poprun.planner``; imports ``poprun.core``.

Every field is ``None`` when the user did not say; the solver fills in defaults and
derived values. ``origin`` spans never take part in equality, so the same spec written
as flags, TOML or DSL compares equal.
"""

from __future__ import annotations

from poprun.core.record import evolve, field, fields, positional_record, record
from poprun.core.span import SourceSpan

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from typing import Generic, TypeVar

    T = TypeVar("T")
else:
    from poprun.core.record import Generic

    T = None


@positional_record
class Sourced(Generic[T]):
    """A value and the place the user wrote it."""

    value: T
    origin: SourceSpan = field(eq=False)


@record
class EnvVarSpec:
    """``-x NAME`` (``value`` None: forwarded from the launching shell) or ``-x NAME=VALUE``."""

    name: str
    value: str | None


@record
class InstanceArgsSpec:
    """``--instance-mpi-local-args=N:ARGS``: variables and mpirun arguments for one instance."""

    index: int
    env: tuple[EnvVarSpec, ...] = ()
    mpi_args: tuple[str, ...] = ()


SI = Sourced[int]
SB = Sourced[bool]
SS = Sourced[str]
STuple = Sourced[tuple[str, ...]]


@record
class Spec:
    """
    A launch as the user described it. Field names are the TOML keys of :mod:`option`.

    Invariant: values are already type-checked by the front end (integers are integers,
    booleans are booleans); ranges and cross-field rules are the solver's job.
    """

    hosts: STuple | None = None
    host_file: SS | None = None
    replicas: SI | None = None
    ipus_per_replica: SI | None = None
    instances: SI | None = None
    ilds: SI | None = None
    vipu_server_host: SS | None = None
    vipu_server_port: SI | None = None
    vipu_server_timeout: SI | None = None
    partition: SS | None = None
    allocation: SS | None = None
    update_partition: SB | None = None
    reset_partition: SB | None = None
    remove_partition: SB | None = None
    partition_attempts: SI | None = None
    sync_type: SS | None = None
    ipu_link_routing_type: SS | None = None
    gw_link_routing_type: SS | None = None
    executable_cache_path: SS | None = None
    mpi_global_args: STuple | None = None
    mpi_local_args: STuple | None = None
    env: tuple[Sourced[EnvVarSpec], ...] = ()
    instance_args: tuple[Sourced[InstanceArgsSpec], ...] = ()
    numa_aware: SB | None = None
    rank_order: SS | None = None  # given, natural or topology (docs/placement.md, "Rank order")
    network_topology: SS | None = None  # a topology.conf file, as the user wrote its path
    process_placement: SS | None = None
    devices_per_instance: SI | None = None  # accelerators per instance (docs/devices.md)
    device_visibility: SS | None = None  # own, local-rank-zero or all
    print_topology: SB | None = None
    only_output_from_instance: SI | None = None
    offline_mode: SB | None = None
    offline_target: SS | None = None
    autoreport_dir: SS | None = None
    host_subnet: SS | None = None
    distribute_ssh_key: SB | None = None
    distribute_ssh_key_path: SS | None = None
    distribute_ssh_key_type: SS | None = None
    allow_run_as_root: SB | None = None
    verbosity: SI | None = None
    backend: SS | None = None
    program: STuple | None = None
    working_dir: SS | None = None
    mask: STuple | None = None  # variables whose values text output masks (--mask)
    # Recovery (docs/recovery.md): times are whole milliseconds, as written in seconds.
    max_restarts: SI | None = None
    restart_scope: SS | None = None
    restart_backoff: SI | None = None
    restart_backoff_max: SI | None = None
    min_uptime: SI | None = None
    crash_loop: SI | None = None
    never_retry: Sourced[tuple[int, ...]] | None = None  # exit statuses, sorted, once each
    pre_restart: SS | None = None
    timeout: SI | None = None
    stall_timeout: SI | None = None
    signal: Sourced[tuple[int, int]] | None = None  # (signal number, milliseconds before the timeout)
    # Membership (docs/membership.md): spare hosts, the fewest hosts, a health check on every host.
    spare_hosts: STuple | None = None
    min_hosts: SI | None = None
    health_check: SS | None = None
    health_check_timeout: SI | None = None  # milliseconds
    # Instance health (docs/progress.md): a silent instance is hung; what a straggler does.
    heartbeat_timeout: SI | None = None  # milliseconds
    straggler_policy: SS | None = None
    # Observe (docs/progress.md): a notifier for chosen events, the metrics file.
    notify: SS | None = None
    notify_on: SS | None = None  # comma-separated event kinds, or all
    notify_timeout: SI | None = None  # milliseconds
    metrics_file: SS | None = None


def overlay(base: Spec, top: Spec) -> Spec:
    """
    Return ``base`` with every value that ``top`` sets replaced by ``top``'s.

    This is ``--import-config`` (base, the file) under the command line (top). Lists are
    replaced, not merged: the seed's "command line arguments override the stored values".
    """
    changes = {}
    for spec_field in fields(Spec):
        value = getattr(top, spec_field.name)
        if value is not None and value != ():
            changes[spec_field.name] = value
    return evolve(base, **changes)
