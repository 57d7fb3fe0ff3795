"""
The backend registry: a backend name to a factory that imports its module lazily.

Layer: ``poprun.backends``; imports ``poprun.core`` and :mod:`poprun.backends.base`, never a
backend module at import time (a built-in factory imports its module when called) and never
the spec or the solver. A registry is an object passed in; :func:`default_registry` builds a
new one on every call, never a global cache, so tests can make their own.

A registry is a command's backend session: one per command, handed to planning (the topology
probe, :func:`topology_prober`) and to the apply step. :meth:`BackendRegistry.get` makes a
backend once and gives that same object on every later call, so that what one step opens (the
ssh backend's connections: the probe's, the port plan's) the next one uses;
:meth:`BackendRegistry.close` closes every backend it made that has ``close()``
(:class:`~poprun.backends.base.Closes`), and the command calls it in a ``finally``.
:class:`OnDemand` is a registry made on first use, for a command that may need none.

Built-ins are listed here. Third parties add backends through the entry-point group
``poprun.backends`` (``mybackend = "pkg.mod:MyBackend"``, a class or function that returns a
backend when called with no argument), as submitit does. A plugin that fails to import (even
by ``sys.exit()``) becomes a PR401 warning and the rest works; one named like a built-in is a
PR463 warning and the built-in stays; a name two plugins declare is refused with PR402 when it
is asked for; a plugin's backend that fails once made is PR460-PR462 naming it
(:mod:`poprun.backends._plugin`); ``POPRUN_NO_PLUGINS=1`` skips discovery, like
``HYPOTHESIS_NO_PLUGINS``.

The helpers :func:`describe`, :func:`find_format` and :func:`topology_prober` reach the
optional protocol methods of :mod:`poprun.backends.base` (``describe``, ``formats``,
``probe_topologies``), so that the CLI and render never ask a backend by name what it offers.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Mapping

from poprun.backends.base import Backend, PlanFormat
from poprun.core.diagnostic import Diagnostic, DiagnosticError, error, warning
from poprun.core.hint import did_you_mean
from poprun.core.record import evolve, record
from poprun.core.span import SourceSpan

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from importlib.metadata import EntryPoint
    from types import TracebackType
    from typing import Self

    from poprun.planner.machine import HostTopology
    from poprun.planner.plan import LaunchPlan
    from poprun.planner.setting import Setting
    from poprun.planner.trait import Traits

    TopologyProbe = Callable[..., Mapping[str, HostTopology | str]]
    """``probe(hosts, *, environ)``: each host's topology, or why it could not be read."""

Factory = Callable[[], Backend]

GROUP = "poprun.backends"
NO_PLUGINS = "POPRUN_NO_PLUGINS"
BUILT_IN = "built in to poprun"
_NO = ("", "0", "no", "false", "off")


def _local() -> Backend:
    from poprun.backends.local import LocalBackend

    return LocalBackend()


def _mpirun_of(registry: BackendRegistry) -> Factory:
    """Return the factory of ``registry``'s mpirun backend, which reaches other hosts through the registry's ssh (or slurm) backend."""

    def _mpirun() -> Backend:
        from poprun.backends.mpirun.backend import MpirunBackend

        # run_on_host: other hosts as mpirun's daemons are started: the ssh backend's way, over its connections
        # (closed with the registry); inside a Slurm allocation, where mpirun starts them with srun, the slurm backend's
        return MpirunBackend(remote=lambda: registry.get(  # type: ignore[arg-type,return-value]
            "slurm" if os.environ.get("SLURM_JOB_ID") else "ssh"))

    return _mpirun


def _ssh() -> Backend:
    from poprun.backends.ssh.backend import SshBackend

    return SshBackend()


def _slurm() -> Backend:
    from poprun.backends.slurm.backend import SlurmBackend

    return SlurmBackend()


def _offline() -> Backend:
    from poprun.backends.offline import OfflineBackend

    return OfflineBackend()


@record
class _Source:
    """Where a name comes from: its factory, and words for messages (``built in to poprun``)."""

    factory: Factory | None  # None for a plugin that failed to load
    origin: str
    distribution: str | None = None
    traits: Traits | None = None  # a plugin's declared traits (a built-in's are the planner's table)
    settings: tuple[Setting, ...] = ()  # a plugin's declared settings rows


class UnknownBackendError(DiagnosticError, KeyError):
    """
    The registry cannot give the backend asked for (PR400 or PR402).

    A :class:`DiagnosticError` holding one diagnostic, and a :class:`KeyError` (for callers
    that catch that) whose one argument, like ``str()``, is a one-line message.
    """

    def __init__(self, diagnostic: Diagnostic, message: str) -> None:
        super().__init__([diagnostic])
        self.message = message
        self.args = (message,)

    def __str__(self) -> str:
        return self.message


class BackendRegistry:
    """
    Backends by name, one object each (:meth:`get`), closed together (:meth:`close`). A name registered twice must be registered with the same factory.

    A context manager: ``with default_registry() as registry:`` closes it on the way out.
    """

    def __init__(self, factories: Mapping[str, Factory] | None = None) -> None:
        self._sources: dict[str, _Source] = {}
        self._clashes: dict[str, Diagnostic] = {}
        self._broken: list[Diagnostic] = []
        self._made: dict[str, Backend] = {}  # what get() made, by name, in the order made: close() closes them
        for name, factory in (factories or {}).items():
            self.register(name, factory)

    def register(self, name: str, factory: Factory, *, origin: str = "registered in code") -> None:
        """
        Register ``factory`` under ``name``.

        Raises:
            ValueError: when a different factory already has that name (a programmer error).
        """
        known = self._sources.get(name)
        if known is not None and known.factory is not factory:
            msg = f"backend '{name}' is already registered with another factory ({known.origin})"
            raise ValueError(msg)
        self._sources[name] = _Source(factory=factory, origin=origin)

    def add_plugin(self, entry_point: EntryPoint) -> None:
        """
        Add the backend that ``entry_point`` declares, importing its module now.

        Diagnostics:
            PR401 (kept in :attr:`warnings`) when it fails to load; PR463 (a warning too, the plugin
            never imported) when the name is a built-in's; PR402 (raised by :meth:`get` for that
            name) when another plugin has the name. The backends it makes are guarded
            (:mod:`poprun.backends._plugin`: PR460-PR462).
        """
        from poprun.backends import _plugin

        source = _plugin_source(entry_point)
        known = self._sources.get(entry_point.name)
        if known is not None and known.origin == BUILT_IN:
            self._broken.append(_shadowing(entry_point.name, known, source))
            return
        if known is not None:
            self._clashes.setdefault(entry_point.name, _clash(entry_point.name, known, source))
            return
        try:
            loaded = _plugin.load(entry_point)
            if not callable(loaded):
                msg = f"{entry_point.value} is a {type(loaded).__name__}, not a class or function"
                raise TypeError(msg)
        except _plugin.Interrupted:  # Ctrl-C while it loaded: poprun is stopped, not the plugin broken
            raise
        except _plugin.CAUGHT as exc:  # a broken plugin must not stop poprun, even one that calls sys.exit()
            self._broken.append(_broken(entry_point, source, exc))
            self._sources[entry_point.name] = source
            return
        plugin = _plugin.Plugin(entry_point.name, source.origin, source.distribution)
        traits, settings = _plugin.declared(loaded)
        self._sources[entry_point.name] = evolve(source, factory=lambda: _plugin.make(loaded, plugin),
                                                 traits=traits, settings=settings)

    def declared(self, name: str) -> tuple[Traits | None, tuple[Setting, ...]]:
        """
        Return what plugin ``name`` declares of itself: its ``traits`` (None: not declared) and ``settings`` rows.

        Nothing is made; a name that is no plugin (a built-in's, or unknown) declares nothing.
        """
        source = self._sources.get(name)
        return (source.traits, source.settings) if source is not None else (None, ())

    @property
    def warnings(self) -> tuple[Diagnostic, ...]:
        """The PR401 warnings of plugins that failed to load, in the order they were found."""
        return tuple(self._broken)

    def names(self) -> tuple[str, ...]:
        """Return the names of the backends that can be created, sorted."""
        return tuple(sorted(n for n, s in self._sources.items() if s.factory is not None and n not in self._clashes))

    def factory(self, name: str, *, span: SourceSpan | None = None) -> Factory:
        """
        Return the factory of backend ``name``, without calling it.

        ``span`` is where the caller found the name (``$.backend.name`` of a plan file); it
        places the PR400 diagnostic (default: the entry-point group).

        Raises:
            UnknownBackendError: PR402 for a name declared twice, PR400 for any other name
                without a working factory. (PR404, a backend planned for a later version, is
                retired: every backend of the design ships.)
        """
        if name in self._clashes:
            clash = self._clashes[name]
            raise UnknownBackendError(clash, clash.summary)
        source = self._sources.get(name)
        if source is not None and source.factory is not None:
            return source.factory
        diagnostic = _unknown(name, self.names(), broken=source, span=span or _span(name))
        raise UnknownBackendError(diagnostic, f"{diagnostic.summary}: {diagnostic.hint}")

    def get(self, name: str, *, span: SourceSpan | None = None) -> Backend:
        """
        Return the backend of the given name: made on the first call, the same object on every later one.

        It lives as long as the registry's session: :meth:`close` closes it (a later call makes a new one).

        Raises:
            UnknownBackendError: as :meth:`factory` does.
        """
        backend = self._made.get(name)
        if backend is None:
            backend = self.factory(name, span=span)()
            self._made[name] = backend
        return backend

    def close(self) -> None:
        """
        Close every backend :meth:`get` made that has ``close()`` (:class:`~poprun.backends.base.Closes`), the last made first.

        Idempotent, and safe at any point (after a failure, in a ``finally``): a backend never
        made is not made to be closed. Every backend gets its ``close()`` even when one before it
        raised; the first exception is raised once all were called.
        """
        made, self._made = list(self._made.values()), {}
        failed: BaseException | None = None
        for backend in reversed(made):
            close = getattr(backend, "close", None)
            if not callable(close):
                continue
            try:
                close()
            except BaseException as exc:  # noqa: BLE001 - raised below, once every backend was closed
                failed = failed or exc
        if failed is not None:
            raise failed

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()


class OnDemand:
    """
    A command's registry, made by :func:`default_registry` when first asked for (``on_demand()``); :meth:`close` closes it.

    A command that plans and may never need a backend (``poprun plan --format json``) then
    neither scans for plugins nor imports one; a command that does gets one registry for all
    its steps. A context manager, like :class:`BackendRegistry`.
    """

    def __init__(self) -> None:
        self._registry: BackendRegistry | None = None

    def __call__(self) -> BackendRegistry:
        """Return the registry, made now if it was not yet."""
        if self._registry is None:
            self._registry = default_registry()
        return self._registry

    def probe_topologies(self, hosts: tuple[str, ...], *,
                         environ: Mapping[str, str]) -> Mapping[str, HostTopology | str]:
        """Read other hosts' topologies with the registry's backend that can (the registry is made only when placement asks)."""
        prober = topology_prober(self())
        return prober(hosts, environ=environ) if prober is not None else dict.fromkeys(hosts, "no backend reads them")

    def declared(self, name: str) -> tuple[Traits | None, tuple[Setting, ...]]:
        """Return what the plugin ``name`` declares of itself (:meth:`BackendRegistry.declared`), for planning."""
        return self().declared(name)

    def close(self) -> None:
        """Close the registry, if it was made (:meth:`BackendRegistry.close`). Idempotent."""
        if self._registry is not None:
            self._registry.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()


def default_registry(*, environ: Mapping[str, str] | None = None,
                     entry_points: Iterable[EntryPoint] | None = None) -> BackendRegistry:
    """
    Return a new registry of the built-ins (``local``, ``offline``) and the installed plugins.

    Plugins come from ``entry_points`` (default: the group ``poprun.backends`` of the installed
    distributions), unless ``POPRUN_NO_PLUGINS`` is set in ``environ`` (default: this process's).
    """
    registry = BackendRegistry()
    registry.register("local", _local, origin=BUILT_IN)
    registry.register("offline", _offline, origin=BUILT_IN)
    registry.register("ssh", _ssh, origin=BUILT_IN)
    registry.register("mpirun", _mpirun_of(registry), origin=BUILT_IN)
    registry.register("slurm", _slurm, origin=BUILT_IN)
    if _plugins_disabled(os.environ if environ is None else environ):
        return registry
    if entry_points is None:
        if not _may_declare_plugins(sys.path):
            return registry
        from importlib.metadata import entry_points as installed

        entry_points = installed(group=GROUP)
    for entry_point in sorted(entry_points, key=lambda e: (e.name, e.value, _distribution(e) or "")):
        registry.add_plugin(entry_point)
    return registry


def _may_declare_plugins(paths: Iterable[str]) -> bool:
    """
    Return whether any installed distribution on ``paths`` may declare a ``poprun.backends`` entry point.

    A quick scan of the ``entry_points.txt`` files, so that a launch with no plugins installed does
    not pay for importing and running :mod:`importlib.metadata` (about 30 ms of start-up). It only
    filters: the entry points themselves are still read by :mod:`importlib.metadata`.
    """
    marker = f"[{GROUP}]".encode()
    for folder in paths:
        try:
            entries = [e for e in os.scandir(folder or ".") if e.name.endswith((".dist-info", ".egg-info"))]
        except OSError:
            continue
        for entry in entries:
            try:
                with open(os.path.join(entry.path, "entry_points.txt"), "rb") as handle:
                    if marker in handle.read():
                        return True
            except OSError:
                continue
    return False


def _plugins_disabled(environ: Mapping[str, str]) -> bool:
    """Return whether ``POPRUN_NO_PLUGINS`` is set to anything but empty, 0, no, false or off."""
    return environ.get(NO_PLUGINS, "").strip().lower() not in _NO


def _distribution(entry_point: EntryPoint) -> str | None:
    """Return ``name version`` of the distribution that declares ``entry_point``, or None."""
    dist = getattr(entry_point, "dist", None)
    return None if dist is None else f"{dist.name} {dist.version}"


def _plugin_source(entry_point: EntryPoint) -> _Source:
    dist = getattr(entry_point, "dist", None)
    where = f"distribution '{_distribution(entry_point)}'" if dist is not None else "an unknown distribution"
    return _Source(factory=None, origin=f"declared by {where} ({entry_point.value})",
                   distribution=None if dist is None else str(dist.name))


def _span(name: str) -> SourceSpan:
    return SourceSpan.environment(f"entry point {GROUP}:{name}")


def _broken(entry_point: EntryPoint, source: _Source, exc: BaseException) -> Diagnostic:
    """Return the PR401 warning of a plugin that failed to load."""
    from poprun.backends import _plugin

    who = f"'{source.distribution}'" if source.distribution else "the plugin"
    return warning("PR401", f"backend plugin '{entry_point.name}' failed to load",
                   detail=f"'{entry_point.name}' is {source.origin}; loading it raised {_plugin.raised(exc)}",
                   span=_span(entry_point.name),
                   hint=f"reinstall or fix {who}, or set {NO_PLUGINS}=1 to skip plugins; "
                        "the other backends still work")


def _shadowing(name: str, built_in: _Source, plugin: _Source) -> Diagnostic:
    """Return the PR463 warning of a plugin named like a built-in backend (the built-in is used)."""
    who = f"'{plugin.distribution}'" if plugin.distribution else "the plugin"
    return warning("PR463", f"backend plugin '{name}' is ignored: the name is a built-in backend's",
                   detail=f"'{name}' is {built_in.origin} and also {plugin.origin}; the built-in is used",
                   span=_span(name),
                   hint=f"ask the authors of {who} to give their backend a name of its own, or uninstall it; "
                        f"{NO_PLUGINS}=1 skips plugins")


def _clash(name: str, first: _Source, second: _Source) -> Diagnostic:
    """Return the PR402 error of a backend name declared twice."""
    dists = [f"'{s.distribution}'" for s in (first, second) if s.distribution]
    remove = f"uninstall {' or '.join(dists)}" if dists else "remove one of them"
    return error("PR402", f"backend '{name}' is declared twice",
                 detail=f"'{name}' is {first.origin} and also {second.origin}",
                 span=_span(name),
                 hint=f"{remove}, or set {NO_PLUGINS}=1 to use only the built-in backends")


def _choices(names: tuple[str, ...]) -> str:
    return ", ".join(f"'{n}'" for n in names) if names else "none"


def _unknown(name: str, names: tuple[str, ...], *, broken: _Source | None, span: SourceSpan) -> Diagnostic:
    """Return the PR400 error of a name without a working backend."""
    if broken is not None:
        detail = f"'{name}' is {broken.origin}, which failed to load (see PR401)"
    else:
        detail = f"no backend named '{name}' is built in to poprun or installed as a plugin"
    guess = did_you_mean(name, names)
    hint = (f"did you mean '{guess}'? " if guess else "") + f"known backends: {_choices(names)}"
    return error("PR400", f"unknown backend '{name}'", detail=detail, span=span, hint=hint)



def _created(registry: BackendRegistry, name: str) -> Backend | None:
    """Return the registry's backend ``name``, or None when it is unknown, failed to load, or fails to be made."""
    try:
        return registry.get(name)
    except Exception:  # noqa: BLE001 - unknown, or a plugin that cannot be made: it offers nothing; launching it says why
        return None


def _asked(registry: BackendRegistry, name: str, method: Callable[[], object]) -> object:
    """
    Return what an optional method of backend ``name`` answers (a plugin's: None when it raises).

    A plugin's answer is asked for with its prints sent to standard error, and what it raises
    (``sys.exit()`` too) is taken as no answer: a view of the plan never breaks on a plugin.
    """
    if registry._sources[name].origin == BUILT_IN:  # noqa: SLF001 - this module's
        return method()
    from poprun.backends import _plugin

    try:
        with _plugin.stdout_to_stderr():
            return method()
    except _plugin.CAUGHT:
        return None


def describe(registry: BackendRegistry, plan: LaunchPlan) -> str:
    """
    Return the text the plan's backend adds to ``poprun plan`` (its ``describe``), or ``""``.

    ``""`` too when the backend has no ``describe`` or cannot be had.
    """
    backend = _created(registry, plan.backend.name)
    method = getattr(backend, "describe", None)
    return str(_asked(registry, plan.backend.name, lambda: method(plan)) or "") if method is not None else ""


def find_format(registry: BackendRegistry, name: str) -> PlanFormat | None:
    """
    Return the plan view ``name`` that a backend offers (its ``formats``), or None.

    The built-in backends are asked first, so that a plugin adds views but never replaces one
    of theirs (``sbatch`` stays the slurm backend's); then the others, the first by name wins.
    """
    built_in = [n for n in registry.names() if registry._sources[n].origin == BUILT_IN]  # noqa: SLF001 - this module's
    for backend_name in [*built_in, *(n for n in registry.names() if n not in built_in)]:
        method = getattr(_created(registry, backend_name), "formats", None)
        views = _asked(registry, backend_name, method) if method is not None else None
        view = views.get(name) if isinstance(views, Mapping) else None
        if view is not None:
            return view  # type: ignore[no-any-return] # a plugin's mapping holds what it holds
    return None


def topology_prober(registry: BackendRegistry, name: str | None = None) -> TopologyProbe | None:
    """
    Return ``probe(hosts, *, environ)`` by backend ``name``'s ``probe_topologies``, or None without that backend.

    ``name`` defaults to the built-in that reaches hosts with ssh (its traits say so: the
    planner's table), which reads another host's topology over its connection.

    The backend is the registry's (:meth:`BackendRegistry.get`), made when the probe is first
    called (placement needs another host's topology), so that asking costs a launch nothing; what
    its probe opens (the ssh backend's connections), the launch with the same registry uses. A
    backend without ``probe_topologies`` answers every host with a reason.
    """
    if name is None:
        from poprun.planner.trait import reaching

        name = reaching("ssh")
    try:
        registry.factory(name)
    except UnknownBackendError:
        return None

    def probe(hosts: tuple[str, ...], *, environ: Mapping[str, str]) -> Mapping[str, HostTopology | str]:
        method = getattr(registry.get(name), "probe_topologies", None)
        if method is None:
            return dict.fromkeys(hosts, f"the {name} backend cannot read host topologies")
        found: Mapping[str, HostTopology | str] = method(hosts, environ=environ)
        return found

    return probe
