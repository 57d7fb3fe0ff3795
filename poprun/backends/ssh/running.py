"""
The ssh backend's running launch: sessions started after the preflight, heartbeats, stops, restarts, lost hosts.

Layer: ``poprun.backends``; imports the ssh backend's :mod:`.client`, :mod:`.remote` and
:mod:`.preflight`, :mod:`poprun.process` (watchdogs, the supervisor, the router) and
``poprun.planner.plan``.

The local ssh clients are spared SIGTERM, so that a graceful stop reaches the remote program
instead of cutting its connection: the clients live in a process group of their own, led by a
second watchdog, which gets SIGKILL but never SIGTERM. So no remote process survives a failure,
a Ctrl-C or the death of poprun.
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

from poprun.backends.base import Event, Gate, OutputSink, Restarter, TemporaryCache
from poprun.backends.ssh.client import SshClient, _send
from poprun.backends.ssh.preflight import _connect, _Sessions, preflight_budget
from poprun.backends.ssh.relay import Routes, relays
from poprun.backends.ssh.remote import environment_input, remote_command, signal_line, stdin_command
from poprun.core.diagnostic import launch_error
from poprun.core.localhost import is_this_machine
from poprun.core.record import evolve
from poprun.core.span import SourceSpan
from poprun.core.threads import start_thread
from poprun.planner.plan import LaunchPlan
from poprun.process.instance import (
    DEFAULT_GRACE_S,
    abandon,
    directories_to_remove,
    ensure_open_files,
    executable,
    forwarded_stdin,
    helper_failed,
    start_instance,
)
from poprun.process.output import Router
from poprun.process.supervisor import LocalLaunch, Respawn
from poprun.process.watchdog import Watchdog, WatchdogError

SESSIONS_PER_CONNECTION = 8  # sshd's MaxSessions is 10 by default: room for instance 0's stdin session and a check


def start(plan: LaunchPlan, envs: list[dict[str, str]], source: dict[str, str], client: SshClient,
          sink: OutputSink, *, timeout_s: float, cache: TemporaryCache | None,
          restarter: Restarter | None = None, grace_s: float = DEFAULT_GRACE_S, gate: Gate | None = None) -> LocalLaunch:
    """
    Connect, check every host, then start every instance of ``plan`` through ``client``; return without waiting.

    Length: one launch's steps in their order, each undone on a failure; the parts are the
    functions below.

    Raises:
        PreflightError: when any host cannot run the plan (nothing has started).
        LaunchError: when an instance on this machine cannot start.
    """
    budget = preflight_budget(plan.backend.given_settings(), timeout_s)  # the plan's settings, not the shell's
    remote = frozenset(i.index for i in plan.instances if not is_this_machine(i.host))
    ensure_open_files(len(plan.instances) + len(remote))  # a remote one: its session and the stdin copy
    client.routes = _routes(plan, client, _relay_mode(plan.backend.given_settings()))
    slots = _slots(plan, client.routes)
    remove = directories_to_remove(cache)
    tell: Callable[[Event], None] | None = getattr(sink, "event", None)
    # first: should poprun die from here on, the watchdog removes the directories and the connections
    watchdog, clients = _watchdogs((*remove, client.directory), source)
    _connect(plan, client, _shared_connections(plan, slots, client.routes), budget, guards=(clients, watchdog),
             tell=tell)
    router = Router(plan, sink)
    procs: dict[int, subprocess.Popen[bytes]] = {}
    try:
        inputs = {index: environment_input(plan.instances[index], envs[index]) for index in sorted(remote)}
        made = remove[0] if remove else None  # the temporary cache made here (by record), to make on the hosts
        stdin = forwarded_stdin() if 0 in remote else None  # instance 0 reads poprun's stdin (mpirun's way)
        stdin_directory = f"/tmp/poprun-stdin-{os.urandom(6).hex()}" if stdin is not None else None  # noqa: S108
        commands = _commands(plan, remote, made, timeout_s, stdin_directory)
        sessions = _Sessions(procs, inputs, budget_s=budget, window=client.window)
        sessions.open(plan, commands, client=client, slots=slots, env=source, group=clients.group)
        sessions.check(plan, tell=tell)
        for instance, env in zip(plan.instances, envs, strict=True):
            if instance.index not in remote:
                procs[instance.index] = start_instance(instance, env, executable(instance, env), watchdog.group)
        watchdog.await_ready()
        clients.await_ready()
    except BaseException as exc:  # an interrupt too: nothing of the launch is left
        clients.close()
        abandon(watchdog, list(procs.values()), router)
        if isinstance(exc, OSError):
            raise helper_failed(exc, "ssh", f"cannot start ssh: {exc.strerror}") from exc
        raise
    ordered = [procs[i] for i in range(len(plan.instances))]
    sessions.go(router, tell=tell)
    beat = _Heartbeat(procs, sorted(remote), interval_s=timeout_s / 3)
    feeder = _feed(client, plan.instances[0].host, stdin, stdin_directory, env=source, group=clients.group)

    def stop(sig: int) -> None:
        if sig == signal.SIGKILL:
            clients.signal(signal.SIGKILL)  # the remote wrappers see their input end, and kill
            return
        line = signal_line(sig)  # stop, continue, end, or a forwarded signal (--signal's)
        for index in sorted(remote):
            _send(procs[index], line)

    def finish() -> None:
        beat.stop()
        clients.close()
        if feeder is not None:
            feeder.wait()
        for index in sorted(remote):
            with contextlib.suppress(OSError, ValueError):
                if procs[index].stdin is not None:
                    procs[index].stdin.close()  # type: ignore[union-attr]
        client.close()

    respawn = None if restarter is None else _respawner(
        plan, envs, procs, client=client, slots=slots, remote=remote, cache=made, timeout_s=timeout_s, env=source,
        groups=(clients.group, watchdog.group))
    return LocalLaunch(plan, ordered, watchdog=watchdog, router=router, sink=sink, grace_s=grace_s,
                       remove=remove, stop=stop, remote=remote, finish=finish,
                       lost=_lost(plan, client, remote, slots), restarter=restarter,
                       respawn=respawn, gate=gate)



def _slots(plan: LaunchPlan, routes: Routes | None = None) -> dict[int, int]:
    """Return the connection slot of each remote instance's session: its place among those of its host (of its relay), in groups."""
    seen: dict[str, int] = {}
    slots = {}
    for instance in plan.instances:
        if not is_this_machine(instance.host):
            via = routes.host(instance.host) if routes is not None else instance.host
            place = seen.get(via, 0)
            seen[via] = place + 1
            slots[instance.index] = place // SESSIONS_PER_CONNECTION
    return slots


def _routes(plan: LaunchPlan, client: SshClient, how: str) -> Routes:
    """Return how the launch of ``plan`` reaches each remote host (directly, or through a relay: ``how``, POPRUN_SSH_RELAY)."""
    remote = [instance.host for instance in plan.instances if not is_this_machine(instance.host)]
    return Routes(relays(list(dict.fromkeys(remote)), how), client.base)


def _shared_connections(plan: LaunchPlan, slots: dict[int, int], routes: Routes) -> list[tuple[str, int]]:
    """
    Return the (host, slot) connections to open first: every remote host's (the relays', for their leaves), in plan order.

    One key exchange then serves all the sessions of a host: the preflight's check and the
    instance's run are one session, the stdin copy and a restarted instance more, and the
    topology probe's, when it ran, was on the same connection.
    """
    return list(dict.fromkeys((routes.host(plan.instances[index].host), slot) for index, slot in slots.items()))


def _lost(plan: LaunchPlan, client: SshClient, remote: frozenset[int],
          slots: dict[int, int]) -> Callable[[int, bool], str | None]:
    """
    Return the launch's ``lost(index, stopped)``, asked when a remote session ends with ssh's 255: the host that stopped answering, or None.

    The instance's host when its connection went; its relay when the relay's connection went;
    a leaf whose relay's connection is up when a new session through the relay cannot reach
    it (:meth:`SshClient.answers`): the relay's ssh to the leaf failed, as a direct host's
    connection would have. A program that exits with 255 itself is no lost host. A leaf is
    not asked after poprun began stopping the launch (``stopped``): it is no root cause then,
    and every leaf's program exiting 255 on SIGTERM would cost a session each, one at a time.
    """
    gone: set[str] = set()  # leaves found lost: their other instances need not ask again
    _, _, host_timeout_s, connect_timeout_s = client.settings

    def lost(index: int, stopped: bool) -> str | None:
        host = plan.instances[index].host
        if index not in remote:
            return None
        if not client.connected(host, slot=slots[index]):
            return client.routes.host(host)
        if host not in client.routes.via or (stopped and host not in gone):
            return None
        if host in gone or not client.answers(host, slot=slots[index],
                                              timeout_s=max(host_timeout_s, connect_timeout_s + 5)):
            gone.add(host)
            return host
        return None

    return lost


def _respawner(plan: LaunchPlan, envs: list[dict[str, str]], procs: dict[int, subprocess.Popen[bytes]], *,
               client: SshClient, slots: dict[int, int], remote: frozenset[int], cache: str | None, timeout_s: float,
               env: dict[str, str], groups: tuple[int, int]) -> Respawn:
    """
    Return the :data:`~poprun.process.supervisor.Respawn` of a launch: an instance of this machine as it first started, a remote one in a new session.

    The new session goes through the host's shared connection, reads its variables (the
    restarter's added) and "G" at once from its input, never from its command line, and runs
    no check (its host passed). It reads ``/dev/null``. It may make the temporary cache again,
    as a host's first instance does: should the failed run have been the last of its host to
    end, its wrapper removed it (its content is then lost); the new run holds its lock while it
    runs, so the cache is not removed under it, and the last instance of the host to end removes it.
    ``procs`` (the launch's sessions, by index, which the heartbeat and the stops read) gets
    the new session once its input is written. ``cache``: the temporary cache made here (None:
    none); ``env``: the launching environment (ssh's); ``groups``: the process groups of the
    ssh sessions and of the launch (this machine's instances).
    """

    def respawn(index: int, variables: Mapping[str, str]) -> subprocess.Popen[bytes]:
        instance, environ = plan.instances[index], envs[index] | dict(variables)
        if index not in remote:
            return start_instance(instance, environ, executable(instance, environ), groups[1], restart=True)
        again = evolve(instance, env=evolve(instance.env, set=tuple(sorted((dict(instance.env.set) | dict(variables)).items()))))
        command = remote_command(again, cache=cache, cache_instances=(index,), host_timeout_s=timeout_s, check=False)
        data = environment_input(again, environ) + b"G\n"
        try:
            proc = subprocess.Popen(  # noqa: S603 - ssh with the plan's command
                client.argv(instance.host, command, slot=slots[index]), stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, process_group=groups[0])
        except OSError as exc:
            raise helper_failed(exc, "ssh", f"cannot start ssh: {exc.strerror}") from exc
        _write_input(proc, data, timeout_s=timeout_s)
        old = procs.get(index)
        if old is not None and old.stdin is not None:
            with contextlib.suppress(OSError):
                old.stdin.close()
        procs[index] = proc
        return proc

    return respawn


def _write_input(proc: subprocess.Popen[bytes], data: bytes, *, timeout_s: float) -> None:
    """Write ``data`` to a new session's input, for ``timeout_s`` at most (then the session is killed: it ends failed)."""
    assert proc.stdin is not None
    fd = proc.stdin.fileno()
    os.set_blocking(fd, False)
    view, deadline = memoryview(data), time.monotonic() + timeout_s
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_WRITE)
        while view and time.monotonic() < deadline:
            if not selector.select(max(0.0, deadline - time.monotonic())):
                continue
            try:
                view = view[os.write(fd, view[:65536]):]
            except BlockingIOError:
                continue
            except OSError:  # the session is gone: its end says why
                return
    if view:
        proc.kill()


def _feed(client: SshClient, host: str, stdin: int | None, directory: str | None, *, env: Mapping[str, str],
          group: int) -> subprocess.Popen[bytes] | None:
    """Start the session that copies ``stdin`` (poprun's) to instance 0's FIFO in ``directory`` on ``host``, or None."""
    if stdin is None or directory is None:
        return None
    try:
        return subprocess.Popen(client.argv(host, stdin_command(directory)), stdin=stdin,  # noqa: S603 - our own
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, process_group=group)
    except OSError:  # no copy of stdin: instance 0 waits for it until the launch ends
        return None


def _watchdogs(remove: tuple[str, ...], env: Mapping[str, str]) -> tuple[Watchdog, Watchdog]:
    """
    Return the launch's watchdog (which removes ``remove`` should poprun die) and its ssh sessions' own.

    The sessions' group gets SIGKILL, never SIGTERM: see the module docstring.

    Raises:
        LaunchError: when a watchdog cannot start.
    """
    try:
        watchdog = Watchdog(remove=remove, env=env)
    except WatchdogError as exc:
        raise helper_failed(exc, "the watchdog") from exc
    try:
        return watchdog, Watchdog(env=env)
    except WatchdogError as exc:
        watchdog.close()
        raise helper_failed(exc, "the watchdog") from exc


def _commands(plan: LaunchPlan, remote: frozenset[int], cache: str | None, timeout_s: float,
              stdin_directory: str | None) -> dict[int, str]:
    """Return the :func:`remote_command` of each remote instance, by index (instance 0 with ``stdin_directory``)."""
    on_host: dict[str, list[int]] = {}
    for index in sorted(remote):
        on_host.setdefault(plan.instances[index].host, []).append(index)
    return {index: remote_command(plan.instances[index], cache=cache, cache_instances=on_host[plan.instances[index].host],
                                  host_timeout_s=timeout_s, stdin_directory=stdin_directory if index == 0 else None)
            for index in sorted(remote)}


def _relay_mode(env: Mapping[str, str]) -> str:
    """
    Return ``POPRUN_SSH_RELAY`` (:func:`poprun.backends.ssh.relay.mode`).

    Raises:
        LaunchError: for a value that is not auto, on or off.
    """
    from poprun.backends.ssh.relay import mode

    try:
        return mode(env)
    except ValueError as exc:
        raise launch_error("PR225", "invalid setting", detail=str(exc), span=SourceSpan.env("POPRUN_SSH_RELAY"),
                           hint="set POPRUN_SSH_RELAY to auto, on or off, or unset it") from None


class _Heartbeat:
    """
    Sends "H" to every remote session every ``interval_s`` seconds, until :meth:`stop`.

    A remote wrapper that hears nothing for three intervals takes the link to poprun as lost and
    kills its program: so no instance outlives a launch that cannot reach it any more.
    """

    def __init__(self, procs: Mapping[int, subprocess.Popen[bytes]], indices: Sequence[int], *,
                 interval_s: float) -> None:
        self._procs, self._indices, self._interval_s = procs, tuple(indices), interval_s  # procs: read at each beat
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._run, name="poprun-heartbeat", daemon=True)
        if self._indices:
            start_thread(self._thread)

    def _run(self) -> None:
        while not self._stopped.wait(self._interval_s):
            for index in self._indices:
                proc = self._procs[index]  # an instance started again: its new session
                if proc.returncode is None:
                    _send(proc, b"H\n")

    def stop(self) -> None:
        """Send no more heartbeats; return once none is being sent (the sessions' pipes may then close)."""
        self._stopped.set()
        if self._thread.is_alive():
            self._thread.join()
