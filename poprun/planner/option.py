"""
PopRun's options as data: flags, TOML keys, DSL statements, kinds, defaults and help, in one table.

Layer: ``poprun.planner``; imports ``poprun.core`` and the value converters only. The flags
parser, the TOML front end, the DSL (its one-field statements, grammar rules and all),
``--export-config`` and ``--help`` all read this table, so they cannot drift apart: an option
that sets one spec field is one row here.
"""

from __future__ import annotations

from poprun.core.record import positional_record
from poprun.planner import value as conv
from poprun.planner.trait import NAMES

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

PLACEMENTS = ("spreadnuma", "scattersocket", "scatternuma", "close", "disabled")
SSH_KEY_TYPES = ("dsa", "ecdsa", "ed25519", "rsa")
SYNC_TYPES = ("ST_POD_NATIVE_DEFAULT", "ST_C2_COMPATIBLE", "ST_POD_NATIVE")
ROUTING_TYPES = ("DEFAULT", "DNC", "RINGSWNC", "RINGSWNC_ALL", "SWNC")
BACKENDS = NAMES  # the built-ins (poprun.planner.trait.BUILTIN), in the order --backend lists them
VERSION_FORMATS = ("text", "full-json", "full-text")
SCOPES = ("all", "instance")
STRAGGLER_POLICIES = ("warn", "restart")
RANK_ORDERS = ("given", "natural", "topology")  # poprun.planner.rankorder
DEVICE_VISIBILITIES = ("own", "local-rank-zero", "all")  # poprun.planner.plan.DEVICE_VISIBILITIES
FORMATS = ("text", "json", "toml", "dot", "sbatch", "svg", "png")  # plan: the first five; render: dot, svg, png


@positional_record
class Option:
    """
    One option. ``field`` is the :class:`Spec` field (None for command-line actions).

    ``kind`` says how its value is read: ``int`` (positive), ``nonneg``, ``port``, ``bool``,
    ``str``, ``path``, ``choice``, ``backend`` (a choice, or a plugin's name), ``hosts``, ``args`` (shell-split; repeats merge),
    ``names`` (comma-separated variable names; repeats merge),
    ``instance_args`` (``N:ARGS``; repeats add), ``subnet``, ``seconds`` (a number of seconds,
    decimals to the millisecond; held in milliseconds), ``statuses`` (comma-separated exit
    statuses, or ``none``), ``signal`` (``SIG@SECONDS``), ``count`` (no value),
    ``flag`` (no value), ``action`` (a command-line action with a value).

    The DSL statements of a row, each a string of keywords: ``dsl`` sets the field from the
    value that follows (``timeout 600``: a number for counts and ports, a path for paths, else
    a word), ``dsl_on`` / ``dsl_off`` set it without a value (``update`` / ``no update``: True /
    False; ``cache off``: the empty path). ``dsl_in`` says where they stand: at the start of a
    line (``""``), or as an option of ``partition (...)`` or ``ssh key (...)``.
    """

    flags: tuple[str, ...]
    field: str | None
    kind: str
    help: str
    section: str = ""
    key: str = ""
    default: str = ""
    choices: tuple[str, ...] = ()
    group: str = "General"
    dsl: str = ""
    dsl_on: str = ""
    dsl_off: str = ""
    dsl_in: str = ""

    @property
    def takes_value(self) -> bool:
        """Whether the option consumes a value."""
        return self.kind not in ("count", "flag")

    @property
    def name(self) -> str:
        """The long flag, for messages."""
        return next((f for f in self.flags if f.startswith("--")), self.flags[0])

    def convert(self, text: str) -> object:
        """
        Return the typed value of ``text`` for this option (kinds that take one word).

        Raises:
            InvalidValueError: when ``text`` is not a value of the option's kind.
        """
        converters: dict[str, Callable[[str], object]] = {
            "int": conv.to_positive_int, "nonneg": _nonneg, "count": _nonneg, "port": conv.to_port,
            "bool": conv.to_bool, "subnet": conv.to_subnet, "str": str, "path": str, "names": conv.to_names,
            "choice": lambda text: conv.to_choice(text, self.choices),
            "backend": lambda text: conv.to_backend(text, self.choices),
            "seconds": conv.to_millis, "statuses": conv.to_statuses, "signal": conv.to_signal,
        }
        return converters[self.kind](text)

    def text(self, value: object) -> str:
        """Return ``value`` written as :meth:`convert` reads it back (``1500`` ms -> ``1.5``)."""
        writers: dict[str, Callable[[Any], str]] = {
            "seconds": conv.seconds_text, "statuses": conv.statuses_text, "signal": conv.signal_text}
        return writers.get(self.kind, str)(value)


def _nonneg(text: str) -> int:
    number = conv.to_int(text)
    if number < 0:
        raise conv.InvalidValueError(f"{number} is negative", "use a whole number, 0 or more")
    return number


def _o(flags: str, field: str | None, kind: str, help_: str, where: str = "", **kw: object) -> Option:
    section, _, key = where.partition(".")
    return Option(tuple(flags.split()), field, kind, help_, section, key, **kw)  # type: ignore[arg-type]


OPTIONS: tuple[Option, ...] = (
    _o("--help -h", None, "flag", "Produce help message"),
    _o("--version", None, "flag", "Print the version and exit"),
    _o("--version-format", None, "action", "Version format: text, full-json or full-text", default="text",
       choices=VERSION_FORMATS),
    _o("-v --verbose", "verbosity", "count", "Verbose output", "run.verbosity", default="0", dsl="verbosity"),
    _o("-vv --vv", "verbosity", "count", "Very verbose output"),
    _o("-H --host", "hosts", "hosts", "A comma-separated list of hosts on which to invoke instances, "
       "e.g. host0,host1 or host[0-2,4]. The instances are divided evenly among the hosts",
       "topology.hosts", group="Topology"),
    _o("--host-file --hostfile", "host_file", "path", "A file with one host per line "
       "(mutually exclusive with --host)", "topology.host_file", group="Topology"),
    _o("--num-replicas", "replicas", "int", "The total number of replicas", "topology.replicas",
       default="1", group="Topology"),
    _o("--ipus-per-replica", "ipus_per_replica", "int", "The number of IPUs per replica",
       "topology.ipus_per_replica", default="1", group="Topology"),
    _o("--num-instances", "instances", "int", "The number of instances. The replicas are divided "
       "evenly among the instances", "topology.instances", default="1, or one per host", group="Topology"),
    _o("--num-ilds", "ilds", "int", "The number of IPU-Link domains. If not set, what the IPUs need",
       "topology.ilds", group="Topology"),
    _o("--vipu-server-host", "vipu_server_host", "str", "The host of the V-IPU server",
       "partition.server_host", default="localhost", group="V-IPU"),
    _o("--vipu-server-port", "vipu_server_port", "port", "The port number of the V-IPU server",
       "partition.server_port", default="8090", group="V-IPU",
       dsl="port", dsl_in="partition"),
    _o("--vipu-server-timeout", "vipu_server_timeout", "int", "The timeout for the V-IPU server "
       "requests (in seconds)", "partition.timeout", default="120", group="V-IPU",
       dsl="timeout", dsl_in="partition"),
    _o("--vipu-partition", "partition", "str", "Create/use the specified V-IPU partition",
       "partition.name", group="V-IPU"),
    _o("--vipu-allocation", "allocation", "str", "Use the specified V-IPU allocation when creating "
       "a partition", "partition.allocation", group="V-IPU", dsl="allocation", dsl_in="partition"),
    _o("--vipu-cluster", "allocation", "str", "(deprecated, use --vipu-allocation instead)",
       group="V-IPU"),
    _o("--update-partition", "update_partition", "bool", "Update the V-IPU partition if needed",
       "partition.update", default="no", group="V-IPU",
       dsl_on="update", dsl_off="no update", dsl_in="partition"),
    _o("--reset-partition", "reset_partition", "bool", "Reset the V-IPU partition before execution. "
       "If not set, non-reconfigurable partitions are reset, reconfigurable ones are not",
       "partition.reset", group="V-IPU",
       dsl_on="reset", dsl_off="no reset", dsl_in="partition"),
    _o("--remove-partition", "remove_partition", "bool", "Remove a partition PopRun created after "
       "execution", "partition.remove", default="yes", group="V-IPU",
       dsl_on="remove", dsl_off="keep", dsl_in="partition"),
    _o("--vipu-partition-attempts", "partition_attempts", "int", "Retry this many times when the "
       "partition does not end up in ACTIVE state", "partition.attempts", default="1", group="V-IPU",
       dsl="attempts", dsl_in="partition"),
    _o("--sync-type", "sync_type", "choice", "Sync type of a partition PopRun creates or checks",
       "partition.sync_type", choices=SYNC_TYPES, group="V-IPU", dsl="sync", dsl_in="partition"),
    _o("--ipu-link-routing-type", "ipu_link_routing_type", "choice", "IPU-Link routing type of the "
       "partition", "partition.ipu_link_routing_type", choices=ROUTING_TYPES, group="V-IPU",
       dsl="ipu-link routing", dsl_in="partition"),
    _o("--gw-link-routing-type", "gw_link_routing_type", "choice", "GW-Link routing type of the "
       "partition", "partition.gw_link_routing_type", choices=ROUTING_TYPES, group="V-IPU",
       dsl="gw-link routing", dsl_in="partition"),
    _o("--executable-cache-path", "executable_cache_path", "path", "Use the specified directory as "
       'an executable cache path ("" disables caching)', "cache.path", group="Execution",
       dsl="cache", dsl_off="cache off"),
    _o("--mpi-global-args", "mpi_global_args", "args", "Global options to be passed to mpirun",
       "mpi.global_args", group="MPI"),
    _o("--mpi-local-args", "mpi_local_args", "args", "Local (per-instance) options to be passed to "
       "mpirun", "mpi.local_args", group="MPI"),
    _o("--instance-mpi-local-args", None, "instance_args", "Options for one instance: "
       "INDEX:ARGS, e.g. 0:-x VAR=VALUE", group="MPI"),
    _o("--numa-aware", "numa_aware", "bool", "Bind instances to NUMA nodes in a round-robin "
       "fashion", "placement.numa_aware", default="on with several instances per host", group="Placement",
       dsl_on="numa aware", dsl_off="numa unaware"),
    _o("--rank-order", "rank_order", "choice", "The order of the hosts, which instance indices follow: given (as "
       "listed), natural (node7 before node66) or topology (grouped by leaf switch or block of --network-topology, or "
       "of Slurm inside an allocation)", "placement.rank_order", default="given, or topology with --network-topology",
       choices=RANK_ORDERS, group="Placement", dsl="rank order"),
    _o("--network-topology", "network_topology", "path", "A file in Slurm's topology.conf form (SwitchName/Switches/"
       "Nodes, or BlockName/Nodes) for --rank-order topology", "placement.network_topology", group="Placement",
       dsl="network topology"),
    _o("--process-placement", "process_placement", "choice", "Placement strategy: spreadnuma, "
       "scattersocket, scatternuma, close or disabled", "placement.strategy", default="spreadnuma",
       choices=PLACEMENTS, group="Placement", dsl="placement"),
    _o("--devices-per-instance", "devices_per_instance", "int", "Give each instance this many accelerators (GPUs) "
       "of its host, NUMA-near first, set CUDA_VISIBLE_DEVICES (or ROCR_VISIBLE_DEVICES) and bind its CPUs to their "
       "NUMA node (docs/devices.md)", "placement.devices_per_instance", default="none: no device is assigned",
       group="Placement", dsl="devices per instance"),
    _o("--device-visibility", "device_visibility", "choice", "What an instance sees of its host's devices: own (only "
       "its devices), local-rank-zero (only its devices, and LOCAL_RANK=0 as torchrun's --virtual-local-rank) or all "
       "(every device; POPDIST_DEVICES names its own)", "placement.device_visibility", default="own",
       choices=DEVICE_VISIBILITIES, group="Placement", dsl="device visibility"),
    _o("--print-topology", "print_topology", "bool", "Print topology table", "output.print_topology",
       default="no", group="Output", dsl_on="print topology", dsl_off="no print topology"),
    _o("--only-output-from-instance", "only_output_from_instance", "nonneg", "Suppress the output "
       "from all other instances", "output.only_from_instance", group="Output",
       dsl="output from instance"),
    _o("--offline-mode", "offline_mode", "bool", "Run without requiring or attaching to any IPUs",
       "offline.mode", default="no", group="Execution", dsl_off="no offline"),
    _o("--offline-target", "offline_target", "str", "Set POPLAR_TARGET_OPTIONS for a target system "
       "in offline mode (pod4, pod16, pod64, pod128, pod256)", "offline.target", group="Execution",
       dsl="offline target"),
    _o("--autoreport-dir", "autoreport_dir", "path", "Write PopVision profiles of each instance "
       "under this directory", "profile.autoreport_dir", group="Execution",
       dsl="autoreport to"),
    _o("--host-subnet", "host_subnet", "subnet", "The subnet (CIDR) for host communication",
       "network.host_subnet", group="MPI", dsl="subnet"),
    _o("--distribute-ssh-key", "distribute_ssh_key", "bool", "Distribute an SSH key to all hosts "
       "with ssh-copy-id", "ssh.distribute_key", default="no", group="SSH",
       dsl_off="no distribute ssh key"),
    _o("--distribute-ssh-key-path", "distribute_ssh_key_path", "path", "The folder of the key to "
       "distribute", "ssh.key_path", default="$HOME/.ssh", group="SSH",
       dsl="path", dsl_in="ssh key"),
    _o("--distribute-ssh-key-type", "distribute_ssh_key_type", "choice", "Generate a key of this "
       "type to distribute: dsa, ecdsa, ed25519 or rsa", "ssh.key_type", choices=SSH_KEY_TYPES, group="SSH",
       dsl="type", dsl_in="ssh key"),
    _o("--allow-run-as-root", "allow_run_as_root", "bool", "Allow running as root (passed to "
       "mpirun)", "run.allow_run_as_root", default="no", group="Execution",
       dsl_on="allow run as root", dsl_off="no allow run as root"),
    _o("--mask", "mask", "names", "Mask the values of these variables (comma-separated names; repeats add) in "
       "explain, diff, logs and every text output, beside those whose names look secret", "env.mask",
       group="Execution"),
    _o("--max-restarts", "max_restarts", "nonneg", "Start the instances again after a failure, at most this many "
       "times in the whole run (0: never)", "recovery.max_restarts", default="0", group="Recovery",
       dsl="max restarts"),
    _o("--restart-scope", "restart_scope", "choice", "What a restart starts again: all (every instance; for "
       "collectives) or instance (only the failed one; for independent workers)", "recovery.scope", default="all",
       choices=SCOPES, group="Recovery", dsl="restart scope"),
    _o("--restart-backoff", "restart_backoff", "seconds", "Seconds to wait before the first restart; the wait "
       "doubles with each restart", "recovery.backoff", default="1", group="Recovery", dsl="restart backoff"),
    _o("--restart-backoff-max", "restart_backoff_max", "seconds", "The longest wait before a restart, in seconds",
       "recovery.backoff_max", default="30", group="Recovery", dsl="restart backoff max"),
    _o("--min-uptime", "min_uptime", "seconds", "A failure sooner than this many seconds after its start is a "
       "quick one (see --crash-loop)", "recovery.min_uptime", default="5", group="Recovery", dsl="min uptime"),
    _o("--crash-loop", "crash_loop", "int", "End the run after this many quick failures in a row",
       "recovery.crash_loop", default="3", group="Recovery", dsl="crash loop"),
    _o("--never-retry", "never_retry", "statuses", "Exit statuses that end the run at once, never restarted "
       "(comma-separated, or none)", "recovery.never_retry", default="2,126,127", group="Recovery"),
    _o("--pre-restart", "pre_restart", "str", "A shell command run on this machine before each restart; its "
       "failure ends the run", "recovery.pre_restart", group="Recovery", dsl="pre restart"),
    _o("--timeout", "timeout", "seconds", "End the run after this many seconds (status 124; 0: no limit)",
       "recovery.timeout", default="0", group="Recovery", dsl="timeout"),
    _o("--stall-timeout", "stall_timeout", "seconds", "End the run when no instance has written output for this "
       "many seconds (0: no limit)", "recovery.stall_timeout", default="0", group="Recovery", dsl="stall timeout"),
    _o("--signal", "signal", "signal", "SIG@SECONDS: send signal SIG (a name such as USR1, or a number) to every "
       "instance SECONDS before --timeout ends the run", "recovery.signal", group="Recovery", dsl="signal"),
    _o("--heartbeat-timeout", "heartbeat_timeout", "seconds", "An instance that has reported progress or a "
       "heartbeat (popdist) and then is silent for this many seconds is hung: its stack is read and the run stopped "
       "(status 124) or restarted (0: no limit)", "recovery.heartbeat_timeout", default="0", group="Recovery",
       dsl="heartbeat timeout"),
    _o("--straggler-policy", "straggler_policy", "choice", "What a straggler (an instance much slower than the "
       "others; docs/progress.md) does: warn (an event) or restart (ends the attempt as its failure)",
       "recovery.straggler_policy", default="warn", choices=STRAGGLER_POLICIES, group="Recovery",
       dsl="straggler policy"),
    _o("--spare-host --spare-hosts", "spare_hosts", "hosts", "Hosts that may take the place of a host that is lost, "
       "fails its preflight or its health check, on a restart (e.g. pod[9-10]); repeats add; '' for none",
       "membership.spare_hosts", group="Membership"),
    _o("--min-hosts", "min_hosts", "int", "Without a spare left, a restart may run on fewer hosts, down to this many "
       "(each instance keeps its replicas)", "membership.min_hosts", default="the number of hosts", group="Membership",
       dsl="min hosts"),
    _o("--health-check", "health_check", "str", "A shell command run on every host, spares included, before the "
       "first start and before each restart; a host where it fails is replaced, or left out",
       "membership.health_check", group="Membership", dsl="health check"),
    _o("--health-check-timeout", "health_check_timeout", "seconds", "The longest a health check may run on a host, "
       "in seconds (it fails after)", "membership.health_check_timeout", default="30", group="Membership",
       dsl="health check timeout"),
    _o("--notify", "notify", "str", "A shell command run on this machine for each event chosen by --notify-on, with "
       "the event's JSON line on its standard input; its failure is a warning", "observe.notify", group="Observe",
       dsl="notify"),
    _o("--notify-on", "notify_on", "str", "The events --notify runs for (comma-separated): run-ended, attempt-ended, "
       "limit-reached, straggler, replan, or all", "observe.notify_on", default="run-ended", group="Observe",
       dsl="notify on"),
    _o("--notify-timeout", "notify_timeout", "seconds", "The longest a --notify command may run, in seconds (it is "
       "killed after); at the end poprun waits for the notifications at most this long", "observe.notify_timeout",
       default="10", group="Observe", dsl="notify timeout"),
    _o("--metrics-file", "metrics_file", "path", "Keep an OpenMetrics text file of the run's state and each "
       "instance's progress here, replaced once a second (for Prometheus's node exporter)", "observe.metrics_file",
       group="Observe", dsl="metrics file"),
    _o("--backend", "backend", "backend", "The backend that runs the plan: local, offline, ssh, "
       "mpirun, slurm or an installed plugin's name", "run.backend", default="chosen from the hosts", choices=BACKENDS, group="Execution",
       dsl="backend"),
    _o("--events", None, "action", "Stream the run's events as JSON lines to this file, '-' (standard output) "
       "or fd:N (an inherited descriptor), as they happen (docs/runs.md)", group="Execution"),
    _o("--detach", None, "flag", "Start the launch, print its run id once every instance has started, and leave it "
       "running without a terminal ('poprun attach', 'logs -f', 'stop' and 'report' find it by its id)",
       group="Execution"),
    _o("--export-config", None, "action", "Export the command line to a configuration file",
       group="Configuration"),
    _o("--import-config", None, "action", "Import a configuration file (command-line values "
       "override it)", group="Configuration"),
    _o("--overwrite-config", None, "action", "Overwrite an existing configuration file",
       default="no", group="Configuration"),
    _o("--explain", None, "flag", "Show every decision with its source and reason", group="poprun plan"),
    _o("--format", None, "action", "Output format: text, json, toml or dot; for 'poprun render' dot, svg or "
       "png, chosen by the -o file's suffix when not given", default="text",
       choices=FORMATS, group="poprun plan"),
    _o("-o --output", None, "action", "Write the output to this file instead of standard output",
       group="poprun plan"),
    _o("--diff", None, "action", "Show what changed from the plan saved in this JSON file to the one "
       "the command line describes (exit 0 either way)", group="poprun plan"),
    _o("--expand", None, "flag", "Graphs: draw every host, instance and replica instead of grouping "
       "large plans", group="poprun plan"),
)
PLAN_ONLY = ("--explain", "--format", "--output", "--diff", "--expand")

BY_FLAG: dict[str, Option] = {flag: option for option in OPTIONS for flag in option.flags}
LONG_FLAGS: tuple[str, ...] = tuple(sorted(f for f in BY_FLAG if f.startswith("--")))
# TOML layout: section -> key -> Spec field (program, env and instances are handled apart).
TOML_KEYS: dict[str, dict[str, str]] = {}
for _option in OPTIONS:
    if _option.section and _option.field:
        TOML_KEYS.setdefault(_option.section, {})[_option.key] = _option.field
BY_FIELD: dict[str, Option] = {o.field: o for o in OPTIONS if o.field and o.section}
