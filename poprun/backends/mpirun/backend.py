"""
The ``mpirun`` backend: OpenMPI's ``mpirun`` starts every instance, as real poprun had it do.

Layer: ``poprun.backends``; imports :mod:`poprun.backends.base`, :mod:`poprun.process`,
its own modules (:mod:`.command`, the command, which ``poprun plan`` shows through
:meth:`MpirunBackend.describe`) and ``poprun.planner.plan``; never the spec, never another backend.

poprun runs the one command of :func:`~poprun.backends.mpirun.command.mpirun_command` (global args
first, ``--bind-to none``, ``--tag-output``, ``-H host:slots``, one app context per instance,
so MPI rank = instance index) as its child, in the process group of a
:class:`~poprun.process.watchdog.Watchdog`. Each instance's program runs through the output
relay's wrapper (:mod:`poprun.backends.mpirun.mpirelay`): its stdout and stderr are connections to
poprun, so its output never passes through mpirun (OpenMPI 4.1.4's ``--tag-output`` loses
bulk output of short lines) and every line arrives once, whole, attributed. The
:class:`~poprun.process.output.Router` forwards each instance's lines as the local backend does
(tagged or not, only one instance's, the failure report's tail, ``--output-filename``'s files in
mpirun's layout). What still comes through mpirun's pipes is split by its tags
(:class:`~poprun.backends.mpirun.mpiout.TagSplitter`): the output of an instance whose wrapper could
not reach poprun, and mpirun's own messages, held back until an instance has started.

Lifecycle: when an instance fails, mpirun stops the others and exits; its message says which
instance failed first and how (:func:`~poprun.backends.mpirun.mpiout.parse_failure`), which becomes
the root cause, the others being reported as stopped. When mpirun fails before any instance
started, its failure is told as mpirun's or a host's (:mod:`poprun.backends.mpirun.mpistart`: PR412,
PR421-PR423, exit 125). A host that stops answering is noticed within the host timeout by the
relay's keepalives, by the ssh clients' ServerAlive and by mpirun's own keepalives
(:func:`~poprun.backends.mpirun.mpistart.mpirun_settings`), named (PR411, exit 125), and the launch is
stopped. When mpirun only says it lost a daemon (its ssh client ended: a host hung, with ssh's own
words silenced by ``LogLevel``), the hosts are those whose ssh client of mpirun ended while mpirun
ran (each is watched by a pidfd) and whose SSH server does not greet (else the first to end: the
others end in mpirun's teardown, in the same instant on a busy machine), else those whose
instances fell silent; never a healthy host beside one already named, and never instance 0 for
mpirun's own status. To stop the launch poprun sends mpirun SIGTERM (mpirun passes it on to every instance
and tears its daemons down), then SIGKILL to the whole group after the grace period, and to
mpirun's children outside it (its ssh clients, in groups of their own, which would keep its
pipes open); when mpirun exits, whatever of its children is left is killed too. On other hosts,
mpirun's daemons end their instances when they lose mpirun, and each instance's relay helper
kills its instance (and a daemon that outlives it) once its connection to poprun ends or breaks. If poprun dies, even by SIGKILL,
the watchdog kills mpirun.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from poprun.backends.base import (
    PROCESSES,
    ApplyResult,
    Gate,
    HostCommands,
    InstanceEnded,
    LaunchError,
    OutputSink,
    TemporaryCache,
)
from poprun.backends.mpirun.command import mpirun_command, render_explained
from poprun.backends.mpirun.mpiout import TagSplitter, parse_failure
from poprun.backends.mpirun.mpirelay import (
    RELAY_VARIABLE,
    Relay,
    output_lost,
    relay_refused,
    relay_words,
    through_mpirun,
)
from poprun.backends.mpirun.mpistart import (
    greets,
    host_lost,
    host_timeout,
    lost_daemon,
    lost_hosts,
    mpirun_missing,
    mpirun_settings,
    ssh_host_named,
    startup_failure,
)
from poprun.core.diagnostic import DiagnosticError, HostLostError, launch_error
from poprun.core.localhost import is_this_machine, local_names
from poprun.core.process import start_time
from poprun.core.record import evolve
from poprun.core.span import SourceSpan
from poprun.planner.plan import Instance, LaunchPlan
from poprun.process import watchdog as watchdog_module
from poprun.process.files import which
from poprun.process.instance import DEFAULT_GRACE_S, directories_to_remove, forwarded_stdin
from poprun.process.launcher import LauncherLaunch, start_launcher
from poprun.process.output import Router
from poprun.process.watchdog import Watchdog

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from typing import ClassVar

    from poprun.backends.base import Stream
    from poprun.process.launcher import Piece

_OWN_TEXT = 1 << 16  # how much of mpirun's own messages is kept to find the failure in
_DRAIN_IDLE_S = 1.0  # once mpirun has ended, a relay connection silent this long is closed
_DRAIN_MAX_S = 5.0  # and every one this long after (a program's child that outlived it may hold one)
_GREET_S = 3.0  # how long a host whose ssh client of mpirun ended may take to greet (see mpistart.greets)
_TICK_S = 0.5  # how often the reading thread looks at mpirun's children and the relay's greetings


class MpirunLaunch(LauncherLaunch):
    """The running ``mpirun`` of one plan; see :class:`~poprun.process.launcher.LauncherLaunch`."""

    thread_name = "poprun-mpirun"

    def __init__(self, plan: LaunchPlan, proc: subprocess.Popen[bytes], *, watchdog: Watchdog, router: Router,
                 sink: OutputSink, grace_s: float, relay: Relay, ssh_args: str = "",
                 remove: tuple[str, ...] = (), gate: Gate | None = None) -> None:
        self._messages = bytearray()  # mpirun's own stderr, the last _OWN_TEXT bytes: where the failure is named
        self._held = bytearray()  # mpirun's stderr while no instance has started (see _own)
        self._relay = relay
        self._ssh_args = ssh_args  # the options mpirun gives its ssh (plm_rsh_args): how ssh sees the hosts
        self._tagged_by: set[int] = set()  # instances whose output came through mpirun (their wrapper could not reach poprun)
        self._lost: dict[str, str] = {}  # host -> how poprun noticed that it stopped answering
        self._ended_at: float | None = None  # when mpirun ended
        self._last_data = 0.0
        self._children: dict[int, int] = {}  # mpirun's children seen (its ssh clients): pid -> start time
        self._looked_at = 0.0
        self._pidfd: int | None = None
        self._selector: selectors.BaseSelector | None = None
        self._silent: set[int] = set()  # instances whose connection was still open when reading ended
        self._clients: dict[int, str] = {}  # pidfd -> the host of mpirun's ssh client it watches
        self._clients_ended: list[str] = []  # hosts whose ssh client of mpirun ended while mpirun ran, in order
        super().__init__(plan, proc, watchdog=watchdog, router=router, sink=sink, grace_s=grace_s, remove=remove,
                         gate=gate)

    def _splitter(self, stream: Stream) -> TagSplitter:
        return TagSplitter(stream)

    # -- sources besides mpirun's pipes: the relay, mpirun's end -------------------------
    def _attach(self, selector: selectors.BaseSelector) -> None:
        self._selector = selector
        self._relay.attach(selector, self._relay_ready)
        with contextlib.suppress(OSError, AttributeError):  # pidfd_open: Linux 5.3
            self._pidfd = os.pidfd_open(self._proc.pid)
            selector.register(self._pidfd, selectors.EVENT_READ, self._mpirun_ended)

    def _relay_ready(self, fd: int) -> None:
        self._relay.ready(fd, feed=self._feed, end=self._router.end, lost=self._instance_lost)

    def _feed(self, index: int, stream: Stream, data: bytes) -> None:
        self._last_data = time.monotonic()
        if self._held:
            self._release()
        self._router.feed(index, stream, data)

    def _mpirun_ended(self, _fd: int) -> None:
        """Take mpirun's exit: whatever it left (ssh clients to a host that does not answer) is killed."""
        if self._selector is not None and self._pidfd is not None:
            self._selector.unregister(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = None
        self._ended_at = time.monotonic()
        self._kill_children(adopted=False)

    def _busy(self) -> bool:
        """Go on while an instance's connection is open, until it is silent for a moment after mpirun ended (5 s at most)."""
        if not self._relay.open_streams():
            return False
        if self._relay.awaited():  # a connection broke: its wrapper connects again and sends on
            return True
        now = time.monotonic()
        if self._ended_at is None:
            self._ended_at = now  # its pipes are closed: it has ended
        return now - max(self._ended_at, self._last_data) < _DRAIN_IDLE_S and now - self._ended_at < _DRAIN_MAX_S

    def _detach(self) -> None:
        # still connected, or never heard of (its host went down before its wrapper reached poprun)
        self._silent = self._relay.open_instances() | (set(range(len(self._plan.instances))) - self._relay.started
                                                        - self._tagged_by)
        self._kill_children()
        self._forget_clients()
        self._relay.close(self._router.end)
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def _timeout(self) -> float | None:
        due = super()._timeout()
        return _TICK_S if due is None else min(due, _TICK_S)

    def _due(self) -> None:
        super()._due()
        now = time.monotonic()
        if now - self._looked_at >= _TICK_S:
            self._looked_at = now
            self._relay.expire()
            self._remember_children(watch=True)

    # -- stopping --------------------------------------------------------------------------
    def _kill(self) -> None:
        """Kill mpirun's group, and mpirun's children that left it (its ssh clients)."""
        self._remember_children()
        super()._kill()
        self._kill_children()

    def _remember_children(self, *, watch: bool = False) -> None:
        """Remember mpirun's children; with ``watch`` (the reading thread's tick), watch its new ssh clients too."""
        for pid in _children_of(self._proc.pid):
            if pid not in self._children:
                self._children[pid] = _start_time(pid)
                if watch:
                    self._watch_client(pid)

    def _watch_client(self, pid: int) -> None:
        """Watch ``pid`` when it is one of mpirun's ssh clients (its argv names a host of the plan): note when it ends."""
        if self._selector is None or self._ended_at is not None:
            return
        try:
            words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            return
        hosts = set(self._plan.topology.hosts)
        host = next((w.decode(errors="replace") for w in words[1:] if w.decode(errors="replace") in hosts), None)
        if host is None or Path(words[0].decode(errors="replace")).name != "ssh":
            return
        with contextlib.suppress(OSError, AttributeError):  # pidfd_open: Linux 5.3
            fd = os.pidfd_open(pid)
            self._clients[fd] = host
            self._selector.register(fd, selectors.EVENT_READ, self._client_ended)

    def _client_ended(self, fd: int) -> None:
        """One of mpirun's ssh clients ended: while mpirun runs and poprun has not begun to stop it, its host is the suspect."""
        host = self._clients.pop(fd)
        if self._selector is not None:
            self._selector.unregister(fd)
        os.close(fd)
        if self._ended_at is None and not self._stopping:
            self._clients_ended.append(host)

    def _forget_clients(self) -> None:
        for fd in list(self._clients):
            if self._selector is not None:
                with contextlib.suppress(KeyError, ValueError):
                    self._selector.unregister(fd)
            os.close(fd)
        self._clients.clear()

    def _kill_children(self, *, adopted: bool = True) -> None:
        """
        Kill mpirun's children seen (its ssh clients, its instances' groups), and with ``adopted`` what poprun adopted.

        mpirun puts each instance in a process group of its own, out of reach of the
        watchdog's group: a process an instance started in the background outlives it, and,
        poprun being a subreaper, is re-parented to poprun when the instance ends; so are the
        relay processes of this machine's instances (:mod:`poprun.backends.mpirun.mpirelay`), which
        are killed only once their connections are read to the end.
        """
        since, own = self._watchdog.started, os.getpgrp()
        known = {self._proc.pid, self._watchdog.pid}
        found = dict(self._children)
        for _ in range(3):  # a killed process's children are re-parented to poprun in turn
            if adopted and watchdog_module._subreaper:  # noqa: SLF001 - only then are poprun's new children orphans of the launch
                found |= {pid: started for pid in _children_of(os.getpid())
                          if pid not in known and (started := _start_time(pid)) >= since}
            if not found:
                return
            for pid, started in found.items():
                if started and _start_time(pid) == started:
                    with contextlib.suppress(OSError):
                        group = os.getpgid(pid)
                        if group != own:  # its instance's group (mpirun gives each its own), or its own
                            os.killpg(group, signal.SIGKILL)
                        os.kill(pid, signal.SIGKILL)
                with contextlib.suppress(OSError):
                    os.waitpid(pid, os.WNOHANG)  # re-parented to poprun (a subreaper): reap it
            known |= found.keys()
            found = {}

    def _instance_lost(self, index: int) -> None:
        """Take the news that the connection of instance ``index`` broke for want of an answer: its host is gone."""
        host = self._plan.instances[index].host
        self._host_lost(host, f"poprun's connection to instance {index} on {host} got no answer")

    def _host_at(self, name: str) -> str:
        """Return the plan's host that ``name`` is, when it is the address an instance's connection came from (ssh names addresses)."""
        if name in self._plan.topology.hosts:
            return name
        found = next((self._plan.instances[i].host for i, peer in self._relay.peers.items() if peer == name), None)
        return found or ssh_host_named(name, self._plan.topology.hosts, self._ssh_args)

    def _host_lost(self, host: str, how: str) -> None:
        if host not in self._lost:
            self._lost[host] = how
            self.terminate(self._grace_s)

    # -- mpirun's own words ------------------------------------------------------------------
    def _pass_on(self, pieces: list[Piece]) -> None:
        self._tagged_by.update(index for index, _, _ in pieces if index is not None)
        if self._held and self._started():
            self._release()
        super()._pass_on(pieces)

    def _own(self, stream: Stream, data: bytes) -> None:
        """
        Take mpirun's own words (and its ssh clients'): passed on as they are, once an instance has started.

        Until then its stderr is held back: if mpirun fails before starting any instance, the
        diagnostic that says why replaces its page of advice. Once a host is lost, PR411 says
        what happened, and mpirun's stderr (the trouble of its teardown) is no longer shown.
        """
        if stream == "stderr":  # mpirun's messages: kept to find the failing instance in
            self._messages += data
            del self._messages[:-_OWN_TEXT]
            for host, how in lost_hosts(data.decode(errors="replace"), self._plan):
                self._host_lost(self._host_at(host), how)
            if self._lost:  # what mpirun says while it is stopped for a lost host (its own teardown's trouble)
                return
            if not self._started():
                self._held += data
                if len(self._held) <= _OWN_TEXT:
                    return
                data, self._held = bytes(self._held), bytearray()
        self._release()
        super()._own(stream, data)

    def _started(self) -> bool:
        """Return whether an instance has started: its wrapper connected, or its output came through mpirun."""
        return bool(self._tagged_by or self._relay.started)

    def _release(self) -> None:
        """Pass on mpirun's messages held back while no instance had started."""
        if self._held:
            held, self._held = bytes(self._held), bytearray()
            super()._own("stderr", held)

    def _make_result(self, code: int, *, stopped: bool) -> ApplyResult:
        """
        Return the result: the instance mpirun names as failing first is the root cause, the others stopped.

        Raises:
            DiagnosticError: PR411 when a host stopped answering; when nothing started, mpirun's
                own failure (PR412, PR421-PR423).
        """
        text = self._messages.decode(errors="replace")
        if code != 0 and self._started() and lost_daemon(text) and not self._lost:  # a daemon's ssh ended
            if self._clients_ended:  # a host whose ssh client of mpirun ended: those that do not greet, else the first
                ended = list(dict.fromkeys(self._clients_ended))
                silent = [host for host in ended if not greets(host, self._ssh_args, timeout_s=_GREET_S)]
                for host in silent or ended[:1]:
                    self._lost[host] = f"mpirun's ssh connection to {host} ended, and mpirun lost its daemon there"
            for index in sorted(self._silent) if not self._lost else ():  # else: the instances that fell silent
                host = self._plan.instances[index].host
                self._lost.setdefault(host, f"mpirun lost its daemon on {host}, and instance {index} there fell silent")
        if self._lost:
            raise HostLostError([host_lost(host, how, self._plan) for host, how in self._lost.items()], hosts=list(self._lost))
        if code != 0 and not stopped and not self._started():
            raise DiagnosticError([startup_failure(text, code, self._plan, named=self._host_at)])
        hosts = [i.host for i in self._plan.instances]
        if self._relay.lost and not stopped:  # output lost for good: the run cannot be taken for a success
            # (once poprun stops the launch, what the instances had left to say is cut short anyway)
            raise DiagnosticError(output_lost(self._relay.lost, hosts, self._relay.reconnect_s))
        self._release()
        count = len(self._plan.instances)
        found = parse_failure(text) if code != 0 else None
        if code == 0:
            ends = [InstanceEnded(index=i, pid=self._proc.pid, exit_code=0) for i in range(count)]
        elif found is not None and 0 <= found[0] < count and not stopped:
            first, exit_code, sig = found
            ends = [InstanceEnded(index=first, pid=self._proc.pid, exit_code=exit_code, signal=sig)]
            ends += [InstanceEnded(index=i, pid=self._proc.pid, signal=signal.SIGTERM, stopped=True)
                     for i in range(count) if i != first]
        else:  # stopped by poprun, or a failure mpirun did not pin on one instance: it is mpirun's own status
            ends = [InstanceEnded(index=0, pid=self._proc.pid, stopped=stopped, signal=-code if code < 0 else None,
                                  exit_code=code if code >= 0 else None)]
            ends += [InstanceEnded(index=i, pid=self._proc.pid, signal=signal.SIGTERM, stopped=True)
                     for i in range(1, count)]
        gated = False
        for end in ends:  # mpirun tore its instances down itself: the gate is awaited before the others' ends
            self._event(end)
            if end.status != 0 and not gated:
                gated = True
                self._await_gate()
        result = self._result_of(ends)
        warnings = [relay_refused(self._relay.refused)] if self._relay.refused else []
        if self._tagged_by - self._relay.started:
            warnings.append(through_mpirun(sorted(self._tagged_by - self._relay.started), hosts))
        return evolve(result, warnings=result.warnings + tuple(warnings)) if warnings else result


def _children_of(pid: int) -> list[int]:
    """Return the pids of ``pid``'s children (every thread's), or [] when it is gone."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.scandir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                found += [int(child) for child in Path(task.path, "children").read_text().split()]
    return found


def _start_time(pid: int) -> int:
    """Return when ``pid`` started (clock ticks after boot), or 0 when it is gone or a zombie."""
    return start_time(pid, zombie=False) or 0


class _Wrap:
    """The relay wrapper of each app context (see :mod:`poprun.backends.mpirun.mpirelay`)."""

    def __init__(self, *, local: frozenset[str], merge: bool, keepalive_s: float) -> None:
        self.forward: tuple[str, ...] = (RELAY_VARIABLE,)
        self._local, self._merge, self._keepalive_s = local, merge, keepalive_s

    def words(self, instance: Instance) -> list[str]:
        return relay_words(instance.index, local=instance.host in self._local, merge=self._merge,
                           keepalive_s=self._keepalive_s)


class MpirunBackend:
    """Runs the plan with OpenMPI's ``mpirun``: every host, this one too, through mpirun's own launch."""

    name: ClassVar[str] = "mpirun"
    capabilities: ClassVar[frozenset[str]] = frozenset({PROCESSES})  # mpirun itself finds a missing directory

    def __init__(self, *, grace_s: float = DEFAULT_GRACE_S, remote: Callable[[], HostCommands] | None = None) -> None:
        self.grace_s = grace_s
        self._remote = remote  # how other hosts are reached for run_on_host (the registry's: the ssh backend's way)
        self._reach: HostCommands | None = None
        self._reach_lock = threading.Lock()  # commands run at once on several hosts (the health check) make it once

    def run_on_host(self, host: str, script: str, *, environ: Mapping[str, str],
                    timeout_s: float) -> tuple[int, bytes]:
        """
        Run ``script`` on ``host``: here when it is this machine, else as the ssh backend does (mpirun's daemons use ssh too).

        Raises:
            LaunchError: when the host cannot be reached, or no way to reach other hosts was given.
        """
        if is_this_machine(host):
            from poprun.process.hostscript import run_here

            return run_here(script, environ=environ, timeout_s=timeout_s)
        if self._remote is None:
            raise launch_error("PR439", "command could not run on a host",
                               detail=f"cannot run a command on {host}: this mpirun backend was made without a way "
                                      "to reach other hosts", span=SourceSpan.environment(f"host {host}"),
                               hint="make the backend with remote= (the registry's mpirun backend reaches other "
                                    "hosts as the ssh backend does)")
        with self._reach_lock:
            if self._reach is None:
                self._reach = self._remote()
            reach = self._reach
        return reach.run_on_host(host, script, environ=environ, timeout_s=timeout_s)

    def describe(self, plan: LaunchPlan) -> str:
        """Return the ``mpirun command: ...`` line of ``poprun plan``: the command as it runs, secrets masked."""
        return render_explained(plan, in_allocation=bool(os.environ.get("SLURM_JOB_ID")))

    def launch(self, plan: LaunchPlan, *, env_source: Mapping[str, str], sink: OutputSink,
               cache: TemporaryCache | None = None, gate: Gate | None = None) -> MpirunLaunch:
        """
        Start mpirun with the plan's command; return without waiting.

        mpirun stops the other instances itself after a failure; ``gate`` is awaited once the
        failure is told, before the other instances' ends are (:data:`~poprun.backends.base.Gate`).

        ``cache``, when to be removed at the end, is removed on this machine (and by the
        watchdog should poprun die); mpirun neither makes nor removes it on other hosts.

        Raises:
            LaunchError: 125 when ``mpirun`` is not on PATH (PR420) or cannot be started.
        """
        source = dict(env_source)
        mpirun = which("mpirun", source.get("PATH", os.defpath))
        if mpirun is None:
            raise LaunchError("mpirun not found", diagnostics=(mpirun_missing(),))
        settings = mpirun_settings(plan.mpi.global_args, source, host_timeout_s=host_timeout(plan))
        local = frozenset(local_names())
        relay = Relay(count=len(plan.instances), remote=any(i.host not in local for i in plan.instances),
                      keepalive_s=settings.host_timeout_s)
        try:
            wrap = _Wrap(local=local, merge=settings.merge, keepalive_s=settings.host_timeout_s)
            # Called "mpirun", not by its path: OpenMPI takes an absolute argv[0] for --prefix and would put
            # its own bin and lib directories first on the instances' PATH and LD_LIBRARY_PATH.
            argv = mpirun_command(evolve(plan, mpi=evolve(plan.mpi, global_args=settings.global_args)),
                                  mpirun="mpirun", environ=source, wrap=wrap)
            remove = directories_to_remove(cache)
            router = Router(plan, sink)  # every instance's output comes here: the router writes --output-filename's files
        except BaseException:
            relay.close(lambda *_: None)
            raise
        env = source | settings.env | {RELAY_VARIABLE: relay.variable}
        try:
            # mpirun passes its stdin on to rank 0 (instance 0) alone, and /dev/null to the others
            proc, watchdog = start_launcher(argv, env=env, group_env=source, remove=remove, router=router,
                                            executable=mpirun, stdin=forwarded_stdin())
        except BaseException:
            relay.close(lambda *_: None)
            raise
        return MpirunLaunch(plan, proc, watchdog=watchdog, router=router, sink=sink, grace_s=self.grace_s,
                            relay=relay, ssh_args=settings.ssh_args, remove=remove, gate=gate)
