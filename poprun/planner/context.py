"""
What the solver may know about the world: environment, working directory, user, V-IPU config.

Layer: ``poprun.planner``; imports ``poprun.core``, and the planner's probes of the world
(:mod:`machine`, :mod:`mpiuse`, :mod:`address`) lazily, in :meth:`Context.from_process`; never
a backend (what reads other hosts' topologies is given by the caller). The solver itself reads
nothing from the process: the CLI builds a :class:`Context` once and tests
build their own, so solving stays pure and deterministic.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from poprun.core.record import field, record

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from poprun.planner.machine import HostTopology
    from poprun.planner.netroute import RouteAnswer
    from poprun.planner.setting import Setting
    from poprun.planner.trait import Traits

VIPU_CONFIG_FILES = ("~/.vipu/vipu-cli.hcl", "/etc/vipu/vipu-cli.hcl")
_HCL_ITEM = r'^\s*([A-Za-z_-]+)\s*=\s*"?([^"\n]*)"?\s*$'  # an item of a V-IPU configuration file (re.MULTILINE)


def _sorted(mapping: Mapping[str, str]) -> dict[str, str]:
    return dict(sorted(mapping.items()))


@record
class Context:
    """The facts planning depends on. ``environ`` is the launching shell's environment."""

    environ: Mapping[str, str] = field(factory=dict)
    cwd: str = "/"
    is_root: bool = False
    local_names: tuple[str, ...] = ("localhost", "127.0.0.1", "::1")  # this machine (poprun.core.localhost)
    vipu_config: Mapping[str, str] = field(factory=dict)
    vipu_config_file: str | None = None
    # This machine's topology, read when placement needs it (sysfs: poprun.planner.machine.discover).
    probe: Callable[[], HostTopology] | None = field(default=None, eq=False)
    # This machine's accelerators added to its topology, read when devices are asked (sysfs and
    # nvidia-smi: poprun.planner.machine.discover_devices).
    device_probe: Callable[[HostTopology], HostTopology] | None = field(default=None, eq=False)
    # Other hosts' topologies, read when placement needs them (a backend's probe_topologies: the ssh backend's).
    remote_probe: Callable[[tuple[str, ...]], Mapping[str, HostTopology | str]] | None = field(default=None, eq=False)
    # Why a program (argv, cwd) will call MPI, or None (poprun.planner.mpiuse.probe), and where mpirun is.
    mpi_probe: Callable[[tuple[str, ...], str], str | None] | None = field(default=None, eq=False)
    mpirun: Callable[[], str | None] | None = field(default=None, eq=False)
    # srun's MPI plugins (``srun --mpi=list``; None: no srun, or no answer), asked only inside an allocation.
    srun_mpi: Callable[[], tuple[str, ...] | None] | None = field(default=None, eq=False)
    # The host name ssh connects to for a name (ssh_config's HostName, by ``ssh -G``: local, no network).
    ssh_hostname: Callable[[str, Mapping[str, str]], str | None] | None = field(default=None, eq=False)
    # Slurm's address of a node (NodeAddr, by ``scontrol``); a launch only, since it asks the Slurm controller.
    slurm_node_address: Callable[[str, Mapping[str, str]], str | None] | None = field(default=None, eq=False)
    # Whether a name resolves here (None: no answer in time); a launch only, since DNS may be slow.
    resolves: Callable[[str], bool | None] | None = field(default=None, eq=False)
    # Each host's route to MASTER_ADDR (hosts, MASTER_ADDR -> host -> answer or why none; poprun.planner.netroute),
    # read while planning when given; None: the plan says "at launch" and the apply step reads the hosts.
    routes: Callable[[tuple[str, ...], str], Mapping[str, RouteAnswer | str]] | None = field(default=None, eq=False)
    # A plugin backend's declared traits and settings rows, by name (the registry's; None: a built-in's are used).
    backend_declares: Callable[[str], tuple[Traits | None, tuple[Setting, ...]]] | None = field(default=None, eq=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "environ", _sorted(self.environ))

    @classmethod
    def from_process(cls, *, probe_hosts: bool = False,
                     remote_probe: Callable[..., Mapping[str, HostTopology | str]] | None = None,
                     backend_declares: Callable[[str], tuple[Traits | None, tuple[Setting, ...]]] | None = None,
                     ) -> Context:
        """
        Return the context of this process.

        ``probe_hosts``: other hosts' topologies may be read when placement needs them, with
        ``remote_probe(hosts, *, environ)`` (a backend's ``probe_topologies``, which the caller
        gives: the planner imports no backend), and host names resolved (a launch);
        ``poprun plan`` never waits on hosts or on DNS, and leaves those instances unbound.
        ``backend_declares(name)``: a plugin backend's traits and settings rows (the registry's
        :func:`~poprun.backends.registry.declared`), asked only for a name that is not a built-in.
        """
        from poprun.core.localhost import local_names

        config, where = _read_vipu_config()
        from poprun.planner import address
        from poprun.planner.machine import discover

        environ = dict(os.environ)
        probe = remote_probe if probe_hosts else None
        return cls(environ=environ, cwd=_cwd(), is_root=os.geteuid() == 0, probe=discover, device_probe=_devices,
                   remote_probe=(lambda hosts: probe(hosts, environ=os.environ)) if probe is not None else None,
                   ssh_hostname=address.ssh_hostname,
                   slurm_node_address=address.slurm_node_address if probe_hosts else None,
                   resolves=address.resolves if probe_hosts else None,
                   mpi_probe=lambda argv, cwd: _mpi_probe(argv, cwd, environ), mpirun=lambda: _mpirun(environ),
                   srun_mpi=_once(lambda: _srun_mpi(environ)),
                   local_names=local_names(), vipu_config=config, vipu_config_file=where,
                   backend_declares=_by_name(backend_declares) if backend_declares is not None else None)


def _devices(topology: HostTopology) -> HostTopology:
    from poprun.planner.machine import discover_devices

    return discover_devices(topology)


def _mpi_probe(argv: tuple[str, ...], cwd: str, environ: Mapping[str, str]) -> str | None:
    from poprun.planner.mpiuse import probe

    return probe(argv, cwd, environ)


def _mpirun(environ: Mapping[str, str]) -> str | None:
    from poprun.planner.mpiuse import mpirun_path

    return mpirun_path(environ)


def _once(ask: Callable[[], tuple[str, ...] | None]) -> Callable[[], tuple[str, ...] | None]:
    """Return ``ask``, asked at most once: its first answer is kept."""
    kept: list[tuple[str, ...] | None] = []

    def answer() -> tuple[str, ...] | None:
        if not kept:
            kept.append(ask())
        return kept[0]

    return answer


def _by_name(ask: Callable[[str], tuple[Traits | None, tuple[Setting, ...]]],
             ) -> Callable[[str], tuple[Traits | None, tuple[Setting, ...]]]:
    """Return ``ask``, asked at most once per name (it makes a registry: the plugins are read once)."""
    kept: dict[str, tuple[Traits | None, tuple[Setting, ...]]] = {}

    def answer(name: str) -> tuple[Traits | None, tuple[Setting, ...]]:
        if name not in kept:
            kept[name] = ask(name)
        return kept[name]

    return answer


def _srun_mpi(environ: Mapping[str, str]) -> tuple[str, ...] | None:
    from poprun.planner.mpiuse import srun_mpi_plugins

    return srun_mpi_plugins(environ)


def _cwd() -> str:
    """Return the current directory; when it was removed, the path the shell knew it by ($PWD, else /)."""
    try:
        return os.getcwd()  # os.getcwd is what Path.cwd calls
    except FileNotFoundError:  # the backend then says the working directory is missing, or a host has it
        return os.environ.get("PWD") or "/"


def _read_vipu_config() -> tuple[dict[str, str], str | None]:
    """Return the items of the first V-IPU client configuration file found (``api-host`` ...)."""
    from poprun.core.diagnostic import DiagnosticError
    from poprun.core.purepath import exists, expanduser
    from poprun.core.textfile import read_text_file

    for name in VIPU_CONFIG_FILES:
        path = expanduser(name)
        if not exists(path):
            continue
        try:  # bounded: a FIFO or device there is skipped, never waited on
            text = read_text_file(path, key="vipu configuration")
        except DiagnosticError:
            continue
        import re  # here, not at the top: only a V-IPU configuration file needs it (start-up stays lean)

        return {k: v.strip() for k, v in re.findall(_HCL_ITEM, text, re.MULTILINE)}, path
    return {}, None
