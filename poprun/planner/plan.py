"""
The LaunchPlan: everything a backend needs to run a launch, decided and explained.

Layer: ``poprun.planner``; imports ``poprun.core`` and the traits table (:mod:`trait`).

A plan is complete and immutable: backends execute it and never decide placement, indices
or environment. Its JSON form (:mod:`serde`) is versioned and deterministic; the keys of
``docs/plan-format.md`` are stable.

Length: one record per key of the plan format, each with its defaults for older plans; the
format is read here in one place, in the order of docs/plan-format.md (a module per key would
scatter it without making any record shorter).
"""

from __future__ import annotations

from collections.abc import Mapping

from poprun.core.record import evolve, record
from poprun.planner.trait import CONSERVATIVE, Traits

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from typing import Any

FORMAT_VERSION = 1


@record
class Topology:
    """The numbers of the launch. Invariant: the division rules of the solver all hold."""

    num_replicas: int
    num_instances: int
    num_ilds: int
    ipus_per_replica: int
    hosts: tuple[str, ...]
    num_ipus: int
    replicas_per_instance: int
    instances_per_host: int
    instances_per_ild: int


@record
class Environment:
    """
    One instance's environment.

    ``set`` holds values decided at plan time, sorted by name. ``forward`` names variables
    taken from the launching shell when the plan is applied (never stored by value, so a
    saved plan holds no secrets). ``unset`` names variables removed.
    """

    set: tuple[tuple[str, str], ...]
    forward: tuple[str, ...]
    unset: tuple[str, ...]

    def get(self, name: str) -> str | None:
        """Return the value set for ``name``, or None."""
        return next((value for key, value in self.set if key == name), None)

    def as_dict(self) -> dict[str, str]:
        """Return the set values as a dict."""
        return dict(self.set)


@record
class Placement:
    """
    How an instance is placed on its host's CPUs and memory.

    ``numa_nodes`` and ``cpus`` are the instance's binding, in the kernel's list syntax
    (``0-3``); both empty when it is not bound (NUMA awareness off, ``disabled``, or a host
    whose topology was not known when planning: see ``reason``).
    """

    numa_aware: bool
    strategy: str
    numa_nodes: str = ""
    cpus: str = ""
    reason: str = ""


@record
class Instance:
    """One process that will exist. Instance ``index`` controls replicas ``[offset, offset+n)``."""

    index: int
    host: str
    local_index: int
    ild: int
    gcd: int
    replica_offset: int
    num_local_replicas: int
    argv: tuple[str, ...]
    cwd: str
    env: Environment
    placement: Placement
    mpi_local_args: tuple[str, ...]
    # The leaf switch or block the host sits under (rank order topology). Added later: older plans lack it.
    group: str | None = None
    # The instance's devices (--devices-per-instance): each device's index on its host (its number in
    # PCI bus order: nvidia-smi's, CUDA's under CUDA_DEVICE_ORDER=PCI_BUS_ID), as text. Added later:
    # plans written before lack it, and load with none; written only when not empty.
    devices: tuple[str, ...] = ()


@record
class Partition:
    """
    The V-IPU partition the launch uses, and what poprun may do to it.

    ``name`` None means "the only partition of the allocation", found at apply time.
    ``actions`` are decided at apply time from the partition found; here they are the
    allowed ones with the rule that allows each.
    """

    name: str | None
    allocation: str | None
    server_host: str
    server_port: int
    timeout_s: int
    num_ipus: int
    num_gcds: int
    num_ilds: int
    sync_type: str | None
    ipu_link_routing_type: str | None
    gw_link_routing_type: str | None
    update: bool
    reset: bool | None
    remove: bool
    attempts: int
    actions: tuple[str, ...]


@record
class Output:
    """How instance output reaches the user."""

    tag: bool
    output_filename: str | None
    only_from_instance: int | None
    print_topology: bool
    verbosity: int


@record
class Cache:
    """
    The executable cache.

    ``mode`` is ``disabled``, ``user`` (a fixed path the user owns) or ``temporary`` (made at
    apply time, one per host, removed on every exit path; its path is added to the instances'
    environment then, as POPDIST_EXECUTABLE_CACHE_PATH).
    """

    mode: str
    path: str | None
    per_host: bool
    remove_at_exit: bool


@record
class Mpi:
    """What the mpirun backend passes through, and the network settings."""

    global_args: tuple[str, ...]
    host_subnet: str | None
    allow_run_as_root: bool
    # The hosts with more instances than CPUs: their MPI processes yield when idle (mpi_yield_when_idle).
    crowded_hosts: tuple[str, ...] = ()
    # srun's MPI plugin (--mpi=) for a program that calls MPI under the slurm backend; None: srun's default.
    srun_plugin: str | None = None


@record
class SshKeyDistribution:
    """``--distribute-ssh-key``: copy a key to every host before launching."""

    enabled: bool
    key_path: str | None
    key_type: str | None


@record
class Recovery:
    """
    What poprun does when a run fails, runs too long or hangs; and whether it picks the port.

    The defaults are the behaviour before recovery existed (plans written then lack this
    record and load with them): no restart, no time limit, MASTER_PORT in the plan.

    Restarts: up to ``max_restarts`` for the whole run (one budget, whatever host or instance
    failed). ``scope`` ``all`` stops every instance and starts them all again; ``instance``
    starts only the failed one again (independent workers; backends that can). Before restart
    k (1-based) poprun waits ``min(backoff_ms * 2**(k-1), backoff_max_ms)`` milliseconds and runs
    ``pre_restart`` (a shell command on this machine; its failure ends the run). A failure
    whose status is in ``never_retry`` ends the run at once. Crash-loop guard: ``crash_loop``
    failures in a row, each within ``min_uptime_ms`` of its start, end the run.

    Times are milliseconds (a plan holds whole numbers only).

    Limits: ``timeout_ms`` for the whole run (0: none; reached: status 124); ``stall_timeout_ms``
    (0: none) ends the run when no instance has written output for that long. Before either
    ends the run, poprun collects where each Python instance was (its threads' stacks).
    ``signal`` (a signal number; 0: none) is sent to every instance ``signal_before_ms`` milliseconds
    before ``timeout_ms`` ends the run (a chance to checkpoint).

    Instance health (docs/progress.md; added later: older plans load with the defaults):
    ``heartbeat_timeout_ms`` (0: none): an instance that has reported progress or a heartbeat
    (popdist) in the current attempt and then is silent for that long is hung: its stack is read
    and the attempt ends as its failure (status 124; restarted within the budget). ``straggler_policy``
    ``warn`` tells of a straggler (an event), ``restart`` ends the attempt as the straggler's failure.

    ``choose_port``: MASTER_PORT is not in the plan; the apply step picks a free port (and the
    next one, popdist's hub) on instance 0's host for each attempt. False: the plan sets
    MASTER_PORT (the user's), which the apply step checks is free before starting.
    """

    max_restarts: int = 0
    scope: str = "all"
    backoff_ms: int = 1000
    backoff_max_ms: int = 30000
    min_uptime_ms: int = 5000
    crash_loop: int = 3
    never_retry: tuple[int, ...] = (2, 126, 127)
    pre_restart: str = ""
    timeout_ms: int = 0
    stall_timeout_ms: int = 0
    signal: int = 0
    signal_before_ms: int = 0
    choose_port: bool = False
    heartbeat_timeout_ms: int = 0
    straggler_policy: str = "warn"


NO_RECOVERY = Recovery()


@record
class Membership:
    """
    Which hosts a restart may leave out and what it runs on instead: the membership policy (docs/membership.md).

    When an attempt ends because a host was lost, failed its preflight or failed its health
    check, the next attempt is solved again (:func:`poprun.planner.membership.replan`): each
    such host is replaced by the first unused host of ``spares``; without one left, the plan
    shrinks by whole hosts, to no fewer than ``min_hosts``, each instance keeping its replicas.
    ``spec`` is the spec that made the plan, as TOML, which a re-plan solves again with other
    hosts ("" when no re-plan can change the hosts: no spares and no fewer hosts allowed).

    ``health_check`` (a shell command; "" for none) runs on every host, spares included,
    before the first start and before each restart, for at most ``health_check_timeout_ms``;
    a host where it fails or times out is treated as lost.

    The defaults are the behaviour before membership existed (plans written then lack this
    record and load with them): the same hosts on every attempt, and no health check.
    ``min_hosts`` 0 means the plan's own host count.
    """

    spares: tuple[str, ...] = ()
    min_hosts: int = 0
    health_check: str = ""
    health_check_timeout_ms: int = 30000
    spec: str = ""

    def smallest(self, hosts: int) -> int:
        """Return the fewest hosts a re-plan of a plan of ``hosts`` hosts may run on."""
        return self.min_hosts or hosts

    @property
    def replans(self) -> bool:
        """Whether a re-plan may change the hosts (a spec to solve again is kept)."""
        return bool(self.spec)


NO_MEMBERSHIP = Membership()


@record
class Observe:
    """
    Who hears of the run as it goes, beside its console, record and event stream (docs/progress.md).

    ``notify`` (a shell command; "" for none) runs on this machine for each event whose kind is
    in ``notify_on`` (``run-ended``, ``attempt-ended``, ``limit-reached``, ``straggler``,
    ``replan``), with the event's JSON line on its standard input, for at most
    ``notify_timeout_ms``; its failure is a warning and never changes the run. ``metrics_file``
    (an absolute path; "" for none) is an OpenMetrics text file of the run's state and each
    instance's progress, replaced once a second while the run lives and at its end.

    The defaults are the behaviour before these existed (plans written then lack this record
    and load with them): no notifier, no metrics file.
    """

    notify: str = ""
    notify_on: tuple[str, ...] = ("run-ended",)  # in the order of poprun.planner.observe.KINDS
    notify_timeout_ms: int = 10000
    metrics_file: str = ""

    @property
    def active(self) -> bool:
        """Whether the run has a notifier or a metrics file (then it has a progress receiver too)."""
        return bool(self.notify or self.metrics_file)


NO_OBSERVE = Observe()


@record
class RankGroup:
    """
    One group of hosts of a topology rank order: a leaf switch (tree) or a block, and the plan's hosts under it.

    ``hosts`` are in the plan's order (natural within the group); ``parents`` are the switches
    above a leaf switch, the nearest first (``()`` for a block, or a leaf that is a root).
    """

    name: str
    hosts: tuple[str, ...]
    parents: tuple[str, ...] = ()


@record
class RankOrder:
    """
    The order of the hosts, which instance indices follow (docs/placement.md, "Rank order").

    ``mode`` ``given``: the hosts as listed (the default, and the behaviour before rank orders
    existed: plans written then lack this record and load with it); ``natural``: by
    :func:`poprun.planner.rankorder.natural_key` (node7 before node66); ``topology``: grouped by
    ``groups``, the leaf switches (``kind`` ``tree``) or blocks (``block``) read from ``source``
    (the topology file's path, or ``scontrol show topology``), the groups in the order of a
    depth-first walk of the switches (blocks: in the file's order), the hosts natural within each.
    Instance *i* runs on ``topology.hosts[i // instances_per_host]``: the hosts are in this order.
    """

    mode: str = "given"
    source: str = ""
    kind: str = ""
    groups: tuple[RankGroup, ...] = ()

    def group_of(self, host: str) -> str | None:
        """Return the group whose hosts include ``host``, or None."""
        return next((g.name for g in self.groups if host in g.hosts), None)


NO_RANK_ORDER = RankOrder()


@record
class HostDevice:
    """One device of a host as the plan saw it (:class:`poprun.planner.machine.Device`)."""

    index: int
    vendor: str
    bus_id: str
    numa_node: int = -1
    name: str = ""
    uuid: str = ""


@record
class HostDevices:
    """A host's devices and where they were read (``sysfs``, ``sysfs+nvidia-smi``, ``recorded``, ``probe``...)."""

    host: str
    source: str
    devices: tuple[HostDevice, ...] = ()


@record
class Devices:
    """
    The devices each instance gets (``--devices-per-instance``, docs/devices.md).

    ``per_instance`` 0: none assigned (no ``*_VISIBLE_DEVICES`` is set: the behaviour before
    devices existed; plans written then lack this record and load with it). ``visibility``:
    ``own`` (an instance sees only its devices), ``local-rank-zero`` (only its devices, and
    ``LOCAL_RANK`` 0: torchrun's ``--virtual-local-rank``) or ``all`` (every device of its host;
    ``POPDIST_DEVICES`` names its own). ``variables``: what poprun sets for the vendor
    (``CUDA_VISIBLE_DEVICES`` and ``CUDA_DEVICE_ORDER``; ``ROCR_VISIBLE_DEVICES``).
    ``hosts``: each host's devices as discovered, which the instances' ``devices`` index.
    """

    per_instance: int = 0
    visibility: str = "own"
    variables: tuple[str, ...] = ()
    hosts: tuple[HostDevices, ...] = ()

    def of(self, host: str) -> HostDevices | None:
        """Return ``host``'s devices, or None."""
        return next((h for h in self.hosts if h.host == host), None)


NO_DEVICES = Devices()
DEVICE_VISIBILITIES = ("own", "local-rank-zero", "all")
# What poprun sets for a vendor's devices (docs/devices.md: why ROCR_VISIBLE_DEVICES and not HIP_VISIBLE_DEVICES too).
DEVICE_VARIABLES = {"nvidia": ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER"), "amd": ("ROCR_VISIBLE_DEVICES",)}


@record
class HostInterface:
    """
    The interface collectives use on one host (:mod:`poprun.planner.network`), and what chose it.

    ``interface`` "" with ``how`` "" means "read at launch" (the plan could not read the host): the
    apply step reads it before the first start and records it; with ``how`` ("not read: why"), the
    host could not be read, and its instances get no interface from poprun. ``address`` is the interface's address on
    the route, ``subnet`` its subnet in CIDR form (what mpirun's ``*_if_include`` take), ``how``
    the kernel's answer that chose it (``route get 10.0.0.1 -> eth0 src 10.0.0.2``) or the
    ``--host-subnet`` match.
    """

    host: str
    interface: str = ""
    address: str = ""
    subnet: str = ""
    how: str = ""


@record
class Network:
    """
    The network interface collectives use on each host (docs/network.md).

    ``source`` says how the interfaces are chosen: ``route`` (the interface on the route to
    ``master_addr``, read on each host), ``host-subnet`` (the interface whose address lies in
    ``subnet``), or ``none``: nothing is decided (one host, every instance on this machine, or
    offline; ``reason`` says which) and poprun sets none of the variables. ``user`` names the
    variables and MCA parameters the user set (``-x``, ``--mpi-global-args``): poprun sets none
    of those. ``sets`` names what poprun sets: ``GLOO_SOCKET_IFNAME`` and ``NCCL_SOCKET_IFNAME``
    per instance (its host's interface), and under the mpirun backend the MCA parameters
    ``btl_tcp_if_include`` and ``oob_tcp_if_include`` (the hosts' subnets). ``hosts`` holds one
    :class:`HostInterface` per host of the plan, in the plan's order.

    The defaults are the behaviour before this record existed (plans written then lack it and
    load with it): nothing decided, nothing set.
    """

    source: str = "none"
    reason: str = ""
    master_addr: str = ""
    subnet: str = ""
    user: tuple[str, ...] = ()
    sets: tuple[str, ...] = ()
    hosts: tuple[HostInterface, ...] = ()

    @property
    def pending(self) -> bool:
        """Whether an interface is left to read at launch (the apply step reads it before the first start)."""
        return self.source != "none" and bool(self.sets) and any(not h.interface and not h.how for h in self.hosts)

    def of(self, host: str) -> HostInterface | None:
        """Return ``host``'s interface record, or None."""
        return next((h for h in self.hosts if h.host == host), None)

    def mca_value(self) -> str:
        """Return what mpirun's ``*_if_include`` get: the hosts' subnets (CIDR), each once, comma-separated ("" if none)."""
        if self.source == "host-subnet":
            return self.subnet
        return ",".join(dict.fromkeys(h.subnet for h in self.hosts if h.subnet))


NO_NETWORK = Network()


DEFAULT_SOURCE = "default"  # the source of a setting not set in the planning shell


@record
class BackendSetting:
    """
    One setting the plan's backend reads (:mod:`poprun.planner.setting`), as the solver decided it.

    ``value`` is the setting's text as the backend reads it (``"16"``; ``"auto"`` for the
    fan-out's default of 4 per core; ``""`` for an unset path), ``source`` where it came from
    (``<env POPRUN_SSH_FANOUT>``, or ``default``).
    """

    name: str
    value: str
    source: str


@record
class BackendChoice:
    """
    The backend that runs the plan, why it was chosen, its traits and the settings it reads.

    ``traits`` and ``settings`` were added later: plans written before lack them and load with
    the built-in table's traits (:mod:`poprun.planner.trait`) and the settings' defaults
    (:mod:`poprun.planner.serde`). A backend reads its settings here, never from ``os.environ``,
    so that a saved plan runs with the settings it was planned with.
    """

    name: str
    reason: str
    traits: Traits = CONSERVATIVE
    settings: tuple[BackendSetting, ...] = ()  # sorted by name

    def setting(self, name: str, default: str = "") -> str:
        """Return setting ``name``'s value in this plan, or ``default`` when the plan has none."""
        return next((s.value for s in self.settings if s.name == name), default)

    def given_settings(self) -> dict[str, str]:
        """
        Return the settings the planning shell set (not those at their defaults) as the variables that set them.

        What a backend's readers of ``POPRUN_*`` variables read instead of the environment: the
        same answers as in the shell that made the plan, whatever the shell that runs it sets.
        """
        return {s.name: s.value for s in self.settings if s.source != DEFAULT_SOURCE}

    def with_settings(self, environ: Mapping[str, str]) -> dict[str, str]:
        """
        Return ``environ`` with this plan's settings in place of its own (a setting at its default: unset).

        For what a backend is asked without the plan (``run_on_host``, the port plan's command), so
        that it reads the plan's settings there too, not the launching shell's.
        """
        planned = {s.name for s in self.settings}
        return {k: v for k, v in environ.items() if k not in planned} | self.given_settings()


@record
class Decision:
    """One explained value: what it is, where it came from and why."""

    key: str
    value: str | int | bool
    source: str
    reason: str


@record
class Note:
    """A warning found while planning, kept in the plan so that saved plans carry it."""

    code: str
    summary: str
    hint: str


@record
class LaunchPlan:
    """A complete launch. Same input on the same Python gives an equal plan and the same JSON bytes."""

    format_version: int = FORMAT_VERSION
    poprun_version: str
    topology: Topology
    instances: tuple[Instance, ...]
    partition: Partition | None
    offline: bool
    offline_target: str | None
    output: Output
    cache: Cache
    mpi: Mpi
    ssh_keys: SshKeyDistribution
    backend: BackendChoice
    explanation: tuple[Decision, ...]
    warnings: tuple[Note, ...]
    # Variables whose values text output masks, beyond those whose names look secret (--mask).
    # Added later: plans written before lack it, and load with none.
    mask: tuple[str, ...] = ()
    # Restarts, time limits and the port plan. Added later: plans written before lack it, and load with none.
    recovery: Recovery = NO_RECOVERY
    # Spare hosts, the fewest hosts and the health check. Added later: plans written before lack it, and load with none.
    membership: Membership = NO_MEMBERSHIP
    # The notifier and the metrics file. Added later: plans written before lack it, and load with none.
    observe: Observe = NO_OBSERVE
    # The order of the hosts. Added later: plans written before lack it, and load with the given order.
    # Written to JSON only when it is not the given order (poprun.planner.serde).
    rank_order: RankOrder = NO_RANK_ORDER
    # The devices of each instance. Added later: plans written before lack it, and load with none;
    # written only when devices are assigned.
    devices: Devices = NO_DEVICES
    # The interface collectives use on each host. Added later: plans written before lack it, and load with none.
    network: Network = NO_NETWORK

    def with_instance_variables(self, variables: Mapping[int, Mapping[str, str]]) -> LaunchPlan:
        """Return this plan with ``variables[i]`` set in instance ``i``'s environment (values decided at apply time)."""
        if not variables:
            return self
        instances = tuple(with_set(i, variables[i.index]) if i.index in variables else i for i in self.instances)
        return evolve(self, instances=instances)

    def with_variables(self, variables: Mapping[str, str]) -> LaunchPlan:
        """Return this plan with ``variables`` set in every instance's environment (values decided at apply time)."""
        if not variables:
            return self
        instances = tuple(with_set(i, variables) for i in self.instances)
        return evolve(self, instances=instances)


def leave_out_defaults(plan: LaunchPlan, data: dict[str, Any]) -> dict[str, Any]:
    """
    Return ``data`` (``plan`` as JSON data) without the keys added later that are at their defaults.

    ``devices`` and each instance's ``devices`` are written only when devices are assigned, so
    that a plan without them is the same JSON as before they existed (and readers of that
    format read it). Loading fills them in with their defaults.
    """
    if plan.devices == NO_DEVICES and not any(i.devices for i in plan.instances):
        data.pop("devices", None)
        for instance in data.get("instances", ()):
            instance.pop("devices", None)
    return data


def with_set(instance: Instance, variables: Mapping[str, str]) -> Instance:
    """Return ``instance`` with ``variables`` set (and so no longer removed: a backend removes before it sets, or after)."""
    env = instance.env
    return evolve(instance, env=evolve(env, set=tuple(sorted((dict(env.set) | dict(variables)).items())),
                                       unset=tuple(name for name in env.unset if name not in variables)))
