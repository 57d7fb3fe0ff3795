"""
The supervisor of a local launch: one thread that forwards output, sees instances end and stops the rest.

Layer: ``poprun.process``; imports :mod:`poprun.core.launching` (and the rest of ``poprun.core``), the other ``poprun.process`` modules and ``poprun.planner.plan``; never the
spec. Linux (``pidfd``), with a fallback of one waiting thread per instance elsewhere.

One thread waits in ``select`` (epoll) on everything at once: both pipes of every instance
(non-blocking, read in large chunks and handed to the :class:`~poprun.process.output.Router`),
a pidfd per instance (readable when it ends), and a wake-up pipe that :meth:`LocalLaunch.terminate`
writes to. When an instance ends, its pipes are drained first, so that its last lines are
forwarded before anyone hears that it ended. At the first failure the launch's gate is awaited
(:data:`~poprun.core.launching.Gate`: the apply step may be reading stacks), then the group is
sent SIGTERM, and SIGKILL after the grace period. When every instance has ended, what is still in the group
(background processes of the instances) is killed, processes re-parented to poprun are killed
(:func:`~poprun.process.watchdog.kill_adopted`), the output is drained to its end and the
temporary directories are removed: no process of the launch outlives :meth:`LocalLaunch.wait`.

Restarts (``--restart-scope instance``). Given a :class:`~poprun.core.launching.Restarter` and a
``respawn`` callable, a failed instance (not stopped by poprun, its host not lost) may start
again alone: the restarter says after how long (:meth:`~poprun.core.launching.Restarter.restart_after`,
asked once its pipes are drained, with its uptime since its last start), its end is told with
``restarting=True`` and the others go on, their output flowing. Once the delay has passed, a
thread of its own asks :meth:`~poprun.core.launching.Restarter.prepare` (which may block), then,
with the launch's lock held (so that a stop either comes before, and nothing starts, or after,
and reaches the new process), calls ``respawn(index, variables)``; the supervisor registers the
new process's pipes and pidfd and tells :class:`~poprun.core.events.InstanceStarted` with
``restart`` set. A stop (:meth:`LocalLaunch.terminate`) during the delay or the preparation
cancels the restart at once (a preparation still running is not waited for: its answer is
ignored), as does ``prepare`` returning None or ``respawn`` raising
:class:`~poprun.core.diagnostic.LaunchError`: the instance then stays ended with its last status
and the launch is torn down as after a failure. The output router, the instance's tail, the
sink's per-instance lines and its output files go on across restarts (the files are appended to).
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from poprun.core.diagnostic import LaunchError
from poprun.core.events import Event, InstanceEnded, InstanceStarted, MpiWithoutLauncher
from poprun.core.exitstatus import SIGNALLED as _SIGNALLED  # a POSIX shell reports death by signal N as 128+N
from poprun.core.launching import Gate, OutputSink, Restarter, Stream
from poprun.core.outcome import ApplyResult, InstanceFailure
from poprun.core.threads import spawn
from poprun.planner.plan import LaunchPlan
from poprun.process.files import remove_directories
from poprun.process.instance import start_supervising
from poprun.process.mpiwatch import MpiWatch
from poprun.process.output import Router
from poprun.process.watchdog import Watchdog, kill_adopted

_READ = 1 << 18  # bytes read from a pipe at once
_DRAIN_READS = 64  # reads of one pipe at most when draining it while its writers may still run
_DRAIN_S = 0.5  # how long output may keep flowing once the group is killed (a process outside it holds a pipe)
_MAX_SIGNAL = 64
_SSH_FAILED = 255  # ssh's status when it, not the remote command, failed (or the command's own 255)
_Key = tuple[int, Stream] | int | None  # a pipe, an instance's pidfd, the wake-up pipe
Respawn = Callable[[int, Mapping[str, str]], subprocess.Popen[bytes]]
"""
Starts instance ``index`` again with ``variables`` added to its environment (as its first start computed it); returns its process.

Called with the launch's lock held, from a thread that is not the supervisor's: it must be quick
(start a process; never wait for it or for a host's answer). The process must be in the launch's
process group (and cgroup), as the first one was. Its standard input is ``/dev/null``.

Raises:
    LaunchError: when it cannot start (the restart is given up, with the message on poprun's stderr).
"""


class LocalLaunch:
    """The running instances of one plan on this machine; see :class:`~poprun.backends.base.Launch`."""

    def __init__(self, plan: LaunchPlan, procs: Sequence[subprocess.Popen[bytes]], *, watchdog: Watchdog,
                 router: Router, sink: OutputSink, grace_s: float, remove: Sequence[str] = (),
                 stop: Callable[[int], None] | None = None, remote: frozenset[int] = frozenset(),
                 finish: Callable[[], None] | None = None, lost: Callable[[int, bool], str | None] | None = None,
                 restarter: Restarter | None = None, respawn: Respawn | None = None, gate: Gate | None = None) -> None:
        """
        Supervise ``procs`` (one per instance, in the launch's process group) until they end.

        ``stop``, when given, is also called with the signal the launch's group gets, SIGTERM to
        stop gracefully or SIGKILL (the ssh backend asks its remote instances to stop through
        their ssh connections, and kills those connections). The exit status of an
        instance in ``remote`` is its remote program's, 128+N meaning killed by signal N.
        ``finish`` runs once every process of the launch is gone (the ssh backend closes its
        connections). ``lost(index, stopped)``, asked when a remote instance ends with ssh's status 255
        (``stopped``: after poprun began stopping the launch), names the host that stopped answering,
        or None (then that host, not the instance, is to blame): the instance's own, or the relay
        through which it was reached.
        ``restarter`` and ``respawn`` together start a failed instance again (see the module docstring).
        ``gate`` is awaited after a failure is told, before the others are stopped.
        """
        self._plan, self._procs, self._watchdog, self._router = plan, list(procs), watchdog, router
        self._sink, self._restarter, self._respawn, self._gate = sink, restarter, respawn, gate
        self._pids = {proc.pid for proc in self._procs}  # every process of an instance ever started (to reap them)
        self._started = [time.monotonic()] * len(self._procs)  # when each instance's current process started
        self._restarts = [0] * len(self._procs)  # how many times each instance was started again
        self._live = set(range(len(self._procs)))  # instances whose current process has not been seen to end
        self._held: dict[int, InstanceEnded] = {}  # instances to start again: their end, until started or given up
        self._due: dict[int, float] = {}  # ... those waiting for their delay: when it is over (monotonic)
        self._preparing: set[int] = set()  # ... those whose prepare() runs (under the lock: cancelled by removal)
        self._respawned: dict[int, subprocess.Popen[bytes] | BaseException | None] = {}  # prepare's outcome
        self._grace_s, self._remove = grace_s, tuple(remove)
        self._stop, self._remote, self._finish, self._lost = stop, remote, finish, lost
        self._notify: Callable[[Event], None] | None = getattr(sink, "event", None)  # an EventSink
        self._lock = threading.RLock()  # reentrant: a second Ctrl-C may interrupt terminate()
        self._stopping = self._finished = False
        self._kill_at: float | None = None
        self._ends: list[InstanceEnded] = []
        self._pidfds: dict[int, int] = {}  # instance index -> its pidfd, until it ended
        self._waited: set[int] = set()  # instances watched by a thread instead (no pidfd), until they ended
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._selector = selectors.DefaultSelector()
        # Instances of this machine that load MPI though no MPI launcher runs them (see mpiwatch): told once
        self._mpi = MpiWatch() if len(self._procs) > 1 and len(self._remote) < len(self._procs) else None
        self._done = threading.Event()
        self._result: ApplyResult | None = None
        self._error: BaseException | None = None
        start_supervising(threading.Thread(target=self._run, name="poprun-supervisor", daemon=True),
                          self._announce, self._abort)

    def _announce(self) -> None:
        for index, proc in enumerate(self._procs):  # before the thread starts: one thread at a time
            self._event(InstanceStarted(index=index, pid=proc.pid))

    def _abort(self) -> None:
        """Stop everything at once and wait for the supervisor's clean-up (the launch was interrupted as it started)."""
        self.terminate(0)
        self._done.wait()

    def terminate(self, grace_s: float) -> None:
        """Send SIGTERM to every process of the launch now, SIGKILL after ``grace_s``; nothing once ended."""
        with self._lock:
            if self._finished:
                return
            first, self._stopping = not self._stopping, True
            if grace_s <= 0:
                self._signal(signal.SIGKILL)
                self._kill_at = None
            elif first:
                self._signal(signal.SIGTERM)
                self._kill_at = time.monotonic() + grace_s
            self._wake()

    def forward(self, sig: int) -> None:
        """Send ``sig`` (SIGTSTP, SIGCONT) to every instance (through ``stop`` on other hosts); nothing once ended."""
        with self._lock:
            if not self._finished:
                self._watchdog.signal(sig)
                if self._stop is not None:
                    self._stop(sig)

    def _signal(self, sig: int) -> None:
        self._watchdog.signal(sig)
        if self._stop is not None:
            self._stop(sig)
        if sig == signal.SIGTERM:  # as kill(1) does for a stopped job: a suspended instance (SIGSTOP, Ctrl-Z) would
            self._watchdog.signal(signal.SIGCONT)  # hold SIGTERM pending until the grace period's SIGKILL
            if self._stop is not None:
                self._stop(signal.SIGCONT)

    def _wake(self) -> None:
        """Wake the supervisor up; call with the lock held (the pipe is closed once finished)."""
        if not self._finished:
            with contextlib.suppress(BlockingIOError):  # full: a wake-up is pending anyway
                os.write(self._wake_w, b"!")

    def wait(self) -> ApplyResult:
        """Return once every instance has ended; the others are stopped at the first failure."""
        self._done.wait()  # signal handlers still run while the main thread waits here
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    def _run(self) -> None:
        try:
            self._watch()
            self._supervise()
            self._teardown()
            self._result = self._make_result()
        except BaseException as exc:  # noqa: BLE001 - a bug: kill everything, and let wait() raise it
            self._error = exc
            with self._lock:
                self._finished = True
                self._watchdog.close()
            with contextlib.suppress(Exception):
                self._close()
            if self._finish is not None:
                with contextlib.suppress(Exception):
                    self._finish()
        finally:
            self._done.set()

    def _watch(self) -> None:
        """Register every pipe, every pidfd and the wake-up pipe."""
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        for index, proc in enumerate(self._procs):
            self._register(index, proc)

    def _register(self, index: int, proc: subprocess.Popen[bytes]) -> None:
        for stream, pipe in (("stdout", proc.stdout), ("stderr", proc.stderr)):
            assert pipe is not None
            os.set_blocking(pipe.fileno(), False)
            self._selector.register(pipe, selectors.EVENT_READ, (index, stream))
        self._watch_end(index, proc)

    def _watch_end(self, index: int, proc: subprocess.Popen[bytes]) -> None:
        """Have the selector wake up when ``proc`` ends: its pidfd, or a thread that waits for it."""
        try:
            self._pidfds[index] = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):  # no pidfd (not Linux >= 5.3): wait without reaping
            self._waited.add(index)
            spawn(self._await_end, args=(proc.pid,))
        else:
            self._selector.register(self._pidfds[index], selectors.EVENT_READ, index)

    def _await_end(self, pid: int) -> None:
        with contextlib.suppress(ChildProcessError):
            os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        with self._lock:
            self._wake()

    def _supervise(self) -> None:
        """Forward output and note each end until every instance has ended."""
        while self._live or self._held:
            kill_at = self._kill_at
            look_at = self._mpi.due() if self._mpi is not None else None
            due = [at for at in (kill_at, look_at, *self._due.values()) if at is not None]  # the kill, the restarts' delays
            timeout = max(0.0, min(due) - time.monotonic()) if due else None
            registered = self._selector.get_map()
            for key, _ in self._selector.select(timeout):
                if registered.get(key.fd) is key:  # not drained and closed by an end earlier in this batch
                    self._dispatch(key)
            self._router.flush()
            if self._held:
                self._restart_step()
            if kill_at is not None and time.monotonic() >= kill_at:
                self.terminate(0)
            if look_at is not None and time.monotonic() >= look_at:
                self._look_for_mpi()

    def _look_for_mpi(self) -> None:
        """Tell the first running instance of this machine found with an MPI library loaded (once)."""
        assert self._mpi is not None
        found = self._mpi.look((i, self._procs[i].pid) for i in sorted(self._live - self._remote))
        if found is not None:
            self._event(MpiWithoutLauncher(index=found[0], library=found[1]))

    def _restart_step(self) -> None:
        """Start the preparation of restarts now due; take the new processes; give up every restart once stopping."""
        with self._lock:
            if self._stopping:
                self._due.clear()
                self._preparing.clear()  # a preparation still running is not waited for: its answer is ignored
            outcomes, self._respawned = self._respawned, {}
        for index, outcome in sorted(outcomes.items()):
            if isinstance(outcome, subprocess.Popen):
                self._take(index, outcome)
            elif isinstance(outcome, LaunchError):
                self._say(f"poprun: instance {index} could not start again: {outcome.message}\n")
            elif isinstance(outcome, BaseException):
                raise outcome  # a bug in prepare() or respawn: wait() raises it, nothing is left running
        now = time.monotonic()
        for index in sorted(i for i, at in self._due.items() if at <= now):
            with self._lock:
                del self._due[index]
                self._preparing.add(index)
            spawn(self._prepare, args=(index,), name="poprun-restart")
        with self._lock:
            given_up = sorted(i for i in self._held if i not in self._due and i not in self._preparing
                              and i not in self._respawned)
        for index in given_up:
            self._give_up(index)

    def _prepare(self, index: int) -> None:
        """Ask the restarter for the instance's variables (this may block), then start it again unless given up."""
        assert self._restarter is not None
        assert self._respawn is not None
        variables: Mapping[str, str] | None = None
        outcome: subprocess.Popen[bytes] | BaseException | None = None
        try:
            variables = self._restarter.prepare(index)
        except BaseException as exc:  # noqa: BLE001 - handed to the supervisor thread, which raises it
            outcome = exc
        with self._lock:  # a stop comes either before (nothing starts) or after (it reaches the new process)
            if index not in self._preparing or self._stopping or self._finished:
                return  # given up meanwhile (the supervisor does so once it sees the stop)
            if variables is not None:
                try:
                    outcome = self._respawn(index, variables)
                except BaseException as exc:  # noqa: BLE001 - LaunchError gives the restart up, others are bugs
                    outcome = exc
            self._preparing.discard(index)
            self._respawned[index] = outcome
            self._wake()

    def _take(self, index: int, proc: subprocess.Popen[bytes]) -> None:
        """Supervise ``proc``, instance ``index`` started again: its pipes, its end; tell that it started."""
        del self._held[index]
        self._procs[index] = proc
        self._pids.add(proc.pid)
        self._started[index] = time.monotonic()
        self._restarts[index] += 1
        self._live.add(index)
        self._register(index, proc)
        self._event(InstanceStarted(index=index, pid=proc.pid, restart=self._restarts[index]))

    def _give_up(self, index: int) -> None:
        """Instance ``index`` stays ended with its last status; the launch is torn down as after a failure."""
        self._ends.append(self._held.pop(index))
        with self._lock:
            stopping = self._stopping
        if not stopping:
            self.terminate(self._grace_s)

    def _say(self, line: str) -> None:
        """Write poprun's own ``line`` to the sink's stderr, after the output read so far."""
        self._router.flush()
        self._sink.write("stderr", line.encode(errors="replace"))

    def _dispatch(self, key: selectors.SelectorKey) -> None:
        data: _Key = key.data
        if data is None:
            with contextlib.suppress(BlockingIOError):
                os.read(self._wake_r, 4096)
            for index in sorted(self._waited):  # the fallback's threads wake us up too
                self._poll(index)
        elif isinstance(data, int):
            self._poll(data)
        else:
            self._read(key, *data)

    def _poll(self, index: int) -> None:
        """Note the end of instance ``index`` if it has ended: drain its pipes, then tell the sink."""
        proc = self._procs[index]
        if index not in self._live:
            return
        code = proc.poll()
        if code is None:
            return
        self._live.discard(index)
        self._waited.discard(index)
        pidfd = self._pidfds.pop(index, None)
        if pidfd is not None:
            self._selector.unregister(pidfd)
            os.close(pidfd)
        self._drain(index)
        with self._lock:
            stopped = self._stopping
        if index in self._remote and _SIGNALLED < code <= _SIGNALLED + _MAX_SIGNAL:
            code = _SIGNALLED - code  # the remote shell's 128+N: killed by signal N there
        gone = self._lost(index, stopped) if code == _SSH_FAILED and self._lost is not None else None
        via = gone if gone and gone != self._plan.instances[index].host else ""
        end = InstanceEnded(index=index, pid=proc.pid, exit_code=code if code >= 0 else None,
                            signal=-code if code < 0 else None, stopped=stopped, lost=bool(gone), via=via)
        delay = self._restart_after(end)
        if delay is not None:
            end = InstanceEnded(index=end.index, pid=end.pid, exit_code=end.exit_code, signal=end.signal,
                                restarting=True)
            self._event(end)
            with self._lock:
                if not self._stopping:  # a stop that came while the restarter was asked: no restart
                    self._due[index] = time.monotonic() + max(0.0, delay)
                self._held[index] = end
            return
        self._ends.append(end)
        self._event(end)
        if end.status != 0 and not stopped:
            if self._gate is not None:
                self._gate()  # this thread waits (the sink's event() does not): stacks may be being read
            self.terminate(self._grace_s)

    def _restart_after(self, end: InstanceEnded) -> float | None:
        """Return the restarter's delay before instance ``end.index`` starts again, or None (no restart here)."""
        if self._restarter is None or self._respawn is None or end.status == 0 or end.stopped or end.lost:
            return None
        return self._restarter.restart_after(end, time.monotonic() - self._started[end.index])

    def _read(self, key: selectors.SelectorKey, index: int, stream: Stream) -> bool:
        """Read once from a pipe; return False when it is empty for now or has ended."""
        try:
            chunk = os.read(key.fd, _READ)
        except BlockingIOError:
            return False
        if chunk:
            self._router.feed(index, stream, chunk)
            return True
        self._router.end(index, stream)
        self._selector.unregister(key.fileobj)
        key.fileobj.close()  # type: ignore[union-attr]
        return False

    def _drain(self, index: int | None = None) -> None:
        """Read what the pipes of instance ``index`` (or of all) hold now, then pass it on."""
        for key in list(self._selector.get_map().values()):
            if isinstance(key.data, tuple) and index in (None, key.data[0]):
                for _ in range(_DRAIN_READS):  # bounded: a background process may write without end
                    if not self._read(key, *key.data):
                        break
        self._router.flush()

    def _teardown(self) -> None:
        """Every instance ended: kill what is left of the launch, drain the output, remove directories."""
        self._drain()
        remove_directories(self._remove)  # while the watchdog still guards them
        with self._lock:
            self._finished = True  # from now on terminate() does nothing: the group id may be reused
            self._selector.unregister(self._wake_r)
            self._watchdog.close()
        kill_adopted(self._watchdog.group, self._pids, self._watchdog.started)
        self._drain_to_the_end()
        self._close()
        remove_directories(self._remove)  # again: a killed process may have written there meanwhile
        if self._finish is not None:
            self._finish()

    def _drain_to_the_end(self) -> None:
        """Read every pipe to its end, for at most :data:`_DRAIN_S` (a process out of reach may hold one)."""
        deadline = time.monotonic() + _DRAIN_S
        while self._selector.get_map():
            ready = self._selector.select(max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            for key, _ in ready:
                self._read(key, *key.data)
        self._router.flush()

    def _close(self) -> None:
        """Close every pipe and pidfd left, the selector, the router and the wake-up pipe."""
        for key in list(self._selector.get_map().values()):
            self._selector.unregister(key.fileobj)
            if isinstance(key.data, tuple):
                key.fileobj.close()  # type: ignore[union-attr]
        for pidfd in self._pidfds.values():
            os.close(pidfd)
        self._pidfds.clear()
        self._selector.close()
        self._router.close()
        os.close(self._wake_r)
        os.close(self._wake_w)

    def _event(self, event: Event) -> None:
        if self._notify is not None:
            self._router.flush()
            self._notify(event)

    def _make_result(self) -> ApplyResult:
        """Return the result of the ends seen, in the order seen."""
        failures = tuple(InstanceFailure(index=e.index, host=self._plan.instances[e.index].host, pid=e.pid,
                                         exit_code=e.exit_code, signal=e.signal, stopped=e.stopped,
                                         tail=self._router.tail(e.index), lost=e.lost, via=e.via)
                         for e in self._ends if e.status != 0)
        statuses = tuple(e.status for e in sorted(self._ends, key=lambda e: e.index))
        cause = next((f.index for f in failures if f.lost and not f.stopped), None)  # a lost host explains the rest
        if cause is None:
            cause = next((f.index for f in failures if not f.stopped), None)
        return ApplyResult(statuses=statuses, failures=failures, root_cause=cause)
