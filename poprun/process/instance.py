"""
Starting one instance as a child process: its program, its stdin, its CPU binding, the cache to remove.

Layer: ``poprun.process``; imports :mod:`poprun.core.launching` (and the rest of ``poprun.core``: its
:mod:`~poprun.core.purepath`), the other ``poprun.process`` modules
and ``poprun.planner.plan``. The local, offline and ssh backends start instances of this
machine with :func:`start_instance`; the ssh and mpirun backends run a bound instance on
another host through :func:`bound_argv`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import stat
import subprocess
import threading
from collections.abc import Callable, Mapping

from poprun.core.diagnostic import LaunchError, launch_error
from poprun.core.exitstatus import CANNOT_LAUNCH, NOT_EXECUTABLE, NOT_FOUND
from poprun.core.launching import TemporaryCache
from poprun.core.purepath import absolute, exists, is_dir, pure
from poprun.core.span import SourceSpan
from poprun.core.threads import STOPS
from poprun.planner.plan import Instance
from poprun.process.files import made_here, which
from poprun.process.output import Router
from poprun.process.watchdog import Watchdog, started_in, starting_in

DEFAULT_GRACE_S = 5.0

__all__ = ["BIND_SCRIPT", "DEFAULT_GRACE_S", "abandon", "bound_argv", "directories_to_remove", "executable",
           "forwarded_stdin", "helper_failed", "start_instance"]

_NOT_FOUND_HINT = ("check the program's name; a bare name is looked for on PATH, then in the working directory: "
                   "install the program, put its directory on PATH, or give its path")
_NOT_EXECUTABLE_HINT = "make it executable (chmod +x), or run it through its interpreter (python3 FILE, sh FILE)"
_REFUSED_HINT = ("the system refused to start it: keep each argument under 128 KiB and all of them with the "
                 "environment under the system's limit (getconf ARG_MAX), and leave room for more processes (ulimit -u)")
_EXEC_FAILURES = {  # poprun's status when the program's exec fails -> code, summary, hint
    NOT_FOUND: ("PR426", "program not found", _NOT_FOUND_HINT),
    NOT_EXECUTABLE: ("PR427", "program not executable", _NOT_EXECUTABLE_HINT),
    CANNOT_LAUNCH: ("PR428", "program could not be started", _REFUSED_HINT),
}


def helper_failed(exc: OSError, what: str, message: str | None = None) -> LaunchError:
    """
    Return PR434: ``what``, a process poprun runs itself (its watchdog, mpirun, srun, ssh, /bin/sh), could not start.

    ``message`` is the line told (default: the error's own words).
    """
    return launch_error("PR434", "a process poprun needs could not start",
                        detail=message if message is not None else str(exc.strerror),
                        span=SourceSpan.environment(what),
                        hint=f"poprun starts {what} itself: check that it is installed and runs here, and that this "
                             "machine allows more processes and open files (ulimit -u, ulimit -n)")


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
    if not instance.argv or not is_dir(instance.cwd):
        what = "no program to run" if not instance.argv else f"no working directory ({instance.cwd} is missing)"
        raise launch_error("PR433", "instance cannot start as planned", detail=f"instance {instance.index} has {what}",
                           span=SourceSpan.environment(instance.cwd if instance.argv else f"instance {instance.index}"),
                           hint="make the plan again where it is to run (the working directory must exist on every "
                                "host), or create the directory")
    name = instance.argv[0]
    found = which(name, env.get("PATH", os.defpath)) if "/" not in name else None
    candidate = absolute(found or pure(instance.cwd, name))
    if not exists(candidate):
        where = "on PATH or in " + instance.cwd if "/" not in name else candidate
        raise launch_error("PR426", "program not found", detail=f"program '{name}' not found ({where})",
                           span=SourceSpan.environment("PATH" if "/" not in name else candidate),
                           hint=_NOT_FOUND_HINT, status=NOT_FOUND)
    if is_dir(candidate) or not os.access(candidate, os.X_OK):
        raise launch_error("PR427", "program not executable", detail=f"program '{name}' is not executable ({candidate})",
                           span=SourceSpan.environment(candidate), hint=_NOT_EXECUTABLE_HINT,
                           status=NOT_EXECUTABLE)
    return candidate if found else name if "/" in name else "./" + name


def directories_to_remove(cache: TemporaryCache | None) -> tuple[str, ...]:
    """
    Return the temporary cache directory to remove at the end: ``cache``'s when it is to be removed, else none.

    Only a directory this process made (:func:`~poprun.process.files.made_here`)
    qualifies: a cache that names a directory of the user's, whatever its name, is never removed.
    """
    if cache is None or not cache.remove_at_exit or not made_here(cache.path):
        return ()
    return (cache.path,)


def forwarded_stdin() -> int | None:
    """
    Return the descriptor of poprun's stdin when instance 0 is to read it, else None.

    mpirun's convention: instance 0 reads poprun's standard input when it is a pipe or a file;
    a terminal is never read (it stays the shell's), and a closed one or ``/dev/null`` is nothing
    to read (instance 0 reads ``/dev/null`` then, as the others do). The
    other instances read ``/dev/null``. A backend that runs instance 0 elsewhere (ssh) copies
    from this descriptor to it.
    """
    try:
        if os.isatty(0):
            return None
        found = os.fstat(0)
        if stat.S_ISCHR(found.st_mode) and found.st_rdev == os.stat(os.devnull).st_rdev:  # pathlib costs start-up
            return None  # /dev/null: nothing to read, and nothing to copy to another host
    except OSError:  # closed
        return None
    return 0


def start_instance(instance: Instance, env: dict[str, str], program: str, group: int, *,
                   restart: bool = False) -> subprocess.Popen[bytes]:
    """
    Start ``instance`` as a child process in process group ``group``, output piped.

    Its stdin is poprun's for instance 0 when :func:`forwarded_stdin` says so (the same open
    file: the end of it reaches the instance as it is), ``/dev/null`` otherwise. An instance
    started again (``restart``, ``--restart-scope instance``) reads ``/dev/null``: what its
    first run left of poprun's input is no defined place to go on from. It begins in the
    launch's cgroup too, and poprun leaves it again at once.

    Raises:
        LaunchError: 127, 126 or 125 when the program cannot be started.
    """
    stdin = forwarded_stdin() if instance.index == 0 and not restart else None
    starting_in(group)  # the launch's cgroup, where there is one
    try:
        return subprocess.Popen(  # noqa: S603 - running the plan's program is the point
            instance.argv, executable=program, cwd=instance.cwd, env=env,
            stdin=subprocess.DEVNULL if stdin is None else stdin,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, process_group=group)
    except OSError as exc:  # EMFILE, EAGAIN: poprun cannot launch (each instance holds 3 descriptors here)
        status = {errno.ENOENT: NOT_FOUND, errno.EACCES: NOT_EXECUTABLE, errno.ENOEXEC: NOT_EXECUTABLE}
        code, summary, hint = _EXEC_FAILURES[status.get(exc.errno or 0, CANNOT_LAUNCH)]
        raise launch_error(code, summary, detail=f"cannot run '{instance.argv[0]}': {exc.strerror}",
                           span=SourceSpan.environment(instance.argv[0]), hint=hint,
                           status=status.get(exc.errno or 0, CANNOT_LAUNCH)) from exc
    finally:
        if restart:  # the launch runs: nothing else moves poprun out of its cgroup
            started_in(group)


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


# Runs "$@" on CPUs $1 preferring the memory of NUMA nodes $2: numactl where it is installed
# and the kernel has MPOL_PREFERRED_MANY (5.15), else taskset (CPUs only; memory then follows
# the kernel's default, local allocation).
BIND_SCRIPT = ('c=$1 n=$2; shift 2; if command -v numactl >/dev/null 2>&1 && '
               'numactl --preferred-many="$n" true 2>/dev/null; then '
               'exec numactl --physcpubind="$c" --preferred-many="$n" -- "$@"; fi; exec taskset -c "$c" "$@"')


def bound_argv(instance: Instance) -> list[str]:
    """
    Return the instance's argv, run through :data:`BIND_SCRIPT` when the plan binds it.

    The role of real poprun's ``poprun_numa_wrapper``: the instance runs on its planned CPUs
    and prefers its NUMA nodes' memory (seed section 2.5), on whichever host it lands (the ssh
    and mpirun backends; this machine's instances are bound as they start instead).
    """
    if not instance.placement.cpus:
        return list(instance.argv)
    return ["sh", "-c", BIND_SCRIPT, "poprun-bind", instance.placement.cpus, instance.placement.numa_nodes or "0",
            *instance.argv]




def start_supervising(thread: threading.Thread, announce: Callable[[], None], abort: Callable[[], None]) -> None:
    """
    Call ``announce`` (the instances' start events), then start ``thread``, the launch's supervisor, uninterrupted.

    A caller's signal handler may raise to stop a launch while it starts (``poprun.apply.Stopped``).
    Between the instances' start and a supervisor that can stop them, such an exception would
    leave them to the watchdog's clean-up after poprun's exit; so the stop signals are held
    meanwhile (in this thread, which the supervisor inherits: the kernel then delivers them
    to the main thread), and a stop that came is raised once the supervisor runs: then
    ``abort`` stops everything and waits for the supervisor's clean-up, and the exception goes on.
    """
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
    try:
        announce()
        thread.start()
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        raise
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)  # a stop that came meanwhile is handled here
    except BaseException:
        abort()
        raise


FILES_PER_INSTANCE = 4  # its three pipes here, and a process's or a session's own
_OPEN_FILES_HINT = ("each instance holds about 4 open files in poprun: raise the hard limit on open files (ulimit -Hn, "
                    "or nofile in /etc/security/limits.conf), or launch fewer instances")


def ensure_open_files(instances: int, *, spare: int = 64) -> None:
    """
    Raise this process's soft limit on open files to what ``instances`` need (their pipes), when it is lower.

    A launch of thousands of instances needs more than the usual soft limit (1024); the hard
    limit is the ceiling (what this machine's administrator allows). The instances started here
    inherit the raised limit.

    Raises:
        LaunchError: when even the hard limit is too low (the message says how many are needed).
    """
    import resource

    need = instances * FILES_PER_INSTANCE + spare
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return
    if hard != resource.RLIM_INFINITY and hard < need:
        raise launch_error("PR429", "not enough open files for the instances",
                           detail=f"{instances} instances need about {need} open files, and this process may open "
                                  f"{hard} at most: raise the hard limit (ulimit -Hn, or limits.conf), or launch fewer "
                                  "instances",
                           span=SourceSpan.environment("open files (ulimit -n)"), hint=_OPEN_FILES_HINT)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))
    except (OSError, ValueError) as exc:
        raise launch_error("PR429", "not enough open files for the instances",
                           detail=f"cannot raise the limit on open files to {need}: {exc}",
                           span=SourceSpan.environment("open files (ulimit -n)"), hint=_OPEN_FILES_HINT) from exc
