"""
Each instance's environment: the variables real poprun set, popdist's and torchrun's, and the user's ``-x``.

Layer: ``poprun.planner``; the names come from :mod:`popdist.env`, the one place they live.
"""

from __future__ import annotations

from popdist import env as names
from poprun.core.diagnostic import Diagnostic, error
from poprun.core.secret import is_secret as is_secret  # noqa: PLC0414 - kept here for its users
from poprun.core.span import SourceSpan
from poprun.planner import plan as p
from poprun.planner.address import is_address
from poprun.planner.spec import EnvVarSpec, Spec
from poprun.planner.state import Solver
from poprun.planner.target import Target
from poprun.planner.trait import CONSERVATIVE, Traits, all_here_reason

DEFAULT_MASTER_PORT = "29500"

def base_env(s: Solver, topo: p.Topology, part: p.Partition | None, cache: p.Cache,
             target: Target | None, *, backend: str, traits: Traits = CONSERVATIVE,
             recovery: p.Recovery = p.NO_RECOVERY) -> dict[str, str]:
    """
    Return the variables every instance shares, as real poprun set them, and torchrun's.

    ``backend``: the one that will run them, with its ``traits``. MASTER_PORT is left out when ``recovery.choose_port``
    (the apply step picks it for each attempt).
    """
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
        names.TORCH_MASTER_ADDR: master_addr(s, topo, backend, traits),
        names.TORCH_GROUP_WORLD_SIZE: str(len(topo.hosts)),
        names.TORCH_ROLE_WORLD_SIZE: str(topo.num_instances),
        names.TORCH_ROLE_NAME: names.DEFAULT_ROLE_NAME,
        names.TORCHELASTIC_MAX_RESTARTS: str(recovery.max_restarts),
        names.IPUOF_LOG_LEVEL: "WARN",
    }
    env.update({name: value for name, value in TORCHRUN_DEFAULTS.items() if name not in s.ctx.environ})
    if not recovery.choose_port:
        env[names.TORCH_MASTER_PORT] = s.ctx.environ.get(names.TORCH_MASTER_PORT, DEFAULT_MASTER_PORT)
    fault_handler(s, env, recovery)
    if cache.mode == "user" and cache.path:
        env[names.EXECUTABLE_CACHE_PATH] = cache.path
    autoreport(s, env)
    if part is not None:
        env.update({names.VIPU_API_HOST: part.server_host, names.VIPU_API_PORT: str(part.server_port),
                    names.VIPU_API_TIMEOUT: str(part.timeout_s)})
        if part.name:
            env[names.VIPU_API_PARTITION_ID] = part.name
    if target is not None:
        instance_size = topo.num_ipus // topo.num_instances
        env[names.POPLAR_TARGET_OPTIONS] = target.target_options(instance_size=instance_size)
    return env


# torchrun 2.13's values for every worker (its launcher's default; one in the launching shell is forwarded instead,
# as torchrun passes its own environment's on). No agent holds a store: instance 0's torch makes it at MASTER_PORT.
TORCHRUN_DEFAULTS = {names.TORCH_NCCL_ASYNC_ERROR_HANDLING: "1",
                     names.TORCHELASTIC_SIGNALS_TO_HANDLE: "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
                     names.TORCHELASTIC_USE_AGENT_STORE: "False"}
_LOOPBACK = ("localhost", "127.0.0.1", "::1")


def master_addr(s: Solver, topo: p.Topology, backend: str, traits: Traits = CONSERVATIVE) -> str:
    """
    Return MASTER_ADDR: an address of instance 0's host that every instance can reach.

    The first host's name as given, except: ``localhost`` when every instance runs on one machine
    (the offline or local backend, or a single host); this machine's name when instance 0 runs
    here and others elsewhere; the address the launcher reaches the first host at when it differs
    from the name: ssh_config's ``HostName`` when ssh starts the instances, Slurm's ``NodeAddr``
    when srun does (read only at a launch). A ``-x MASTER_ADDR=...`` of the user's wins (applied later).

    Diagnostics: PR309 (warning) when, at a launch, the chosen name does not resolve here.
    """
    first, local = topo.hosts[0], s.ctx.local_names
    if _user_sets_master_addr(s):
        return first
    if traits.all_here or len(topo.hosts) == 1:
        if first in local:
            return first
        reason = all_here_reason(backend) if traits.all_here else f"every instance runs on {first}"
        return s.decide("master_addr", "localhost", SourceSpan.derived("master_addr"),
                        f"{reason}, so instance 0 is reached at localhost (not at {first})")
    if first in local:
        name = next((n for n in local if n not in _LOOPBACK), None)
        if name is None:
            return first
        return s.decide("master_addr", name, SourceSpan.derived("master_addr"),
                        f"instance 0 runs on this machine ({first}); the other hosts reach it by its name")
    address = _launcher_address(s, first, traits)
    _check_resolves(s, first, address, traits)
    return address


def _launcher_address(s: Solver, first: str, traits: Traits) -> str:
    """Return the address the launcher reaches host ``first`` at (recorded when it is not the name)."""
    if traits.started_by_srun(in_allocation=bool(s.ctx.environ.get("SLURM_JOB_ID"))):  # srun starts them
        if s.ctx.slurm_node_address is None:
            return s.decide("master_addr", first, SourceSpan.derived("master_addr"),
                            f"instance 0's node {first}; its address in Slurm (NodeAddr) is read when launching")
        mapped, how = s.ctx.slurm_node_address(first, s.ctx.environ), "as Slurm reaches it (NodeAddr"
    elif traits.reaches_with_ssh() and s.ctx.ssh_hostname is not None:
        mapped, how = s.ctx.ssh_hostname(first, s.ctx.environ), "as ssh reaches it (ssh_config: HostName"
    else:
        return first
    if not mapped or mapped == first:
        return first
    return s.decide("master_addr", mapped, SourceSpan.derived("master_addr"), f"instance 0's host {first} {how} {mapped})")


def _user_sets_master_addr(s: Solver) -> bool:
    """Return whether a ``-x MASTER_ADDR`` (for all instances or one) sets or forwards the address."""
    given = [e.value for e in s.spec.env] + [v for a in s.spec.instance_args for v in a.value.env]
    return any(var.name == names.TORCH_MASTER_ADDR for var in given)


def _check_resolves(s: Solver, first: str, address: str, traits: Traits) -> None:
    """PR309 (warning) when a launch is planned and ``address`` does not resolve on this machine."""
    if s.ctx.resolves is None or is_address(address) or s.ctx.resolves(address) is not False:
        return
    how = f"map {first} to its address with HostName in ssh_config (POPRUN_SSH_CONFIG names the file), " \
        if traits.reaches_with_ssh() and not s.ctx.environ.get("SLURM_JOB_ID") else ""
    s.warn("PR309", "instance 0's host name does not resolve",
           detail=f"MASTER_ADDR would be '{address}' (instance 0's host), which does not resolve on this machine; "
                  "instances that cannot resolve it either wait for instance 0 until they time out",
           span=s.origin("hosts"),
           hint=f"give --host the address of {first}, {how}or set it with -x MASTER_ADDR=ADDRESS")


def fault_handler(s: Solver, env: dict[str, str], recovery: p.Recovery) -> None:
    """Set PYTHONFAULTHANDLER=1 under a time limit (or a heartbeat limit), unless the user set it (here or in the launching shell)."""
    name = names.PYTHON_FAULT_HANDLER
    if not (recovery.timeout_ms or recovery.stall_timeout_ms or recovery.heartbeat_timeout_ms) or name in s.ctx.environ:
        return
    if any(var.name == name for var in [e.value for e in s.spec.env]
           + [v for a in s.spec.instance_args for v in a.value.env]):
        return
    env[name] = s.decide(name, "1", SourceSpan.derived(name),
                         "a time limit is set: so that poprun can print where a hung Python instance was")


def autoreport(s: Solver, env: dict[str, str]) -> None:
    """Set POPDIST_AUTOREPORT_DIRECTORY, or PR203 when POPLAR_ENGINE_OPTIONS already names a directory."""
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


def instance(s: Solver, topo: p.Topology, i: int, *, argv: tuple[str, ...], cwd: str, base: dict[str, str],
              placement: p.Placement, partition: p.Partition | None) -> p.Instance:
    """Return instance ``i``: its host, indices, replicas, and its whole environment."""
    per_host = topo.instances_per_host
    local = i % per_host
    offset = i * topo.replicas_per_instance
    gcd = i if topo.num_instances > 1 else 0
    env = dict(base)
    env.update({
        names.REPLICA_INDEX_OFFSET: str(offset), names.LOCAL_INSTANCE_INDEX: str(local),
        names.INSTANCE_INDEX: str(i), names.OMPI_RANK: str(i), names.OMPI_LOCAL_RANK: str(local),
        names.TORCH_RANK: str(i), names.TORCH_LOCAL_RANK: str(local),
        names.TORCH_GROUP_RANK: str(i // per_host), names.TORCH_ROLE_RANK: str(i),
    })
    if partition is not None:
        env[names.VIPU_API_GCD_ID] = str(gcd)
    forward = list(names.ALWAYS_FORWARDED)
    if names.POPLAR_ENGINE_OPTIONS in s.ctx.environ:
        forward.append(names.POPLAR_ENGINE_OPTIONS)
    forward.extend(name for name in TORCHRUN_DEFAULTS if name in s.ctx.environ)
    mpi_args = list(s.spec.mpi_local_args.value if s.spec.mpi_local_args else ())
    user: list[EnvVarSpec] = [e.value for e in s.spec.env]
    for extra in s.spec.instance_args:
        if extra.value.index == i:
            user.extend(extra.value.env)
            mpi_args.extend(extra.value.mpi_args)
    computed = dict(env)
    apply_user_env(env, forward, user)
    _warn_replaced(s, computed, user)
    given = {var.name for var in user}
    removed = () if names.IPUOF_CONFIG_PATH in given else (names.IPUOF_CONFIG_PATH,)
    # popdist's variables of the launching shell that this plan leaves unset (a launch from within an instance, a
    # stale export): an instance started here would inherit them, one on another host would not, and explain
    # would not show them
    stale = sorted(name for name in s.ctx.environ if (name.startswith("POPDIST_") or name == names.RUN_ID)
                   and name not in env and name not in forward and name not in removed)
    environment = p.Environment(set=tuple(sorted(env.items())), forward=tuple(dict.fromkeys(forward)),
                                unset=(*removed, *stale))
    return p.Instance(index=i, host=topo.hosts[i // per_host], local_index=local, ild=i // topo.instances_per_ild,
                      gcd=gcd, replica_offset=offset, num_local_replicas=topo.replicas_per_instance, argv=argv,
                      cwd=cwd, env=environment, placement=placement, mpi_local_args=tuple(mpi_args))


# -- the user's -x of a variable poprun sets ---------------------------------------------------
# What explain shows is what the instances get: each variable poprun sets is either the user's to
# replace (the layout's, PR233 warns when the value differs; MASTER_ADDR, MASTER_PORT, the
# executable cache as a fixed one, IPUOF_VIPU_API_TIMEOUT, ...) or refused (PR232), here:
PER_ATTEMPT = {
    names.RESTART_COUNT: "the number of restarts before each attempt",
    names.TORCHELASTIC_RESTART_COUNT: "the number of restarts before each attempt",
    names.RUN_ID: "the run's id, by which poprun finds its instances",
    names.TORCHELASTIC_RUN_ID: "the run's id",
    names.TORCHELASTIC_ERROR_FILE: "a file of each instance's own for each attempt, which its failure report reads",
}
_MPI_OWNED = (names.OMPI_RANK, names.OMPI_SIZE, names.OMPI_LOCAL_RANK, names.OMPI_LOCAL_SIZE, *names.MPI_RUNTIME_MARKERS)
_PARTITION_FLAGS = {names.VIPU_API_HOST: "--vipu-server-host", names.VIPU_API_PORT: "--vipu-server-port",
                    names.VIPU_API_PARTITION_ID: "--vipu-partition"}
# Computed from the layout for each instance: replacing one is allowed, with a warning (PR233).
_LAYOUT = (names.NUM_TOTAL_REPLICAS, names.NUM_IPUS_PER_REPLICA, names.NUM_LOCAL_REPLICAS,
           names.UNIFORM_REPLICAS_PER_INSTANCE, names.REPLICA_INDEX_OFFSET, names.LOCAL_INSTANCE_INDEX,
           names.INSTANCE_INDEX, names.NUM_INSTANCES, names.TORCH_RANK, names.TORCH_WORLD_SIZE,
           names.TORCH_LOCAL_RANK, names.TORCH_LOCAL_WORLD_SIZE, names.TORCH_GROUP_RANK, names.TORCH_GROUP_WORLD_SIZE,
           names.TORCH_ROLE_RANK, names.TORCH_ROLE_WORLD_SIZE, names.TORCH_ROLE_NAME, names.TORCHELASTIC_MAX_RESTARTS,
           names.VIPU_API_GCD_ID)


def user_variables(spec: Spec) -> list[tuple[EnvVarSpec, SourceSpan, bool]]:
    """Return every ``-x`` of the spec: the variable, where it was given, and whether it is for every instance."""
    found = [(e.value, e.origin, True) for e in spec.env]
    return found + [(var, a.origin, False) for a in spec.instance_args for var in a.value.env]


def check_user_env(s: Solver, *, partition: bool) -> None:
    """
    Refuse each ``-x`` of a variable poprun sets itself in a way the user's value cannot replace.

    ``partition``: the plan has a partition step (not offline), whose variables poprun passes on.

    Diagnostics: PR232 (a variable set for each attempt, one MPI sets, or the partition's), PR234
    (the executable cache per instance, forwarded, or given twice).
    """
    for var, origin, every in user_variables(s.spec):
        name, how = var.name, f"-x {var.name}" + ("" if var.value is None else "=...")
        if name in PER_ATTEMPT:
            s.fail("PR232", "a variable poprun sets itself", span=origin,
                   detail=f"{how}: poprun sets {name} when each attempt starts ({PER_ATTEMPT[name]}), so the "
                          "instances would never see this value",
                   hint=f"remove {how}; name your own variable for what you need (poprun's {name} stays as it is)")
        elif name in _MPI_OWNED or name.startswith("OMPI_COMM_WORLD_"):
            s.fail("PR232", "a variable poprun sets itself", span=origin,
                   detail=f"{how}: {name} is MPI's; mpirun sets it after every -x (and poprun from the plan on every "
                          "other backend), so this value would not be what runs",
                   hint=f"remove {how}; for an index of your own, read POPDIST_INSTANCE_INDEX or RANK")
        elif name in _PARTITION_FLAGS and partition:
            flag = _PARTITION_FLAGS[name]
            s.fail("PR232", "a variable poprun sets itself", span=origin,
                   detail=f"{how}: poprun acquires the partition and gives every instance its {name}; this value "
                          "would send the instances to another partition than the one acquired",
                   hint=f"give {flag} instead: poprun then acquires that partition and passes it on")
        elif name == names.EXECUTABLE_CACHE_PATH and (var.value is None or not every):
            s.fail("PR234", "executable cache not a fixed path for the run", span=origin,
                   detail=f"{how}" + (" forwards the launching shell's cache path, which the plan cannot show"
                                      if var.value is None else " sets the cache for one instance; the executable "
                                      "cache is one for the run"),
                   hint="name the directory for every instance: --executable-cache-path DIR "
                        "(or -x POPDIST_EXECUTABLE_CACHE_PATH=DIR in --mpi-local-args)")


def _warn_replaced(s: Solver, computed: dict[str, str], user: list[EnvVarSpec]) -> None:
    """PR233 (warning, once per variable) for a ``-x`` that replaces a value of the layout with another one."""
    for var in user:
        if var.name not in _LAYOUT or computed.get(var.name) == var.value:
            continue
        origin = next((where for v, where, _ in user_variables(s.spec) if v.name == var.name), s.origin("env"))
        if any(d.code == "PR233" and d.detail.startswith(f"poprun computes {var.name} ") for d in s.diags.warnings):
            continue
        given = "the launching shell's value (or none)" if var.value is None else f"'{var.value}'"
        s.warn("PR233", "-x replaces a value of the layout", span=origin,
               detail=f"poprun computes {var.name} from the layout ('{computed.get(var.name, '')}' for instance "
                      f"{computed.get(names.INSTANCE_INDEX, '?')}); the instances get {given} instead, as explain shows",
               hint=f"remove -x {var.name} unless the program must see another layout than the one planned")


def apply_user_env(env: dict[str, str], forward: list[str], user: list[EnvVarSpec]) -> None:
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

