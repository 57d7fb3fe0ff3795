"""
No orphan, ever: the watchdog of a local launch, and poprun as the reaper of its descendants.

Layer: ``poprun.process``; standard library and :mod:`poprun.process.cgroup` only (no plan, no
spec). Linux.

Every process of a launch lives in one process group, led by a tiny watchdog that poprun starts
first (``/bin/sh``, about a millisecond). The watchdog ignores the signals poprun sends the group
to stop it gracefully (SIGTERM) and those of the terminal (job control included: Ctrl-Z stops
the instances, never the watchdog), and blocks reading a pipe whose write
end only poprun holds (it is close-on-exec, and every child is started with ``close_fds``). The
instances join its group before they exec, so there is no moment at which an instance runs
outside it. Then:

- poprun stops the launch by signalling the group (``killpg``): the instances and everything
  they started that stayed in the group (``sh -c 'sleep 60 & sleep 60'``) get the signal;
- poprun ends a launch by SIGKILLing the group (the watchdog goes too) and reaping the watchdog;
  the group id stays valid until then, so it is never signalled after it could be reused;
- when poprun dies, even by SIGKILL, the kernel closes the write end: the watchdog reads EOF and
  execs ``python3 -I -S`` (:data:`_CLEANUP`), which forks a child that leaves the group, kills
  the group with SIGKILL and removes the launch's temporary directories (the executable
  cache). Within about 50 ms of poprun's death nothing of the launch is left.

A descendant that leaves the group (``setsid``, a daemon) is out of reach of ``killpg``. poprun's
command line makes itself a child subreaper (:func:`become_subreaper`), so such a process is
re-parented to poprun when its parent dies, and the end of each launch kills and reaps every
process re-parented to poprun since the launch began (:func:`kill_adopted`). Where cgroup v2
is writable, each watchdog also makes a cgroup for its launch (:mod:`poprun.process.cgroup`;
the watchdog itself begins outside it, or inside when the cgroup was made ahead): :func:`starting_in`
has what poprun starts in the group begin in that cgroup too, and ``cgroup.kill`` ends it with
the group, at the end of the launch and from the clean-up when poprun dies (whose forked child
moves itself out of the cgroup first); so even such a descendant outlives no one.

Known limits: without a writable cgroup v2, a process that leaves the group and outlives
poprun's own SIGKILL is out of reach; so are the instances if the watchdog itself
is SIGKILLed first (by the OOM killer, say) and then poprun; and the temporary directories stay
if poprun is SIGKILLed in the moment between killing the group at the end and removing them
(they are removed once before and once after). ``PR_SET_PDEATHSIG`` is not used: it needs a
``preexec_fn``, which makes every start a ``fork`` (1.5 ms) instead of a ``vfork`` (0.4 ms),
and it reaches only direct children.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence

from poprun.core.process import start_time
from poprun.process.cgroup import Cgroup

# Every signal the watchdog ignores: all that would end or stop it, but KILL and STOP (which
# cannot be caught), as numbers (dash knows no name for some, such as STKFLT and the real-time
# ones). Those sent to stop the group (TERM, INT, HUP, TSTP), and also any that --signal forwards
# to it (USR1, ALRM ...), must not take the watchdog with the instances.
_IGNORED = " ".join(str(int(s)) for s in sorted(signal.valid_signals()) if s not in {
    signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD, signal.SIGCONT, signal.SIGWINCH, signal.SIGURG})
# The watchdog. It ignores those signals, tells poprun it does (the byte on stdout, which poprun
# awaits before it sends any), then waits for EOF on stdin (poprun's death) and hands over to the
# clean-up. $1 is Python, $2 the clean-up code, $3 the launch's cgroup ("" for none), the rest paths.
_SCRIPT = (f'trap "" {_IGNORED}; printf x; exec >/dev/null; read -r _; '
           'p=$1; c=$2; shift 2; exec "$p" -I -S -c "$c" "$@"')
# The clean-up, run only when poprun died. A forked child leaves the group, so that it survives
# killing it (the watchdog, now this Python, goes with the instances), kills the group, leaves
# the cgroup (the watchdog began in it when the cgroup was made ahead: see cgroup.py) and kills
# it, removes the cgroup once empty, kills every process whose
# command line names the ssh backend's socket directory among the paths (its shared connections,
# which ssh moves out of every group), then removes the paths.
_CLEANUP = """\
import os, shutil, signal, sys, time
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP, signal.SIGINT, signal.SIGQUIT, signal.SIGTERM})
group = os.getpgid(0)
if os.fork() == 0:
    os.setpgid(0, 0)
    os.killpg(group, signal.SIGKILL)
    cgroup = sys.argv[1]
    if cgroup:
        try:
            with open(os.path.dirname(cgroup) + "/cgroup.procs", "w") as file:
                file.write(str(os.getpid()))
        except OSError:
            pass
        try:
            with open(cgroup + "/cgroup.kill", "w") as file:
                file.write("1")
            for _ in range(1000):
                with open(cgroup + "/cgroup.events") as file:
                    if "populated 0" in file.read():
                        break
                time.sleep(0.001)
            for folder, _, _ in os.walk(cgroup, topdown=False):
                os.rmdir(folder)
        except OSError:
            pass
    needles = [os.fsencode(path) + b"/" for path in sys.argv[2:] if os.path.basename(path).startswith("poprun-ssh-")]
    for entry in os.listdir("/proc") if needles and os.path.isdir("/proc") else ():
        try:
            with open("/proc/" + entry + "/cmdline", "rb") as file:
                line = file.read()
            if entry.isdigit() and int(entry) != os.getpid() and any(n in line for n in needles):
                os.kill(int(entry), signal.SIGKILL)
        except (OSError, ValueError):
            pass
    for path in sys.argv[2:]:
        shutil.rmtree(path, ignore_errors=True)
    os._exit(0)
os.wait()
"""
_READY_S = 5.0  # the longest launch() waits for the watchdog to be ready
_PR_SET_CHILD_SUBREAPER = 36
_subreaper = False  # whether become_subreaper() succeeded in this process
# Children poprun starts for itself beside a launch (a notification's command and its watchdog): never taken for
# processes a launch left behind (kill_adopted), which a launch's end kills. The lock spans starting one and
# recording its pid, and each round of choosing and killing, so that none is seen in between.
_OWN: set[int] = set()
_OWN_LOCK = threading.Lock()
_cgroups: dict[int, Cgroup] = {}  # the process group of each open watchdog that has a cgroup -> that cgroup


class WatchdogError(OSError):
    """The watchdog could not be started, or did not become ready."""


class Watchdog:
    """
    The leader of a launch's process group; see the module docstring.

    ``remove`` names the directories to remove if poprun dies (the temporary executable cache).
    ``group`` is the process group every instance must join (``process_group=``); ``cgroup``
    the launch's cgroup, or None where cgroup v2 cannot be written. ``launch`` false: the group of
    a child of poprun's own (a notification's command), which never takes the cgroup made ahead
    for the next launch.

    Raises:
        WatchdogError: when ``/bin/sh`` cannot be started.
    """

    def __init__(self, *, remove: Sequence[str] = (), env: Mapping[str, str] | None = None, launch: bool = True) -> None:
        read_end, self._write_end = os.pipe()  # both close-on-exec: only poprun holds the write end
        self._ready_fd, ready_write = os.pipe()
        self.cgroup = Cgroup.make(take_ahead=launch)  # a launch's takes the cgroup made ahead for it
        try:
            self._proc = subprocess.Popen(  # noqa: S603 - a fixed script
                ["/bin/sh", "-c", _SCRIPT, "poprun-watchdog", sys.executable or "python3", _CLEANUP,
                 self.cgroup.path if self.cgroup else "", *remove],
                stdin=read_end, stdout=ready_write, stderr=subprocess.DEVNULL, process_group=0,
                env=None if env is None else dict(env))
        except OSError as exc:
            self._close_fds()
            if self.cgroup is not None:
                self.cgroup.remove()
            raise WatchdogError(exc.errno, f"cannot start the watchdog: {exc.strerror}") from exc
        finally:
            os.close(read_end)
            os.close(ready_write)
        self.group = self.pid = self._proc.pid
        self.started = _start_time(self.pid)
        self._closed = False
        if self.cgroup is not None:
            _cgroups[self.group] = self.cgroup

    def await_ready(self) -> None:
        """
        Return once the watchdog ignores the signals that stop a launch; poprun leaves the cgroup now.

        Raises:
            WatchdogError: when it died or did not become ready in time.
        """
        if self.cgroup is not None:
            with contextlib.suppress(OSError):
                self.cgroup.leave()
        with selectors.DefaultSelector() as selector:  # not select(): the descriptor may be above 1023
            selector.register(self._ready_fd, selectors.EVENT_READ)
            ready = selector.select(_READY_S)
        if not ready or os.read(self._ready_fd, 1) != b"x":
            raise WatchdogError(0, "poprun's watchdog did not start")

    def signal(self, sig: int) -> None:
        """Send ``sig`` to the whole group (the watchdog ignores SIGTERM, SIGINT, SIGHUP, SIGQUIT)."""
        if not self._closed:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.group, sig)

    def close(self) -> None:
        """Kill the group, the watchdog with it, and the cgroup; reap the watchdog; remove the cgroup. Idempotent."""
        if self._closed:
            return
        self.signal(signal.SIGKILL)
        if self.cgroup is not None:
            self.cgroup.kill()
        self._closed = True
        self._proc.wait()
        self._close_fds()
        if self.cgroup is not None:
            _cgroups.pop(self.group, None)
            self.cgroup.remove()

    def _close_fds(self) -> None:
        for fd in (self._write_end, self._ready_fd):
            with contextlib.suppress(OSError):
                os.close(fd)


def starting_in(group: int) -> None:
    """
    Have what this process starts from now on begin in the cgroup of the launch whose group is ``group``.

    This process moves into that cgroup (no move where it has none, or where the move is
    refused) until the watchdog is ready or closed: call it before starting each instance.
    """
    cgroup = _cgroups.get(group)
    if cgroup is not None and not cgroup.enter():
        _cgroups.pop(group)  # refused: the launch goes on without it


def started_in(group: int) -> None:
    """
    Move this process out of the cgroup of the launch whose group is ``group`` again, after :func:`starting_in`.

    For a process started once the launch runs (an instance started again): the watchdog is
    ready already, so nothing else would move poprun out.
    """
    cgroup = _cgroups.get(group)
    if cgroup is not None:
        with contextlib.suppress(OSError):
            cgroup.leave()


def _start_time(pid: int) -> int:
    """Return when ``pid`` started, in clock ticks after boot (field 22 of ``/proc/PID/stat``); 0 if unknown."""
    return start_time(pid) or 0


def become_subreaper() -> bool:
    """
    Make this process the reaper of its orphaned descendants (Linux ``PR_SET_CHILD_SUBREAPER``).

    Only poprun's command line should: it changes the whole process. Return whether it worked.
    """
    global _subreaper  # noqa: PLW0603 - a property of the process, like the kernel's flag
    if not _subreaper and sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            _subreaper = libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    return _subreaper


def _children() -> list[int]:
    """Return the pids of this process's children (``/proc/self/task/*/children``, else a scan of ``/proc``)."""
    try:
        return [int(pid) for task in os.scandir("/proc/self/task")
                for pid in _read_text(os.path.join(task.path, "children")).split()]
    except OSError:  # a kernel without CONFIG_PROC_CHILDREN
        me = str(os.getpid()).encode()
        return [int(e.name) for e in os.scandir("/proc") if e.name.isdigit() and _stat(int(e.name))[1:2] == [me]]


def _stat(pid: int) -> list[bytes]:
    """Return the fields of ``/proc/PID/stat`` after the command name (state first), or []."""
    try:
        return _read_bytes(f"/proc/{pid}/stat").rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _group_exists(group: int) -> bool:
    """Return whether any process, a zombie included, is still in ``group``."""
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def kill_adopted(group: int, known: Collection[int], since: int, *, within_s: float = 1.0) -> list[int]:
    """
    Kill and reap every process re-parented to this one since ``since`` (start time, clock ticks).

    Does nothing unless this process is a subreaper. Call it after killing ``group`` (the
    launch's): it goes on until that group is gone, so that the children of its processes that
    left it have been re-parented here, and until no such child is left (a killed process's
    children are re-parented here in turn); for at most ``within_s``. ``known`` are children to
    leave alone. Return the pids killed.
    """
    return _kill_children(lambda pid: pid not in known and pid not in _OWN and _start_time(pid) >= since, group,
                          within_s)


@contextlib.contextmanager
def starting_own() -> Iterator[Callable[[int], None]]:
    """
    Start children of poprun's own beside a launch: yield the function that records each one's pid.

    While the block runs no launch's end takes a child for one it left behind; a child recorded
    is never taken until :func:`forget_own` (call it once the child is reaped).
    """
    with _OWN_LOCK:
        yield _OWN.add


def forget_own(*pids: int) -> None:
    """Forget children recorded by :func:`starting_own` (reaped: their pids may be reused)."""
    with _OWN_LOCK:
        _OWN.difference_update(pids)


def kill_adopted_carrying(needle: bytes, group: int, *, within_s: float = 1.0) -> list[int]:
    """
    Kill and reap every process re-parented to this one from ``group`` or whose environment holds ``needle``.

    For what a command poprun ran left behind out of its group (``setsid``) where no cgroup
    holds it: its environment carries a marker (``NAME=VALUE``) only that command was given.
    Call it after killing ``group`` (the command's): it goes on until that group is gone, so
    that every child of its processes has been re-parented here, and while such children are
    found (a killed process's own are re-parented here in turn); for at most ``within_s``. Does
    nothing unless this process is a subreaper. Return the pids killed.
    """
    mine = str(group).encode()
    return _kill_children(lambda pid: _stat(pid)[2:3] == [mine] or _carries(pid, needle), group, within_s)


def _kill_children(chosen: Callable[[int], bool], group: int, within_s: float) -> list[int]:
    """Kill (with its group, when it leads one) and reap each child ``chosen`` picks, until ``group`` is gone and none is left."""
    killed: list[int] = []
    deadline = time.monotonic() + within_s
    while _subreaper and time.monotonic() < deadline:
        with _OWN_LOCK:  # no child of poprun's own starts between choosing and killing
            found = [pid for pid in _children() if chosen(pid)]
            for pid in found:
                with contextlib.suppress(OSError):
                    if os.getpgid(pid) == pid:  # it leads a group of its own (setsid): take the group
                        os.killpg(pid, signal.SIGKILL)
                    os.kill(pid, signal.SIGKILL)
        for pid in found:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
        killed += found
        if not found and not _group_exists(group):
            break
        if not found:
            time.sleep(0.002)  # SIGKILL is on its way to the group
    return killed


def _carries(pid: int, needle: bytes) -> bool:
    """Return whether process ``pid``'s environment holds the entry ``needle``."""
    try:
        return needle in _read_bytes(f"/proc/{pid}/environ").split(b"\0")
    except OSError:
        return False


def _read_text(path: str) -> str:
    """Return the text of ``path`` (``Path.read_text``'s: the locale's encoding), without pathlib's import."""
    with open(path) as file:  # pathlib costs start-up
        return file.read()


def _read_bytes(path: str) -> bytes:
    """Return the bytes of ``path`` (``Path.read_bytes``), without pathlib's import."""
    with open(path, "rb") as file:  # pathlib costs start-up
        return file.read()
