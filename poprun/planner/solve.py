"""
Solving: a Spec and a Context to a complete, explained LaunchPlan.

Layer: ``poprun.planner``; imports ``poprun.core``, ``popdist.env`` and the planner's models.

The solver fills in every value the user left open, checks the rules of
:mod:`constraint`, and records for each value its source and the reason (what
``--explain`` prints). Errors are collected and raised once at the end.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import TypeVar

import attrs

from popdist import env as names
from poprun import __version__
from poprun.core.diagnostic import Diagnostic, DiagnosticError, Diagnostics, error, warning
from poprun.core.hint import join_or, suggestion_hint
from poprun.core.span import SourceSpan
from poprun.planner import constraint
from poprun.planner import plan as p
from poprun.planner.context import Context
from poprun.planner.spec import EnvVarSpec, Sourced, Spec
from poprun.planner.target import DEFAULT_ILD_SIZE, TARGETS, Target

T = TypeVar("T")
DEFAULT_MASTER_PORT = "29500"
_SHOWN_HOSTS = 3
_SECRET_WORDS = ("TOKEN", "SECRET", "PASSWORD", "KEY")


@attrs.frozen
class Solution:
    """A plan and the warnings found while making it."""

    plan: p.LaunchPlan
    warnings: tuple[Diagnostic, ...]


class _Solver:
    """One solve: the spec, the context, and what was decided so far."""

    def __init__(self, spec: Spec, ctx: Context) -> None:
        self.spec = spec
        self.ctx = ctx
        self.diags = Diagnostics()
        self.decisions: list[p.Decision] = []

    # -- recording ---------------------------------------------------------------------
    def decide(self, key: str, value: T, origin: SourceSpan, reason: str) -> T:
        """Record a decision and return its value."""
        shown = value if isinstance(value, str | int | bool) else (" " if key == "program" else ",").join(
            map(str, value)) if isinstance(value, tuple) else json.dumps(value)
        self.decisions.append(p.Decision(key=key, value=shown, source=origin.describe(), reason=reason))
        return value

    def pick(self, key: str, given: Sourced[T] | None, default: T, reason: str) -> T:
        """Decide ``key`` from the spec, else from ``default``."""
        if given is not None:
            return self.decide(key, given.value, given.origin, "as given")
        return self.decide(key, default, SourceSpan.default(key), reason)

    def fail(self, code: str, summary: str, *, detail: str, span: SourceSpan, hint: str) -> None:
        self.diags.add(error(code, summary, detail=detail, span=span, hint=hint))

    def warn(self, code: str, summary: str, *, detail: str, span: SourceSpan, hint: str) -> None:
        self.diags.add(warning(code, summary, detail=detail, span=span, hint=hint))

    def origin(self, name: str) -> SourceSpan:
        """Return where the user set ``name``, or a default span."""
        given = getattr(self.spec, name, None) if name != "hosts" else self.spec.hosts
        return given.origin if isinstance(given, Sourced) else SourceSpan.default(name)


def solve(spec: Spec, ctx: Context, *, require_program: bool = True) -> Solution:
    """
    Return the plan of ``spec`` in ``ctx``.

    Diagnostics:
        PR202, PR203, PR205-PR209, PR215 (validation); PR300-PR305 (division rules);
        PR304 is a warning. Raises :class:`DiagnosticError` when any error is found.
    """
    solver = _Solver(spec, ctx)
    plan = _solve(solver, require_program=require_program)
    if solver.diags.has_errors or plan is None:
        raise DiagnosticError(solver.diags)
    return Solution(plan=plan, warnings=solver.diags.warnings)


def _solve(s: _Solver, *, require_program: bool) -> p.LaunchPlan | None:
    target = _target(s)
    topology = _topology(s, target)
    if topology is None:
        return None
    s.diags.extend(validate_instance_args(s.spec, topology.num_instances))
    partition = _partition(s, topology)
    cache = _cache(s, topology)
    output = _output(s, topology)
    placement = _placement(s, topology)
    argv = _program(s, require_program=require_program)
    cwd = s.pick("cwd", s.spec.working_dir, s.ctx.cwd, "the directory poprun runs in (section 2.2.4: the same on every host)")
    base_env = _base_env(s, topology, partition, cache, target)
    instances = tuple(
        _instance(s, topology, i, argv=argv, cwd=cwd, base=base_env, placement=placement, partition=partition)
        for i in range(topology.num_instances)
    )
    backend = _backend(s, topology)
    mpi = p.Mpi(global_args=_mpi_global(s), host_subnet=_value(s.spec.host_subnet),
                allow_run_as_root=_on(s.spec.allow_run_as_root) or "--allow-run-as-root" in _mpi_global(s))
    keys = p.SshKeyDistribution(enabled=_on(s.spec.distribute_ssh_key),
                                key_path=_value(s.spec.distribute_ssh_key_path),
                                key_type=_value(s.spec.distribute_ssh_key_type))
    notes = tuple(p.Note(code=d.code, summary=d.summary, hint=d.hint) for d in s.diags.warnings)
    return p.LaunchPlan(
        poprun_version=__version__, topology=topology, instances=instances, partition=partition,
        offline=_on(s.spec.offline_mode), offline_target=target.name if target else None,
        output=output, cache=cache, mpi=mpi, ssh_keys=keys, backend=backend,
        explanation=tuple(s.decisions), warnings=notes,
    )


def _value(given: Sourced[T] | None) -> T | None:
    return given.value if given is not None else None


def _on(given: Sourced[bool] | None) -> bool:
    """Return whether a yes/no option is given as yes."""
    return given is not None and given.value


# -- topology ------------------------------------------------------------------------------
def _hosts(s: _Solver) -> tuple[tuple[str, ...], bool]:
    """Return the hosts and whether the user gave them."""
    spec = s.spec
    if spec.hosts is not None and spec.host_file is not None:
        s.fail("PR208", "hosts given twice", detail="both a host list and a host file are given",
               span=spec.host_file.origin, hint="give either --host or --host-file, not both")
    if spec.hosts is not None:
        if not spec.hosts.value:
            s.fail("PR215", "empty host list", detail="the host list names no host", span=spec.hosts.origin,
                   hint="name at least one host, e.g. --host pod1,pod2")
            return ("localhost",), False
        return s.decide("hosts", spec.hosts.value, spec.hosts.origin, "as given"), True
    s.decide("hosts", ("localhost",), SourceSpan.default("hosts"), "no hosts given: every instance runs on this host")
    return ("localhost",), False


def _target(s: _Solver) -> Target | None:
    given = s.spec.offline_target
    if given is None:
        return None
    target = TARGETS.get(given.value.lower())
    if target is None:
        s.fail("PR206", f"unknown offline target '{given.value}'", detail=f"'{given.value}' is not a known target",
               span=given.origin, hint=suggestion_hint(given.value.lower(), TARGETS, noun="target"))
        return None
    if not _on(s.spec.offline_mode):
        s.warn("PR207", "offline target without offline mode", detail=f"--offline-target={target.name} is meant "
               "for compiling without IPUs", span=given.origin, hint="add --offline-mode=yes, or drop the target")
    return target


def _topology(s: _Solver, target: Target | None) -> p.Topology | None:
    spec = s.spec
    hosts, hosts_given = _hosts(s)
    replicas = s.pick("num_replicas", spec.replicas, 1, "default: one replica")
    ipus = s.pick("ipus_per_replica", spec.ipus_per_replica, 1, "default: one IPU per replica")
    if spec.instances is not None:
        instances = s.decide("num_instances", spec.instances.value, spec.instances.origin, "as given")
    elif hosts_given:
        instances = s.decide("num_instances", len(hosts), SourceSpan.derived("num_instances"),
                             "not given: one instance per host")
    else:
        instances = s.decide("num_instances", 1, SourceSpan.default("num_instances"), "default: one instance")
    ild_size = target.ild_size if target else DEFAULT_ILD_SIZE
    values = {"replicas": replicas, "ipus_per_replica": ipus, "instances": instances, "hosts": len(hosts),
              "ild_size": ild_size, "target_ipus": target.num_ipus if target else 0, "ilds": 1}
    values["ilds"] = _ilds(s, values, target)
    if not _check(s, values):
        return None
    _one_and_one(s, replicas, instances)
    return p.Topology(num_replicas=replicas, num_instances=instances, num_ilds=values["ilds"],
                      ipus_per_replica=ipus, hosts=hosts, num_ipus=replicas * ipus,
                      replicas_per_instance=replicas // instances, instances_per_host=instances // len(hosts),
                      instances_per_ild=instances // values["ilds"])


def _least_ilds(values: Mapping[str, int]) -> tuple[int, int]:
    """Return the fewest ILDs that hold the IPUs and divide the instances, and the fewest that hold them."""
    least = max(-(-values["replicas"] * values["ipus_per_replica"] // values["ild_size"]), 1)
    fits = [d for d in range(least, values["instances"] + 1) if values["instances"] % d == 0]
    return (fits[0] if fits else least), least


def _ilds(s: _Solver, values: dict[str, int], target: Target | None) -> int:
    if s.spec.ilds is not None:
        return s.decide("num_ilds", s.spec.ilds.value, s.spec.ilds.origin, "as given")
    ipus = values["replicas"] * values["ipus_per_replica"]
    ilds, least = _least_ilds(values)
    where = f"an ILD of {target.name} has {target.ild_size} IPUs" if target else \
        f"an ILD of a Pod64 has {DEFAULT_ILD_SIZE} IPUs; the V-IPU partition decides at apply time"
    return s.decide("num_ilds", ilds, SourceSpan.derived("num_ilds"),
                    f"not given: {ipus} IPUs need at least {least} ILD{'s' if least > 1 else ''} ({where})")


def _check(s: _Solver, values: dict[str, int]) -> bool:
    broken = constraint.violated(values)
    if s.spec.ilds is None and any("ilds" not in rule.binds for rule in broken):
        # The ILDs were derived from the other numbers: fix those first.
        broken = tuple(rule for rule in broken if "ilds" not in rule.binds)
    for rule in constraint.CONSTRAINTS:
        if rule.applies(values) and rule not in broken:
            s.decisions.append(p.Decision(key=f"rule {rule.name}", value="holds", source="derived",
                                          reason=rule.explain(values)))
    for rule in broken:
        free = tuple(n for n in rule.binds if n == "hosts" or getattr(s.spec, n, None) is not None
                     or n in ("instances", "ilds"))
        spans = [s.origin(n) for n in rule.binds if s.origin(n).file != "<default>"]
        span = spans[-1] if spans else s.origin(rule.binds[0])
        s.fail(rule.code, rule.summary, detail=rule.detail(values), span=span,
               hint=_alternatives_hint(values, rule, free, derived_ilds=s.spec.ilds is None))
    return not broken


def _rederive_ilds(values: dict[str, int]) -> dict[str, int]:
    return {**values, "ilds": _least_ilds(values)[0]}


def _alternatives_hint(values: dict[str, int], rule: constraint.Constraint, free: tuple[str, ...], *,
                       derived_ilds: bool) -> str:
    found = constraint.alternatives(values, rule, free=free, adjust=_rederive_ilds if derived_ilds else dict)
    parts = [f"{join_or(found[n])} {constraint.NOUNS[n]}" for n in rule.binds if n in found]
    if not parts:
        return "change the numbers so that each divides evenly"
    return "use " + ", or ".join(parts)


def _one_and_one(s: _Solver, replicas: int, instances: int) -> None:
    given = s.spec.replicas or s.spec.instances
    if replicas == 1 and instances == 1 and given is not None:
        s.warn("PR304", "one instance with one replica", detail="--num-instances=1 with --num-replicas=1 is "
               "not supported by PopRun and may add overhead", span=given.origin,
               hint="run the program without poprun, or use more replicas")


# -- partition, cache, output, placement ------------------------------------------------
def _vipu(s: _Solver, key: str, given: Sourced[T] | None, *, env_name: str, hcl: str, default: T,
          convert: Callable[[str], T]) -> T:
    if given is not None:
        return s.decide(key, given.value, given.origin, "as given")
    for source, raw, why in (
        (SourceSpan.env(env_name), s.ctx.environ.get(env_name), f"taken from {env_name}"),
        (SourceSpan(file=s.ctx.vipu_config_file or "<vipu config>", key_path=hcl),
         s.ctx.vipu_config.get(hcl), "picked up from the local vipu configuration"),
    ):
        if raw:
            try:
                return s.decide(key, convert(raw), source, why)
            except ValueError:
                continue
    return s.decide(key, default, SourceSpan.default(key), "default")


def _partition(s: _Solver, topo: p.Topology) -> p.Partition | None:
    spec = s.spec
    if _on(spec.offline_mode):
        s.decide("partition", "none", spec.offline_mode.origin if spec.offline_mode else SourceSpan.default("x"),
                 "offline mode: no partition and no devices")
        return None
    host = _vipu(s, "vipu_server_host", spec.vipu_server_host, env_name=names.VIPU_API_HOST, hcl="api-host",
                 default="localhost", convert=str)
    port = _vipu(s, "vipu_server_port", spec.vipu_server_port, env_name=names.VIPU_API_PORT, hcl="api-port",
                 default=8090, convert=int)
    name: str | None = _vipu(s, "partition", spec.partition, env_name=names.VIPU_API_PARTITION_ID,
                             hcl="partition", default="", convert=str)
    name = name or None
    if name is None:
        s.decisions[-1] = attrs.evolve(s.decisions[-1], value="(the only one)",
                                       reason="not given: the only partition of the allocation, found at apply time")
    timeout = s.pick("vipu_server_timeout", spec.vipu_server_timeout, 120, "default")
    update = s.pick("update_partition", spec.update_partition, default=False,
                    reason="default: an unsuitable partition is an error")
    remove = s.pick("remove_partition", spec.remove_partition, default=True,
                    reason="default: a partition poprun creates is removed at exit")
    gcds = max(1, topo.num_instances)
    return p.Partition(
        name=name, allocation=_value(spec.allocation), server_host=host, server_port=port, timeout_s=timeout,
        num_ipus=topo.num_ipus, num_gcds=gcds, num_ilds=topo.num_ilds, sync_type=_value(spec.sync_type),
        ipu_link_routing_type=_value(spec.ipu_link_routing_type),
        gw_link_routing_type=_value(spec.gw_link_routing_type), update=update,
        reset=_value(spec.reset_partition), remove=remove,
        attempts=_value(spec.partition_attempts) or 1, actions=_partition_actions(name, update, remove, spec),
    )


def _partition_actions(name: str | None, update: bool, remove: bool, spec: Spec) -> tuple[str, ...]:
    if name is None:
        return ("use the only partition of the allocation (decided at apply time)",)
    actions = [f"use partition '{name}' if it exists and matches the topology"]
    if update:
        actions.append("otherwise create it, or remove and create it again (--update-partition=yes)")
    else:
        actions.append("otherwise stop with an error (--update-partition=no)")
    reset = _value(spec.reset_partition)
    actions.append("reset it before running" if reset else "do not reset it" if reset is False
                   else "reset it if non-reconfigurable (default)")
    if update:
        actions.append("remove it at exit if poprun created it" if remove else "keep it at exit (--remove-partition=no)")
    return tuple(actions)


def _cache(s: _Solver, topo: p.Topology) -> p.Cache:
    given = s.spec.executable_cache_path
    framework = s.ctx.environ.get("POPTORCH_CACHE_DIR") or _env_set_value(s.spec, "POPTORCH_CACHE_DIR")
    if given is not None and given.value and framework is not None:
        s.fail("PR202", "two executable caches", detail="POPTORCH_CACHE_DIR is set and --executable-cache-path "
               "is given; they conflict", span=given.origin,
               hint="unset POPTORCH_CACHE_DIR, or drop --executable-cache-path")
    if given is not None and not given.value:
        s.decide("executable_cache", "disabled", given.origin, "an empty path disables caching")
        return p.Cache(mode="disabled", path=None, per_host=False, remove_at_exit=False)
    if given is not None:
        s.decide("executable_cache", given.value, given.origin, "a fixed path: kept after exit, yours to remove")
        return p.Cache(mode="user", path=given.value, per_host=False, remove_at_exit=False)
    if topo.num_instances == 1:
        s.decide("executable_cache", "disabled", SourceSpan.default("executable_cache"),
                 "single instance: caching is off unless --executable-cache-path is given")
        return p.Cache(mode="disabled", path=None, per_host=False, remove_at_exit=False)
    per_host = len(topo.hosts) > 1
    s.decide("executable_cache", "temporary", SourceSpan.derived("executable_cache"),
             "several instances: a temporary cache " + ("on each host" if per_host else "shared by the instances")
             + ", removed when poprun exits")
    return p.Cache(mode="temporary", path=None, per_host=per_host, remove_at_exit=True)


def _env_set_value(spec: Spec, name: str) -> str | None:
    values = [e.value.value for e in spec.env if e.value.name == name and e.value.value is not None]
    return values[-1] if values else None


def _mpi_global(s: _Solver) -> tuple[str, ...]:
    return s.spec.mpi_global_args.value if s.spec.mpi_global_args else ()


def _output(s: _Solver, topo: p.Topology) -> p.Output:
    args = _mpi_global(s)
    filename = None
    for i, word in enumerate(args):
        if word.startswith("--output-filename="):
            filename = word.partition("=")[2]
        elif word == "--output-filename" and i + 1 < len(args):
            filename = args[i + 1]
    only = s.spec.only_output_from_instance
    if only is not None and only.value >= topo.num_instances:
        s.fail("PR205", "instance index out of range", detail=f"instance {only.value} does not exist: there are "
               f"{topo.num_instances} (0 to {topo.num_instances - 1})", span=only.origin,
               hint=f"use an index from 0 to {topo.num_instances - 1}")
    return p.Output(tag="--tag-output" in args, output_filename=filename, only_from_instance=_value(only),
                    print_topology=_on(s.spec.print_topology), verbosity=_value(s.spec.verbosity) or 0)


def _placement(s: _Solver, topo: p.Topology) -> p.Placement:
    strategy = s.pick("process_placement", s.spec.process_placement, "spreadnuma", "default: NUMA nodes are "
                      "divided among the instances of each host")
    if s.spec.numa_aware is not None:
        aware = s.decide("numa_aware", s.spec.numa_aware.value, s.spec.numa_aware.origin, "as given")
    else:
        aware = s.decide("numa_aware", topo.instances_per_host > 1, SourceSpan.derived("numa_aware"),
                         f"{topo.instances_per_host} instance{'s' if topo.instances_per_host > 1 else ''} per host: "
                         "NUMA awareness is on with more than one")
    return p.Placement(numa_aware=aware and strategy != "disabled", strategy=strategy)


def _program(s: _Solver, *, require_program: bool) -> tuple[str, ...]:
    if s.spec.program is not None and s.spec.program.value:
        return s.decide("program", s.spec.program.value, s.spec.program.origin, "as given")
    span = SourceSpan.flag("PROGRAM")
    make = s.fail if require_program else s.warn
    make("PR209", "no program", detail="no program to launch was given", span=span,
         hint="add the program and its arguments after poprun's options, e.g. poprun --num-instances 2 python3 train.py")
    return ()


def _backend(s: _Solver, topo: p.Topology) -> p.BackendChoice:
    if s.spec.backend is not None:
        name = s.decide("backend", s.spec.backend.value, s.spec.backend.origin, "as given")
        return p.BackendChoice(name=name, reason="as given")
    if _on(s.spec.offline_mode):
        reason = "offline mode: every instance runs on this machine"
        name = "offline"
    elif all(h in s.ctx.local_names for h in topo.hosts):
        reason = "every host is this machine"
        name = "local"
    else:
        remote = [h for h in topo.hosts if h not in s.ctx.local_names]
        shown = ", ".join(remote[:_SHOWN_HOSTS]) + (", ..." if len(remote) > _SHOWN_HOSTS else "")
        reason = f"remote hosts ({shown}) are reached with ssh"
        name = "ssh"
    s.decide("backend", name, SourceSpan.derived("backend"), reason)
    return p.BackendChoice(name=name, reason=reason)


# -- environment ------------------------------------------------------------------------
def _base_env(s: _Solver, topo: p.Topology, part: p.Partition | None, cache: p.Cache,
              target: Target | None) -> dict[str, str]:
    env = {
        names.NUM_TOTAL_REPLICAS: str(topo.num_replicas),
        names.NUM_IPUS_PER_REPLICA: str(topo.ipus_per_replica),
        names.NUM_LOCAL_REPLICAS: str(topo.replicas_per_instance),
        names.UNIFORM_REPLICAS_PER_INSTANCE: "1",
        names.NUM_INSTANCES: str(topo.num_instances),
        names.OMPI_SIZE: str(topo.num_instances),
        names.OMPI_LOCAL_SIZE: str(topo.instances_per_host),
        names.TORCH_WORLD_SIZE: str(topo.num_instances),
        names.TORCH_LOCAL_WORLD_SIZE: str(topo.instances_per_host),
        names.TORCH_MASTER_ADDR: topo.hosts[0],
        names.TORCH_MASTER_PORT: s.ctx.environ.get(names.TORCH_MASTER_PORT, DEFAULT_MASTER_PORT),
        names.IPUOF_LOG_LEVEL: "WARN",
    }
    if cache.mode == "user" and cache.path:
        env[names.EXECUTABLE_CACHE_PATH] = cache.path
    _autoreport(s, env)
    if part is not None:
        env.update({names.VIPU_API_HOST: part.server_host, names.VIPU_API_PORT: str(part.server_port),
                    names.VIPU_API_TIMEOUT: str(part.timeout_s)})
        if part.name:
            env[names.VIPU_API_PARTITION_ID] = part.name
    if target is not None:
        instance_size = topo.num_ipus // topo.num_instances
        env[names.POPLAR_TARGET_OPTIONS] = target.target_options(instance_size=instance_size)
    return env


def _autoreport(s: _Solver, env: dict[str, str]) -> None:
    given = s.spec.autoreport_dir
    if given is None:
        return
    sources = [s.ctx.environ.get(names.POPLAR_ENGINE_OPTIONS, "")]
    sources += [e.value.value or "" for e in s.spec.env if e.value.name == names.POPLAR_ENGINE_OPTIONS]
    sources += [v.value or "" for a in s.spec.instance_args for v in a.value.env
                if v.name == names.POPLAR_ENGINE_OPTIONS]
    if any("autoReport.directory" in text for text in sources):
        s.fail("PR203", "two autoreport directories", detail="autoreport-dir command line argument cannot be "
               "specified when POPLAR_ENGINE_OPTIONS contains autoReport.directory setting", span=given.origin,
               hint="remove autoReport.directory from POPLAR_ENGINE_OPTIONS (poprun gives each instance its "
               "own directory), or drop --autoreport-dir")
    env[names.AUTOREPORT_DIRECTORY] = s.decide("autoreport_dir", given.value, given.origin,
                                               "each instance writes its profile under <dir>/<instance>")


def _instance(s: _Solver, topo: p.Topology, i: int, *, argv: tuple[str, ...], cwd: str, base: dict[str, str],
              placement: p.Placement, partition: p.Partition | None) -> p.Instance:
    per_host = topo.instances_per_host
    local = i % per_host
    offset = i * topo.replicas_per_instance
    gcd = i if topo.num_instances > 1 else 0
    env = dict(base)
    env.update({
        names.REPLICA_INDEX_OFFSET: str(offset), names.LOCAL_INSTANCE_INDEX: str(local),
        names.INSTANCE_INDEX: str(i), names.OMPI_RANK: str(i), names.OMPI_LOCAL_RANK: str(local),
        names.TORCH_RANK: str(i), names.TORCH_LOCAL_RANK: str(local),
    })
    if partition is not None:
        env[names.VIPU_API_GCD_ID] = str(gcd)
    forward = list(names.ALWAYS_FORWARDED)
    if names.POPLAR_ENGINE_OPTIONS in s.ctx.environ:
        forward.append(names.POPLAR_ENGINE_OPTIONS)
    mpi_args = list(s.spec.mpi_local_args.value if s.spec.mpi_local_args else ())
    user: list[EnvVarSpec] = [e.value for e in s.spec.env]
    for extra in s.spec.instance_args:
        if extra.value.index == i:
            user.extend(extra.value.env)
            mpi_args.extend(extra.value.mpi_args)
    _apply_user_env(env, forward, user)
    environment = p.Environment(set=tuple(sorted(env.items())), forward=tuple(dict.fromkeys(forward)),
                                unset=(names.IPUOF_CONFIG_PATH,))
    return p.Instance(index=i, host=topo.hosts[i // per_host], local_index=local, ild=i // topo.instances_per_ild,
                      gcd=gcd, replica_offset=offset, num_local_replicas=topo.replicas_per_instance, argv=argv,
                      cwd=cwd, env=environment, placement=placement, mpi_local_args=tuple(mpi_args))


def _apply_user_env(env: dict[str, str], forward: list[str], user: list[EnvVarSpec]) -> None:
    """Apply ``-x`` variables in order: later ones win, as with mpirun."""
    for var in user:
        if var.value is None:
            env.pop(var.name, None)
            forward.append(var.name)
        else:
            env[var.name] = var.value
            if var.name in forward:
                forward.remove(var.name)


def validate_instance_args(spec: Spec, num_instances: int) -> tuple[Diagnostic, ...]:
    """Return PR205 for ``--instance-mpi-local-args`` naming an instance that does not exist."""
    return tuple(
        error("PR205", "instance index out of range",
              detail=f"--instance-mpi-local-args names instance {a.value.index}, but there are {num_instances}",
              span=a.origin, hint=f"use an index from 0 to {num_instances - 1}")
        for a in spec.instance_args if a.value.index >= num_instances
    )


def is_secret(name: str) -> bool:
    """Return whether a variable's value must be masked in text output."""
    upper = name.upper()
    return any(word in upper for word in _SECRET_WORDS)
