"""
A cgroup (v2) per launch: what a process group cannot hold, a cgroup does.

Layer: ``poprun.process``; the standard library and :mod:`poprun.core.threads`. Linux with a cgroup v2 hierarchy that this
user may write to (a delegated systemd slice, a container, root) and ``cgroup.kill`` (Linux
5.14). Anywhere else :meth:`Cgroup.make` returns None and nothing changes.

A process that leaves the launch's process group (``setsid``, a daemon's double fork) is out
of reach of ``killpg``, and once poprun is SIGKILLed it is not re-parented to poprun either.
It stays in its cgroup, though: a child begins in the cgroup of the process that forks it,
and only a writer of ``cgroup.procs`` moves it. So each launch gets a child cgroup of
poprun's own (``poprun-<random>``), poprun moves itself into it while it starts the
instances (every instance is born inside, with no moment outside) and back out before they
run long (:meth:`Cgroup.leave`), and ``cgroup.kill`` ends everything in it: at the end of the
launch, and from the watchdog when poprun dies. Only the directory this launch made is ever
removed (with the empty cgroups that nested launches left in it), by its record here.

The price is one move of poprun into the cgroup per launch: the kernel makes the first move
after a quiet while wait for an RCU grace period (5-15 ms here, more on a busy machine), before
the instances can start. So a launch that will start its instances here (the local and
offline backends) makes its cgroup ahead (:meth:`Cgroup.ahead`, as the run begins): a thread
moves poprun in while the main thread makes the run record and prepares the launch, and the
next :meth:`Cgroup.make` (the launch's watchdog) takes that cgroup; :func:`release_ahead`
leaves and removes one that no launch took. Whatever poprun starts meanwhile begins inside too
(the watchdog among them; its clean-up leaves the cgroup before it kills it). A poprun killed
in those milliseconds before its watchdog starts (SIGKILL, or SIGTERM before its handlers are
set) leaves the empty cgroup's directory (nothing runs in it). ``POPRUN_CGROUP=0`` makes no
cgroup (and keeps the limit above).

The kernel waits for that grace period only on the first move after a quiet while: a move within
about one grace period of another is quick. So a command that may launch readies the kernel as
it begins, before it plans (:func:`prime`): a thread moves poprun into the cgroup it is in
already (nothing changes) and again every few ms, so that the wait is taken while poprun
imports and plans, and the move into the launch's cgroup finds the kernel ready. It stops
before any cgroup is made (:meth:`Cgroup.make` stops it and waits for it: a write of it never
follows the move in), when the command has no launch cgroup to make, or after
:data:`_PRIME_S`, and does nothing where poprun has no writable cgroup v2.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from collections.abc import Iterator
    from threading import Event, Thread

SWITCH = "POPRUN_CGROUP"  # "0": make no cgroup (moving poprun in costs one RCU grace period, some ms)
_KILL_WAIT_S = 1.0  # the longest kill() waits for the cgroup to empty
_own: list[str | None] = []  # this process's own cgroup directory, once looked up
# poprun inside a launch's cgroup: what it forks then is born there, and a launch's end kills it. Children
# poprun starts for itself beside a launch (a notification's command) are started outside(): never while
# poprun is inside one, and no move in begins until they are out on their own.
_gate = threading.Condition()
_gate_state = [0, 0]  # [cgroups this process is inside (or moving into), children being started outside()]
_ahead: list[Cgroup] = []  # the cgroup Cgroup.ahead() made, until Cgroup.make() takes it or release_ahead()
_PRIME_S = 0.25  # the longest prime() keeps the kernel ready (a launch plans in some ms)
_PRIME_EVERY_S = 0.004  # well within a grace period: each move then finds the kernel ready
_primer: list[tuple[Thread, Event]] = []  # prime()'s thread and what stops it, until stop_priming()


def _own_directory() -> str | None:
    """Return the directory of this process's own cgroup v2 (looked up once), or None when there is none."""
    if not _own:
        _own.append(_find_own_directory())
    return _own[0]


def _find_own_directory() -> str | None:
    try:
        with open("/proc/self/cgroup", encoding="utf-8") as file:  # pathlib costs start-up
            own = next((line[3:].rstrip("\n") for line in file if line.startswith("0::")), None)
        with open("/proc/self/mountinfo", encoding="utf-8") as file:
            mounts = [line.split() for line in file if " - cgroup2 " in line]
    except OSError:
        return None
    if own is None or not mounts:
        return None
    for fields in mounts:
        root, point = fields[3], fields[4]
        if own == root or own.startswith(root.rstrip("/") + "/"):
            return point + own[len(root.rstrip("/")):].rstrip("/") if own != root else point
    return None


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


class Cgroup:
    """One launch's cgroup, made by :meth:`make`; ``path`` is its directory, ``parent`` poprun's own cgroup."""

    def __init__(self, path: str, parent: str) -> None:
        self.path, self.parent = path, parent
        self._in = False
        self._mover: Thread | None = None  # the thread moving this process in (ahead()), until joined

    @property
    def _inside(self) -> bool:
        return self._in

    @_inside.setter
    def _inside(self, inside: bool) -> None:
        """Say that this process is inside (or moving into) the cgroup, or out; a move in waits while a child starts outside()."""
        with _gate:
            if inside and not self._in:
                while _gate_state[1]:
                    _gate.wait()
                _gate_state[0] += 1
            elif self._in and not inside:
                _gate_state[0] -= 1
                _gate.notify_all()
            self._in = inside

    @classmethod
    def make(cls, *, take_ahead: bool = True) -> Cgroup | None:
        """
        Make a new cgroup under this process's own; return it, or None where that cannot be done (or ``POPRUN_CGROUP=0``).

        The cgroup :meth:`ahead` made, when there is one, is returned instead (once; not with
        ``take_ahead`` false: a cgroup of poprun's own children), once no child is being started
        :func:`outside` (the launch it becomes will kill what is in it). :func:`prime`'s thread is
        stopped first.
        """
        stop_priming()
        if _ahead and take_ahead:
            with _gate:
                while _gate_state[1]:
                    _gate.wait()
                return _ahead.pop()
        parent = None if os.environ.get(SWITCH) == "0" else _own_directory()
        if parent is None:
            return None
        path = os.path.join(parent, "poprun-" + os.urandom(6).hex())  # pathlib is slower
        try:
            os.mkdir(path, 0o755)
        except OSError:  # read-only, another user's, no such hierarchy
            return None
        made = cls(path, parent)
        if not os.path.exists(os.path.join(path, "cgroup.kill")):  # Linux < 5.14
            made.remove()
            return None
        return made

    @classmethod
    def ahead(cls) -> Cgroup | None:
        """
        Make the next launch's cgroup now and begin moving this process into it in a thread; return it, or None.

        The next :meth:`make` returns it; until then what this process starts begins inside it
        once the move is made. :meth:`enter` and :meth:`leave` wait for the move. Where no
        launch takes it, :func:`release_ahead` leaves and removes it.
        """
        if _ahead:
            return _ahead[0]
        made = cls.make()
        if made is not None:
            _ahead.append(made)  # first: release_ahead() then undoes it, whatever a stop signal interrupts
            made.begin_entering()
        return made

    def begin_entering(self) -> None:
        """
        Begin :meth:`enter` in a thread (the move may wait for an RCU grace period); :meth:`enter` waits for it.

        The thread starts with the stop signals blocked (:mod:`poprun.core.threads`), as the launch's
        own threads do: they reach the main thread, whose handlers stop the launch.
        """
        from poprun.core.threads import spawn

        if not self._inside:
            self._inside = True  # as in enter(): inside before the write
            self._mover = spawn(self._move_in, name="poprun-cgroup")

    def _move_in(self) -> None:
        try:
            _write(os.path.join(self.path, "cgroup.procs"), str(os.getpid()))
        except OSError:
            self._inside = False

    def _moved(self) -> None:
        """Wait for the move :meth:`ahead` began, if it is under way."""
        if self._mover is not None:
            self._mover.join()
            self._mover = None

    def enter(self) -> bool:
        """Move this process into the cgroup (what it starts then begins inside); return whether it is inside."""
        self._moved()
        if not self._inside:
            # inside before the write: a stop signal's handler may raise right after the (slow) move,
            # and kill() must then not take poprun for outside
            self._inside = True
            try:
                _write(os.path.join(self.path, "cgroup.procs"), str(os.getpid()))
            except OSError:
                self._inside = False
                return False
        return True

    def leave(self) -> None:
        """Move this process back to its own cgroup (what it started stays inside)."""
        self._moved()
        if self._inside:
            _write(os.path.join(self.parent, "cgroup.procs"), str(os.getpid()))
            self._inside = False

    def kill(self) -> None:
        """SIGKILL every process in the cgroup and wait (a little) until it is empty; never this process."""
        with contextlib.suppress(OSError):
            self.leave()
        if self._inside:  # could not leave: killing the cgroup would kill poprun
            return
        with contextlib.suppress(OSError):
            _write(os.path.join(self.path, "cgroup.kill"), "1")
            deadline = time.monotonic() + _KILL_WAIT_S
            while time.monotonic() < deadline:
                with open(os.path.join(self.path, "cgroup.events"), encoding="ascii") as file:
                    if "populated 0" in file.read():
                        return
                time.sleep(0.001)

    def remove(self) -> None:
        """Remove the cgroup, and the empty cgroups left in it (nested launches); a busy one stays. This process leaves it first."""
        with contextlib.suppress(OSError):
            self.leave()
        for folder, _, _ in os.walk(self.path, topdown=False):
            with contextlib.suppress(OSError):
                os.rmdir(folder)  # cgroupfs: rmdir removes an empty cgroup, files and all


def release_ahead() -> None:
    """Leave and remove the cgroup :meth:`Cgroup.ahead` made when no launch took it (nothing of a launch is in it)."""
    stop_priming()
    if _ahead:
        _ahead.pop().remove()


def prime() -> None:
    """
    Begin readying the kernel for a launch's move into its cgroup, in a thread (see the module docstring).

    Nothing where ``POPRUN_CGROUP=0`` or poprun has no cgroup v2, nor a second time. The
    thread starts with the stop signals blocked, as :meth:`Cgroup.begin_entering`'s.
    """
    if _primer or os.environ.get(SWITCH) == "0":
        return
    own = _own_directory()
    if own is None:
        return
    from threading import Event, Thread

    from poprun.core.threads import start_thread

    stop = Event()
    thread = Thread(target=_keep_ready, args=(os.path.join(own, "cgroup.procs"), stop),
                    name="poprun-cgroup-primer", daemon=True)
    _primer.append((thread, stop))
    start_thread(thread)


def stop_priming() -> None:
    """Stop :func:`prime`'s thread and wait for it (a move of it under way ends first); idempotent."""
    if _primer and _primer[0][0].is_alive():  # not in a forked child (the thread is not there), nor once ended
        thread, stop = _primer[0]
        stop.set()
        thread.join()


def _keep_ready(procs: str, stop: Event) -> None:
    """Move this process into the cgroup it is in (``procs``) now and every few ms, until ``stop`` or :data:`_PRIME_S`."""
    pid = str(os.getpid())
    deadline = time.monotonic() + _PRIME_S
    while not stop.is_set() and time.monotonic() < deadline:
        try:
            _write(procs, pid)
        except OSError:  # not ours to write (a cgroup v2 that is not delegated): nothing to ready
            return
        stop.wait(_PRIME_EVERY_S)


@contextlib.contextmanager
def outside() -> Iterator[None]:
    """
    Start children of poprun's own in this block: never inside a launch's cgroup, where a launch's end would kill them.

    It waits until this process is inside no launch's cgroup, and no move in begins until it
    ends: start the children and let them move into a cgroup of their own meanwhile.
    """
    with _gate:  # a cgroup made ahead that no launch took yet is never killed (released as it is)
        while _gate_state[0] - sum(made._in for made in _ahead):  # noqa: SLF001 - the module's own records
            _gate.wait()
        _gate_state[1] += 1
    try:
        yield
    finally:
        with _gate:
            _gate_state[1] -= 1
            _gate.notify_all()
