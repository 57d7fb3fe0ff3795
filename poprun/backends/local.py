"""
The ``local`` backend: every instance of the plan is a child process of poprun.

Layer: ``poprun.backends``; imports ``poprun.planner.plan``, ``popdist.env`` (one variable name)
and the backend modules; never the spec. Linux and other POSIX systems with ``/bin/sh``.

Each instance runs with exactly its argv and cwd, and the launching environment minus
``env.unset`` plus ``env.set`` (forwarded names are inherited). Instances are started with
``vfork`` (no ``preexec_fn``, which would force a slower ``fork``), in the process group of the
launch's :class:`~poprun.backends.watchdog.Watchdog`, so that no process of the launch survives
poprun, even when poprun is SIGKILLed. :class:`~poprun.backends.supervisor.LocalLaunch` forwards
their output and stops the others at the first failure.

The plan's temporary executable cache (``cache.mode`` ``temporary`` with ``remove_at_exit``:
the directory named by ``POPDIST_EXECUTABLE_CACHE_PATH``, made by the caller in this process
with :func:`~poprun.backends.files.private_directory`) is removed when the launch ends, and by
the watchdog if poprun dies. A directory is a temporary cache because this process made it
(:func:`~poprun.backends.files.made_here`), never because of its name or the plan's say-so.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from popdist.env import EXECUTABLE_CACHE_PATH
from poprun.backends.base import CANNOT_LAUNCH, NOT_EXECUTABLE, NOT_FOUND, LaunchError, OutputSink, environment
from poprun.backends.files import made_here, which
from poprun.backends.output import TAIL_LINES, Router
from poprun.backends.supervisor import LocalLaunch
from poprun.backends.watchdog import Watchdog, WatchdogError, starting_in
from poprun.planner.machine import cpulist, parse_cpulist
from poprun.planner.plan import Instance, LaunchPlan

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from typing import ClassVar

DEFAULT_GRACE_S = 5.0
CACHE_PREFIX = "poprun-cache-"  # the name of a temporary cache begins so (a name only: removal goes by record)

__all__ = ["CACHE_PREFIX", "DEFAULT_GRACE_S", "TAIL_LINES", "LocalBackend", "LocalLaunch", "abandon", "environment",
           "executable", "forwarded_stdin", "is_this_machine", "start_instance", "temporary_directories"]


def executable(instance: Instance, env: Mapping[str, str]) -> str:
    """
    Return the file that runs ``instance.argv[0]``, relative to the instance's cwd or absolute.

    A bare name is looked up on the PATH of ``env``, then run as ``./name`` from the instance's
    working directory (PopRun 2.1 runs programs there without a ``./`` prefix); a name with
    ``/`` is taken as it is, from the cwd.

    Raises:
        LaunchError: status 127 when the program is not found, 126 when it is not executable,
            125 when there is no program or no working directory.
    """
    if not instance.argv or not Path(instance.cwd).is_dir():
        what = "no program to run" if not instance.argv else f"no working directory ({instance.cwd} is missing)"
        raise LaunchError(f"instance {instance.index} has {what}")
    name = instance.argv[0]
    found = which(name, env.get("PATH", os.defpath)) if "/" not in name else None
    candidate = Path(found or Path(instance.cwd) / name).absolute()
    if not candidate.exists():
        where = "on PATH or in " + instance.cwd if "/" not in name else str(candidate)
        raise LaunchError(f"program '{name}' not found ({where})", status=NOT_FOUND)
    if candidate.is_dir() or not os.access(candidate, os.X_OK):
        raise LaunchError(f"program '{name}' is not executable ({candidate})", status=NOT_EXECUTABLE)
    return str(candidate) if found else name if "/" in name else "./" + name


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
    fork). ``cpus`` None: unbound; the memory policy: :func:`poprun.backends.numa.prefer`.
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
            from poprun.backends.numa import prefer

            preferring = prefer(nodes) and bool(nodes)

    try:
        yield bind
    finally:
        if original is not None and current != original:
            os.sched_setaffinity(0, original)
        if preferring:
            from poprun.backends.numa import prefer

            prefer(None)


def is_this_machine(host: str) -> bool:
    """Return whether ``host`` names this machine: localhost, a loopback address, or this host name."""
    name = os.uname().nodename
    return host in {"localhost", "127.0.0.1", "::1", name, name.split(".")[0]}


def temporary_directories(plan: LaunchPlan) -> tuple[str, ...]:
    """
    Return the plan's temporary executable cache directories (to remove at the end), sorted.

    Only directories this process made (:func:`~poprun.backends.files.made_here`) qualify: a
    saved plan that names a directory of the user's, whatever its name, never gets it removed.
    """
    if plan.cache.mode != "temporary" or not plan.cache.remove_at_exit:
        return ()
    paths = {i.env.get(EXECUTABLE_CACHE_PATH) for i in plan.instances}
    return tuple(sorted(p for p in paths if p and made_here(p)))


def forwarded_stdin() -> int | None:
    """
    Return the descriptor of poprun's stdin when instance 0 is to read it, else None.

    mpirun's convention: instance 0 reads poprun's standard input when it is a pipe or a file;
    a terminal is never read (it stays the shell's), and a closed one is nothing to read. The
    other instances read ``/dev/null``. A backend that runs instance 0 elsewhere (ssh) copies
    from this descriptor to it.
    """
    try:
        if os.isatty(0):
            return None
        os.fstat(0)
    except OSError:  # closed
        return None
    return 0


def start_instance(instance: Instance, env: dict[str, str], program: str, group: int) -> subprocess.Popen[bytes]:
    """
    Start ``instance`` as a child process in process group ``group``, output piped.

    Its stdin is poprun's for instance 0 when :func:`forwarded_stdin` says so (the same open
    file: the end of it reaches the instance as it is), ``/dev/null`` otherwise.

    Raises:
        LaunchError: 127, 126 or 125 when the program cannot be started.
    """
    stdin = forwarded_stdin() if instance.index == 0 else None
    starting_in(group)  # the launch's cgroup, where there is one
    try:
        return subprocess.Popen(  # noqa: S603 - running the plan's program is the point
            instance.argv, executable=program, cwd=instance.cwd, env=env,
            stdin=subprocess.DEVNULL if stdin is None else stdin,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, process_group=group)
    except OSError as exc:  # EMFILE, EAGAIN: poprun cannot launch (each instance holds 3 descriptors here)
        status = {errno.ENOENT: NOT_FOUND, errno.EACCES: NOT_EXECUTABLE, errno.ENOEXEC: NOT_EXECUTABLE}
        raise LaunchError(f"cannot run '{instance.argv[0]}': {exc.strerror}",
                          status=status.get(exc.errno or 0, CANNOT_LAUNCH)) from exc


def abandon(watchdog: Watchdog, procs: list[subprocess.Popen[bytes]], router: Router) -> None:
    """Undo a launch that failed to start: kill what started, close everything."""
    watchdog.close()
    for proc in procs:
        proc.wait()
        for pipe in (proc.stdin, proc.stdout, proc.stderr):  # stdin: the ssh backend's sessions have one
            if pipe is not None:
                with contextlib.suppress(OSError):  # a session that is gone: its input pipe is broken
                    pipe.close()
    router.close()


class LocalBackend:
    """Runs every instance as a child process; every instance must be planned for this machine."""

    name: ClassVar[str] = "local"
    skip_foreign_bindings: ClassVar[bool] = False  # the offline backend runs plans made for other hosts

    def __init__(self, *, grace_s: float = DEFAULT_GRACE_S) -> None:
        self.grace_s = grace_s

    def check_hosts(self, plan: LaunchPlan) -> None:
        """Raise :class:`LaunchError` (125) naming the first host of the plan that is not this machine."""
        remote = next((i.host for i in plan.instances if not is_this_machine(i.host)), None)
        if remote is not None:
            raise LaunchError(f"host '{remote}' is not this machine: the local backend runs instances here only "
                              "(the offline backend runs every instance here whatever its host)")

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
                raise LaunchError(f"instance {instance.index} is planned for CPUs {instance.placement.cpus}, but this "
                                  f"process may use only {cpulist(allowed)}: plan again here, or use "
                                  "--process-placement disabled")
            masks.append(cpus)
        return masks

    def launch(self, plan: LaunchPlan, *, env_source: Mapping[str, str], sink: OutputSink) -> LocalLaunch:
        """Start every instance of ``plan``; raise :class:`LaunchError` when nothing can start."""
        self.check_hosts(plan)
        masks = self.cpu_masks(plan)
        source = dict(env_source)  # os.environ decodes every item each time it is read
        envs = [environment(i, source) for i in plan.instances]
        programs = _programs(plan, envs)
        router = Router(plan, sink)
        remove = temporary_directories(plan)
        try:
            watchdog = Watchdog(remove=remove, env=source)
        except WatchdogError as exc:
            router.close()
            raise LaunchError(str(exc.strerror)) from exc
        procs: list[subprocess.Popen[bytes]] = []
        try:
            with _binding() as bind:
                for instance, env, program, mask in zip(plan.instances, envs, programs, masks, strict=True):
                    bind(mask, parse_cpulist(instance.placement.numa_nodes) if mask is not None else ())
                    procs.append(start_instance(instance, env, program, watchdog.group))
            watchdog.await_ready()
        except WatchdogError as exc:
            abandon(watchdog, procs, router)
            raise LaunchError(str(exc.strerror)) from exc
        except BaseException:  # a LaunchError, or an interrupt while starting: nothing of the launch is left
            abandon(watchdog, procs, router)
            raise
        return LocalLaunch(plan, procs, watchdog=watchdog, router=router, sink=sink, grace_s=self.grace_s,
                           remove=remove)
