"""
The solver's policies: V-IPU partition, executable cache, output, placement, program and backend.

Layer: ``poprun.planner``; each function records its decisions on the :class:`Solver`.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from popdist import env as names
from poprun.core.record import evolve
from poprun.core.span import SourceSpan
from poprun.planner import plan as p
from poprun.planner import value as conv
from poprun.planner.spec import Sourced, Spec
from poprun.planner.state import Solver, is_on, value_of
from poprun.planner.trait import BUILTIN, CONSERVATIVE, Traits, builtin_traits

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from typing import TypeVar

    from poprun.planner.setting import Setting

    T = TypeVar("T")
_SHOWN_HOSTS = 3
_SRUN_PLUGIN = re.compile(r"[A-Za-z0-9_]{1,32}\Z")  # srun --mpi=NAME (as plancheck checks a saved plan's)

def vipu(s: Solver, key: str, given: Sourced[T] | None, *, env_name: str, hcl: str, default: T,
          convert: Callable[[str], T]) -> T:
    """Decide a V-IPU setting: the flag, then the environment, then the vipu configuration, then the default."""
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


def _server_host(s: Solver, given: Sourced[str] | None) -> Sourced[str] | None:
    """Return the V-IPU server host given, brackets of an IPv6 address removed; PR105 when it is no host (``[::1``)."""
    if given is None:
        return None
    try:
        return Sourced(conv.to_server_host(given.value), given.origin)
    except conv.InvalidValueError as problem:
        s.fail(problem.code, "invalid V-IPU server host", detail=problem.detail, span=given.origin, hint=problem.hint)
        return None


def partition(s: Solver, topo: p.Topology) -> p.Partition | None:
    """Return the partition the launch uses (None in offline mode), seed section 2.8."""
    spec = s.spec
    if is_on(spec.offline_mode):
        s.decide("partition", "none", spec.offline_mode.origin if spec.offline_mode else SourceSpan.default("x"),
                 "offline mode: no partition and no devices")
        return None
    host = vipu(s, "vipu_server_host", _server_host(s, spec.vipu_server_host), env_name=names.VIPU_API_HOST,
                hcl="api-host", default="localhost", convert=conv.to_server_host)
    port = vipu(s, "vipu_server_port", spec.vipu_server_port, env_name=names.VIPU_API_PORT, hcl="api-port",
                 default=8090, convert=int)
    name: str | None = vipu(s, "partition", spec.partition, env_name=names.VIPU_API_PARTITION_ID,
                             hcl="partition", default="", convert=str)
    name = name or None
    if name is None:
        s.decisions[-1] = evolve(s.decisions[-1], value="(the only one)",
                                       reason="not given: the only partition of the allocation, found at apply time")
    timeout = s.pick("vipu_server_timeout", spec.vipu_server_timeout, 120, "default")
    update = s.pick("update_partition", spec.update_partition, default=False,
                    reason="default: an unsuitable partition is an error")
    remove = s.pick("remove_partition", spec.remove_partition, default=True,
                    reason="default: a partition poprun creates is removed at exit")
    gcds = max(1, topo.num_instances)
    return p.Partition(
        name=name, allocation=value_of(spec.allocation), server_host=host, server_port=port, timeout_s=timeout,
        num_ipus=topo.num_ipus, num_gcds=gcds, num_ilds=topo.num_ilds, sync_type=value_of(spec.sync_type),
        ipu_link_routing_type=value_of(spec.ipu_link_routing_type),
        gw_link_routing_type=value_of(spec.gw_link_routing_type), update=update,
        reset=value_of(spec.reset_partition), remove=remove,
        attempts=value_of(spec.partition_attempts) or 1, actions=partition_actions(name, update, remove, spec),
    )


def partition_actions(name: str | None, update: bool, remove: bool, spec: Spec) -> tuple[str, ...]:
    """Return what apply may do to the partition, each with the rule that allows it."""
    if name is None:
        return ("use the only partition of the allocation (decided at apply time)",)
    actions = [f"use partition '{name}' if it exists and matches the topology"]
    if update:
        actions.append("otherwise create it, or remove and create it again (--update-partition=yes)")
    else:
        actions.append("otherwise stop with an error (--update-partition=no)")
    reset = value_of(spec.reset_partition)
    actions.append("reset it before running" if reset else "do not reset it" if reset is False
                   else "reset it if non-reconfigurable (default)")
    if update:
        actions.append("remove it at exit if poprun created it" if remove else "keep it at exit (--remove-partition=no)")
    return tuple(actions)


def cache(s: Solver, topo: p.Topology) -> p.Cache:
    """Return the executable cache policy of the launch mode (seed sections 2.3-2.4)."""
    given = _cache_given(s)
    framework = s.ctx.environ.get("POPTORCH_CACHE_DIR") or env_set_value(s.spec, "POPTORCH_CACHE_DIR")
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


def _cache_given(s: Solver) -> Sourced[str] | None:
    """
    Return the fixed cache path the user gave: ``--executable-cache-path``, or ``-x POPDIST_EXECUTABLE_CACHE_PATH=DIR``.

    The variable is the cache as the instances see it, so a value of it for every instance is
    the run's fixed cache, exactly as if given with the flag. Diagnostics: PR234 when both
    name different directories.
    """
    given = s.spec.executable_cache_path
    variables = [e for e in s.spec.env if e.value.name == names.EXECUTABLE_CACHE_PATH and e.value.value is not None]
    if not variables:
        return given
    last = variables[-1]
    if given is not None and given.value != last.value.value:
        s.fail("PR234", "executable cache not a fixed path for the run", span=last.origin,
               detail=f"-x {names.EXECUTABLE_CACHE_PATH}={last.value.value} and --executable-cache-path={given.value} name "
                      "two caches; the instances would see only one of them",
               hint="give the cache once: --executable-cache-path DIR")
    return Sourced(value=str(last.value.value), origin=last.origin)


def env_set_value(spec: Spec, name: str) -> str | None:
    """Return the last value the spec sets for ``name``, or None."""
    values = [e.value.value for e in spec.env if e.value.name == name and e.value.value is not None]
    return values[-1] if values else None


def mpi_global(s: Solver) -> tuple[str, ...]:
    """Return the words of --mpi-global-args."""
    return s.spec.mpi_global_args.value if s.spec.mpi_global_args else ()


def output(s: Solver, topo: p.Topology) -> p.Output:
    """Return how instance output reaches the user."""
    args = mpi_global(s)
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
    return p.Output(tag="--tag-output" in args, output_filename=filename, only_from_instance=value_of(only),
                    print_topology=is_on(s.spec.print_topology), verbosity=value_of(s.spec.verbosity) or 0)


def placement(s: Solver, topo: p.Topology) -> p.Placement:
    """Return the placement strategy and whether NUMA awareness is on."""
    strategy = s.pick("process_placement", s.spec.process_placement, "spreadnuma", "default: NUMA nodes are "
                      "divided among the instances of each host")
    if s.spec.numa_aware is not None:
        aware = s.decide("numa_aware", s.spec.numa_aware.value, s.spec.numa_aware.origin, "as given")
    elif s.spec.devices_per_instance is not None:
        aware = s.decide("numa_aware", True, SourceSpan.derived("numa_aware"),  # noqa: FBT003 - a decided value
                         "devices per instance: each instance is bound to its devices' NUMA node (docs/devices.md)")
    else:
        aware = s.decide("numa_aware", topo.instances_per_host > 1, SourceSpan.derived("numa_aware"),
                         f"{topo.instances_per_host} instance{'s' if topo.instances_per_host > 1 else ''} per host: "
                         "NUMA awareness is on with more than one")
    return p.Placement(numa_aware=aware and strategy != "disabled", strategy=strategy)


def program(s: Solver, *, require_program: bool) -> tuple[str, ...]:
    """Return the program and its arguments (PR209 when there is none)."""
    if s.spec.program is not None and s.spec.program.value:
        return s.decide("program", s.spec.program.value, s.spec.program.origin, "as given")
    span = SourceSpan.flag("PROGRAM")
    make = s.fail if require_program else s.warn
    make("PR209", "no program", detail="no program to launch was given", span=span,
         hint="add the program and its arguments after poprun's options, e.g. poprun --num-instances 2 python3 train.py")
    return ()


def backend(s: Solver, topo: p.Topology, *, uses_mpi: str | None = None) -> p.BackendChoice:
    """
    Return the backend that runs the plan, and why.

    A program that will call MPI (:mod:`poprun.planner.mpiuse`) runs under ``mpirun``, as every
    program did under real PopRun, so that its instances form one MPI world; without ``mpirun``
    it is PR313 (a warning: each instance would be an MPI world of one). ``uses_mpi``: what
    :func:`mpi_use` found, computed once by the caller.
    """
    if s.spec.backend is not None:
        name = s.decide("backend", s.spec.backend.value, s.spec.backend.origin, "as given")
        return _choice(s, name, "as given")
    name, reason = backend_name(s, topo, uses_mpi=uses_mpi)
    if not traits_for(s, name).mpi_world and (why := uses_mpi) is not None:  # slurm: srun_mpi (PR230)
        instead = ("offline mode runs the instances of other hosts here, where mpirun would start them there"
                   if _offline_elsewhere(s, topo) else "Open MPI's mpirun is not on PATH")
        s.warn("PR313", "the program calls MPI but will not run under mpirun",
               detail=f"{why}, and {instead}: each of the {topo.num_instances} instances will be an MPI world of 1",
               span=SourceSpan.derived("backend"),
               hint="install Open MPI (apt-get install openmpi-bin) so that poprun starts the instances with mpirun, "
                    "as PopRun did, or give --backend to choose (--backend local keeps them apart on purpose)")
    s.decide("backend", name, SourceSpan.derived("backend"), reason)
    return _choice(s, name, reason)


def _choice(s: Solver, name: str, reason: str) -> p.BackendChoice:
    """
    Return backend ``name`` with its traits and the settings it reads, decided from the planning shell's environment.

    Diagnostics: PR225 for a setting of the backend's set to a value it does not take.
    """
    from poprun.planner.setting import backend_rows, plan_settings

    traits, declared = _declared(s, name)
    settings, problems = plan_settings(backend_rows(name, declared), s.ctx.environ)
    s.diags.extend(problems)
    return p.BackendChoice(name=name, reason=reason, traits=traits, settings=settings)


def traits_for(s: Solver, name: str) -> Traits:
    """Return backend ``name``'s traits: the built-in table's, else what the plugin declares (else the conservative ones)."""
    return _declared(s, name)[0]


def _declared(s: Solver, name: str) -> tuple[Traits, tuple[Setting, ...]]:
    if name in BUILTIN or s.ctx.backend_declares is None:
        return builtin_traits(name), ()
    traits, settings = s.ctx.backend_declares(name)
    return traits or CONSERVATIVE, settings


def backend_name(s: Solver, topo: p.Topology, *, uses_mpi: str | None = None) -> tuple[str, str]:
    """
    Return the name of the backend that will run the plan, and why; records nothing.

    A program that will call MPI (:mod:`poprun.planner.mpiuse`) runs under ``mpirun``, as every
    program did under real PopRun, so that its instances form one MPI world, when ``mpirun`` is
    found and offline mode does not move other hosts' instances here (:func:`backend` warns
    PR313 otherwise).
    """
    if s.spec.backend is not None:
        return s.spec.backend.value, "as given"
    why = uses_mpi
    job = s.ctx.environ.get("SLURM_JOB_ID")  # poprun.planner.slurm.JOB_ID, not imported outside an allocation
    if why is not None and job and not is_on(s.spec.offline_mode):
        if (found := srun_mpi_plugin(s)) is not None:
            return "slurm", (f"inside Slurm job {job}: the instances start as one srun step, with srun's MPI plugin "
                             f"{found[0]} (the program calls MPI: {why})")
        if s.ctx.mpirun is None or not s.ctx.mpirun():
            return "slurm", f"inside Slurm job {job}: the instances start as one srun step"
        return "mpirun", (f"inside Slurm job {job}, the program calls MPI ({why}) and srun here has no pmix plugin: "
                          "mpirun starts the instances through Slurm as one MPI world (--backend chooses another)")
    if why is not None and not _offline_elsewhere(s, topo) and s.ctx.mpirun is not None and s.ctx.mpirun():
        return "mpirun", (f"the program calls MPI ({why}): mpirun starts the instances as one MPI world, as PopRun "
                          "did (--backend chooses another)")
    if is_on(s.spec.offline_mode):
        return "offline", "offline mode: every instance runs on this machine"
    if s.ctx.environ.get("SLURM_JOB_ID"):  # poprun.planner.slurm.JOB_ID, not imported outside an allocation
        return "slurm", f"inside Slurm job {s.ctx.environ['SLURM_JOB_ID']}: the instances start as one srun step"
    if all(h in s.ctx.local_names for h in topo.hosts):
        return "local", "every host is this machine"
    remote = [h for h in topo.hosts if h not in s.ctx.local_names]
    shown = ", ".join(remote[:_SHOWN_HOSTS]) + (", ..." if len(remote) > _SHOWN_HOSTS else "")
    return "ssh", f"remote hosts ({shown}) are reached with ssh"


def mpi_use(s: Solver, topo: p.Topology, argv: tuple[str, ...], cwd: str) -> str | None:
    """
    Return why the program will call MPI, or None: outside Slurm only for several instances.

    Inside an allocation even one instance counts: a task of an srun step that calls MPI needs
    an MPI plugin of srun's (:func:`srun_mpi`), or Open MPI stops it in ``MPI_Init``.
    """
    if s.ctx.mpi_probe is None or (topo.num_instances < 2 and not s.ctx.environ.get("SLURM_JOB_ID")):  # noqa: PLR2004
        return None
    return s.ctx.mpi_probe(argv, cwd)


def srun_mpi_plugin(s: Solver) -> tuple[str, str] | None:
    """
    Return srun's MPI plugin for a program that calls MPI, and why; None when there is none that works.

    ``SLURM_MPI_TYPE`` when the user set it (srun's own variable: their choice), else ``pmix``
    when this machine's srun lists it (``srun --mpi=list``): Open MPI, as Debian builds it,
    starts under srun only with PMIx (it has no PMI2), and Slurm's default (``MpiDefault``,
    ``none`` unless the site set it) stops it in ``MPI_Init``.
    """
    given = s.ctx.environ.get("SLURM_MPI_TYPE", "").strip()
    if given:
        return given, "taken from SLURM_MPI_TYPE"
    plugins = s.ctx.srun_mpi() if s.ctx.srun_mpi is not None else None
    if plugins and "pmix" in plugins:
        return "pmix", ("the program calls MPI and srun here has the pmix plugin: the tasks form one MPI world "
                        "(Open MPI starts under srun with PMIx; Slurm's default plugin would stop it in MPI_Init)")
    return None


def srun_mpi(s: Solver, backend: p.BackendChoice, uses_mpi: str | None) -> str | None:
    """
    Return the MPI plugin the slurm backend gives srun (``--mpi=``) for a program that calls MPI; None otherwise.

    PR230 when the program calls MPI and no plugin that works is known: the launch would stop
    in ``MPI_Init`` (``OMPI was not built with SLURM's PMI support``).
    """
    if not backend.traits.srun_step() or uses_mpi is None:
        return None
    found = srun_mpi_plugin(s)
    plugins = s.ctx.srun_mpi() if s.ctx.srun_mpi is not None else None
    if found is not None:
        plugin, why = found
        if not why.startswith("taken"):
            return s.decide("srun mpi", plugin, SourceSpan.derived("srun mpi"), why)
        if _SRUN_PLUGIN.match(plugin) and (plugins is None or plugin in plugins):
            return s.decide("srun mpi", plugin, SourceSpan.env("SLURM_MPI_TYPE"), why)
        known = f"srun --mpi=list names {', '.join(plugins) or 'none'}" if plugins is not None else \
            "an MPI plugin's name is letters, digits and '_'"
        s.fail("PR231", "SLURM_MPI_TYPE names no MPI plugin of srun's",
               detail=f"SLURM_MPI_TYPE is {plugin!r}, and {known}: srun would refuse the step",
               span=SourceSpan.env("SLURM_MPI_TYPE"),
               hint="set SLURM_MPI_TYPE to one of srun --mpi=list (pmix for Open MPI), or unset it to let poprun choose")
        return None
    listed = ("srun --mpi=list gave no answer here" if plugins is None else
              f"srun --mpi=list names no pmix plugin (only {', '.join(plugins) or 'none'})")
    s.fail("PR230", "the program calls MPI but srun here has no MPI plugin that starts it",
           detail=f"{uses_mpi}, and {listed}: under the slurm backend each task would stop in MPI_Init",
           span=s.origin("backend") if s.spec.backend is not None else SourceSpan.derived("backend"),
           hint="run with --backend mpirun (inside the allocation mpirun starts its daemons through Slurm), install "
                "Slurm's pmix plugin (Debian: libpmix-dev), or set SLURM_MPI_TYPE to a plugin that works here")
    return None


def _offline_elsewhere(s: Solver, topo: p.Topology) -> bool:
    """Return whether offline mode runs here the instances of hosts that are not this machine."""
    return is_on(s.spec.offline_mode) and any(h not in s.ctx.local_names for h in topo.hosts)




def crowded_hosts(s: Solver, topo: p.Topology, instances: tuple[p.Instance, ...],
                  backend: p.BackendChoice) -> tuple[str, ...]:
    """
    Return the hosts of an mpirun launch that hold more instances than they have CPUs, and say so.

    OpenMPI busy-polls unless it knows a host is oversubscribed; ``-H host:N`` tells it the host
    has a slot per instance, so the mpirun command asks such hosts' processes to yield
    (:data:`poprun.backends.mpirun.command.YIELD`). Only this machine's CPUs (its cpuset) are known
    without asking a host; a recorded ``POPRUN_HOST_TOPOLOGY`` describes placement, not this count.
    """
    if not backend.traits.mpirun_world():
        return ()
    counts: dict[str, int] = {}
    for instance in instances:
        counts[instance.host] = counts.get(instance.host, 0) + 1
    crowded = []
    for host in topo.hosts:
        cpus = _known_cpus(s, host)
        if cpus is not None and counts.get(host, 0) > cpus:
            crowded.append(host)
            s.decide(f"mpi yield {host}", "yes", SourceSpan.derived("mpi"),
                     f"{counts[host]} instances on {cpus} CPU{'s' if cpus != 1 else ''}: their MPI processes yield "
                     "when idle (--mca mpi_yield_when_idle 1), as under --oversubscribe, instead of busy-polling")
    return tuple(crowded)


def _known_cpus(s: Solver, host: str) -> int | None:
    """Return how many CPUs an instance on ``host`` may use, where that is known without asking the host."""
    from poprun.planner.binding import TOPOLOGY_VARIABLE
    from poprun.planner.setting import setting_value

    if setting_value(TOPOLOGY_VARIABLE, s.ctx.environ) or host not in s.ctx.local_names or s.ctx.probe is None:
        return None  # a recorded topology is for placement; another host's CPUs are its own
    found = s.ctx.probe()
    return len(found.cpuset) if found.cpuset is not None else sum(len(node.cpus) for node in found.numa_nodes)
