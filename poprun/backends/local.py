"""
The ``local`` backend: every instance of the plan is a child process of poprun.

Layer: ``poprun.backends``; imports :mod:`poprun.backends.base`, the process machinery of
:mod:`poprun.process`, ``poprun.core`` and ``poprun.planner`` (the plan, CPU lists);
never the spec, never another backend. Linux and other POSIX systems with ``/bin/sh``.

Each instance runs with exactly its argv and cwd, and the launching environment minus
``env.unset`` plus ``env.set`` (forwarded names are inherited). Instances are started with
``vfork`` (no ``preexec_fn``, which would force a slower ``fork``), in the process group of the
launch's :class:`~poprun.process.watchdog.Watchdog`, so that no process of the launch survives
poprun, even when poprun is SIGKILLed. :class:`~poprun.process.supervisor.LocalLaunch` forwards
their output and stops the others at the first failure.

The temporary executable cache the caller passes (a :class:`~poprun.backends.base.TemporaryCache`
with ``remove_at_exit``, made in this process) is removed when the launch ends, and by the
watchdog if poprun dies; only if this process made it
(:func:`~poprun.process.files.made_here`), never because of its name.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping

from poprun.backends.base import (
    CHECKS_BEFORE_START,
    PROCESSES,
    RESTARTS_INSTANCES,
    Gate,
    OutputSink,
    Restarter,
    TemporaryCache,
    environment,
)
from poprun.core.diagnostic import launch_error
from poprun.core.events import PhaseEnded
from poprun.core.localhost import is_this_machine
from poprun.core.span import SourceSpan
from poprun.planner.machine import cpulist, parse_cpulist
from poprun.planner.plan import LaunchPlan
from poprun.process.cgroup import Cgroup, stop_priming
from poprun.process.instance import (
    DEFAULT_GRACE_S,
    abandon,
    directories_to_remove,
    ensure_open_files,
    executable,
    helper_failed,
    start_instance,
)
from poprun.process.output import Router
from poprun.process.supervisor import LocalLaunch, Respawn
from poprun.process.watchdog import Watchdog, WatchdogError

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from typing import ClassVar

__all__ = ["LocalBackend", "LocalLaunch", "cgroup_ahead"]

_STARTS_HERE = ("local", "offline")  # this module's backends: the launch starts every instance in this process


def cgroup_ahead(plan: LaunchPlan) -> None:
    """
    Make the launch's cgroup and begin moving poprun into it now, when ``plan``'s backend is local or offline.

    For a caller that has work to do before the launch (the run record, the apply step's preparation): the
    kernel's wait in the move (:mod:`poprun.process.cgroup`) then overlaps that work
    instead of delaying the instances' start. The launch's watchdog takes the cgroup; once the
    launch is over, :func:`~poprun.process.cgroup.release_ahead` leaves and removes
    one that no launch took (nothing started).
    """
    if plan.backend.name in _STARTS_HERE:
        Cgroup.ahead()
    else:
        stop_priming()  # no launch cgroup made ahead: no move to ready the kernel for

_NOT_HERE_HINT = ("the local backend runs every instance on this machine: use --backend offline to run them here "
                  "whatever their hosts, or --backend ssh to reach the host")


def _programs(plan: LaunchPlan, envs: list[dict[str, str]]) -> list[str]:
    """Return :func:`executable` of every instance, looking each (program, PATH, cwd) up once."""
    known: dict[tuple[str, str, str], str] = {}
    programs = []
    for instance, env in zip(plan.instances, envs, strict=True):
        key = (instance.argv[0] if instance.argv else "", env.get("PATH", ""), instance.cwd)
        if key not in known:
            known[key] = executable(instance, env)
        programs.append(known[key])
    return programs


def _allowed_cpus() -> set[int] | None:
    """Return the CPUs this process may run on, or None where that cannot be known."""
    return set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None


@contextlib.contextmanager
def _binding() -> Iterator[Callable[[set[int] | None, tuple[int, ...]], None]]:
    """
    Yield ``bind(cpus, nodes)``: the next child starts on ``cpus``, preferring ``nodes``' memory; restore after.

    A child inherits the CPU affinity and the memory policy of the thread that starts it, so
    setting this thread's before each start binds the instance from its first instruction,
    without a wrapper program or a ``preexec_fn`` (which would make every start a slower
    fork). ``cpus`` None: unbound; the memory policy: :func:`poprun.process.numa.prefer`.
    """
    original = _allowed_cpus()
    current, preferring = original, False

    def bind(cpus: set[int] | None, nodes: tuple[int, ...]) -> None:
        nonlocal current, preferring
        wanted = cpus if cpus is not None else original
        if wanted is not None and wanted != current:
            os.sched_setaffinity(0, wanted)
            current = wanted
        if nodes or preferring:
            from poprun.process.numa import prefer

            preferring = prefer(nodes) and bool(nodes)

    try:
        yield bind
    finally:
        if original is not None and current != original:
            os.sched_setaffinity(0, original)
        if preferring:
            from poprun.process.numa import prefer

            prefer(None)


def _respawner(plan: LaunchPlan, envs: list[dict[str, str]], programs: list[str], masks: list[set[int] | None],
               group: int) -> Respawn:
    """Return the :data:`~poprun.process.supervisor.Respawn` of a launch: its instances as they first started."""

    def respawn(index: int, variables: Mapping[str, str]) -> subprocess.Popen[bytes]:
        instance, mask = plan.instances[index], masks[index]
        with _binding() as bind:  # this thread's CPUs and memory policy, restored after
            bind(mask, parse_cpulist(instance.placement.numa_nodes) if mask is not None else ())
            return start_instance(instance, envs[index] | dict(variables), programs[index], group, restart=True)

    return respawn


class LocalBackend:
    """Runs every instance as a child process; every instance must be planned for this machine."""

    name: ClassVar[str] = "local"
    capabilities: ClassVar[frozenset[str]] = frozenset({PROCESSES, CHECKS_BEFORE_START, RESTARTS_INSTANCES})
    skip_foreign_bindings: ClassVar[bool] = False  # the offline backend runs plans made for other hosts

    def __init__(self, *, grace_s: float = DEFAULT_GRACE_S) -> None:
        self.grace_s = grace_s

    def check_hosts(self, plan: LaunchPlan) -> None:
        """Raise :class:`LaunchError` (125) naming the first host of the plan that is not this machine."""
        remote = next((i.host for i in plan.instances if not is_this_machine(i.host)), None)
        if remote is not None:
            raise launch_error("PR431", "host is not this machine",
                               detail=f"host '{remote}' is not this machine: the local backend runs instances here only "
                                      "(the offline backend runs every instance here whatever its host)",
                               span=SourceSpan.environment(f"host {remote}"), hint=_NOT_HERE_HINT)

    def cpu_masks(self, plan: LaunchPlan) -> list[set[int] | None]:
        """
        Return the CPUs each instance is bound to (None: not bound), as the plan's placement says.

        An instance planned for CPUs this process may not use (a plan made for another machine,
        or a narrower cpuset now) is an error, or left unbound with ``skip_foreign_bindings``.

        Raises:
            LaunchError: for such an instance, unless ``skip_foreign_bindings``.
        """
        allowed = _allowed_cpus()
        masks: list[set[int] | None] = []
        for instance in plan.instances:
            cpus = set(parse_cpulist(instance.placement.cpus)) if instance.placement.cpus else None
            if cpus is not None and allowed is not None and not cpus <= allowed:
                if self.skip_foreign_bindings:
                    masks.append(None)
                    continue
                raise launch_error("PR432", "planned CPUs not available here",
                                   detail=f"instance {instance.index} is planned for CPUs {instance.placement.cpus}, "
                                          f"but this process may use only {cpulist(allowed)}: plan again here, or use "
                                          "--process-placement disabled",
                                   span=SourceSpan.environment("CPUs this process may use"),
                                   hint="make the plan again on this machine (its placement then binds CPUs that are "
                                        "here), or launch it with --process-placement disabled")
            masks.append(cpus)
        return masks

    def run_on_host(self, host: str, script: str, *, environ: Mapping[str, str],
                    timeout_s: float) -> tuple[int, bytes]:
        """
        Run ``script`` with ``/bin/sh -s`` here (:class:`~poprun.backends.base.HostCommands`); ``host`` must be this machine.

        Raises:
            LaunchError: for another host, or when /bin/sh cannot start.
        """
        from poprun.process.hostscript import run_here

        if not is_this_machine(host):
            raise launch_error("PR431", "host is not this machine",
                               detail=f"host '{host}' is not this machine: the local backend runs commands here only",
                               span=SourceSpan.environment(f"host {host}"), hint=_NOT_HERE_HINT)
        return run_here(script, environ=environ, timeout_s=timeout_s)

    def launch(self, plan: LaunchPlan, *, env_source: Mapping[str, str], sink: OutputSink,
               cache: TemporaryCache | None = None, restarter: Restarter | None = None,
               gate: Gate | None = None) -> LocalLaunch:
        """
        Start every instance of ``plan``; raise :class:`LaunchError` when nothing can start.

        ``gate`` is awaited after a failure is told, before the others are stopped
        (:data:`~poprun.backends.base.Gate`).

        With ``restarter``, a failed instance starts again alone when it says so, with the
        same program, working directory, environment (plus the restarter's variables) and CPU
        binding, reading ``/dev/null`` (:class:`~poprun.process.supervisor.LocalLaunch`).
        """
        self.check_hosts(plan)
        ensure_open_files(len(plan.instances))
        masks = self.cpu_masks(plan)
        source = dict(env_source)  # os.environ decodes every item each time it is read
        envs = [environment(i, source) for i in plan.instances]
        programs = _programs(plan, envs)
        router = Router(plan, sink)
        remove = directories_to_remove(cache)
        try:
            watchdog = Watchdog(remove=remove, env=source)
        except WatchdogError as exc:
            router.close()
            raise helper_failed(exc, "the watchdog") from exc
        procs: list[subprocess.Popen[bytes]] = []
        try:
            router.started()
            with _binding() as bind:
                for instance, env, program, mask in zip(plan.instances, envs, programs, masks, strict=True):
                    bind(mask, parse_cpulist(instance.placement.numa_nodes) if mask is not None else ())
                    procs.append(start_instance(instance, env, program, watchdog.group))
            watchdog.await_ready()
            if (tell := getattr(sink, "event", None)) is not None:
                tell(PhaseEnded(phase="start", ms=round((time.monotonic() - router.began) * 1000)))
        except WatchdogError as exc:
            abandon(watchdog, procs, router)
            raise helper_failed(exc, "the watchdog") from exc
        except BaseException:  # a LaunchError, or an interrupt while starting: nothing of the launch is left
            abandon(watchdog, procs, router)
            raise
        return LocalLaunch(plan, procs, watchdog=watchdog, router=router, sink=sink, grace_s=self.grace_s,
                           remove=remove, restarter=restarter, gate=gate,
                           respawn=None if restarter is None else _respawner(plan, envs, programs, masks, watchdog.group))
