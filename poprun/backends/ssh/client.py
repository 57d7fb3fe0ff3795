"""
The OpenSSH client as poprun runs it (:class:`SshClient`): batch mode, a connect timeout, one shared connection per host.

Layer: ``poprun.backends``; imports :mod:`poprun.process` (private directories,
watchdogs), the ssh backend's :mod:`.fanout` and :mod:`.relay`, and :mod:`poprun.backends.base`;
no other module of the ssh backend.

Every ssh of poprun (a launch, the topology probe, a command run on a host) goes through a
client: ``POPRUN_SSH_CONFIG`` names an ``ssh_config`` file to use (``-F``), else the user's own
is. A host's shared connections (``ControlMaster``) are opened in the fan-out window and closed
by :meth:`SshClient.close`, which leaves no ssh process and no control directory behind.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import subprocess
import time
from collections.abc import Mapping, Sequence

from poprun.backends.ssh.fanout import Connected, default_window, open_connections
from poprun.backends.ssh.relay import Routes
from poprun.core.diagnostic import launch_error
from poprun.core.span import SourceSpan
from poprun.process.files import private_directory, remove_directories
from poprun.process.watchdog import Watchdog, WatchdogError

SSH_CONFIG = "POPRUN_SSH_CONFIG"
CONNECT_TIMEOUT_S = 3  # ssh's ConnectTimeout
CONTROL_PERSIST_S = 30  # how long a host's shared connection outlives its last use, should poprun die
HOST_TIMEOUT = "POPRUN_HOST_TIMEOUT"  # seconds without an answer before a host is declared lost
DEFAULT_HOST_TIMEOUT_S = 15.0
_SSH_FAILED = 255  # ssh's status when it, not the remote command, failed


def ssh_options(*, config: str | None = None, ssh: str = "ssh", host_timeout_s: float = DEFAULT_HOST_TIMEOUT_S,
                connect_timeout_s: float = CONNECT_TIMEOUT_S) -> list[str]:
    """
    Return the OpenSSH client and the options every ssh of poprun runs with (launches, probes).

    Batch mode (never a prompt), a connect timeout, keep-alives that end the connection after
    ``host_timeout_s`` without an answer, and ``-F config`` when given (``POPRUN_SSH_CONFIG``).
    """
    alive = max(1, round(host_timeout_s / 3))  # three unanswered keep-alives and the connection ends
    return [ssh, *(["-F", config] if config else []), "-o", "BatchMode=yes",
            "-o", f"ConnectTimeout={max(1, round(connect_timeout_s))}", "-o", f"ServerAliveInterval={alive}",
            "-o", "ServerAliveCountMax=3"]


class SshClient:
    """
    The OpenSSH client as poprun runs it: batch mode, a connect timeout, shared connections per host.

    ``config`` is an ``ssh_config`` file (``-F``), or None for the user's own. A host's sessions
    share its connections, :data:`SESSIONS_PER_CONNECTION` at most each (``slot`` k is the
    host's k-th connection): sshd refuses more sessions than its ``MaxSessions`` (10 by default)
    on one connection, and ssh's fallback would print its complaints into an instance's output.
    """

    def __init__(self, *, config: str | None = None, ssh: str = "ssh",
                 host_timeout_s: float = DEFAULT_HOST_TIMEOUT_S, connect_timeout_s: float = CONNECT_TIMEOUT_S,
                 guarded: Mapping[str, str] | None = None) -> None:
        # the sockets: DIR/%C.k (40 hex digits and a slot) and ssh's temporary suffix (17) in 107 bytes
        self.directory = private_directory("poprun-ssh-", max_length=107 - 1 - 40 - 3 - 17)
        # guarded (the environment, for a client used before a launch, which has a watchdog of its own): a
        # watchdog that removes the directory should poprun die meanwhile
        self._guard: Watchdog | None = None
        if guarded is not None:
            try:
                self._guard = Watchdog(remove=(self.directory,), env=guarded)
            except WatchdogError:
                remove_directories([self.directory])
                raise
        self._base = ssh_options(config=config, ssh=ssh, host_timeout_s=host_timeout_s,
                                 connect_timeout_s=connect_timeout_s)
        self.base = ssh_options(config=config, host_timeout_s=host_timeout_s,  # what a relay's ssh runs with
                                connect_timeout_s=connect_timeout_s)
        self._used: set[tuple[str, int]] = set()  # (host, slot) of every connection that may be open
        self.settings = (config, ssh, host_timeout_s, connect_timeout_s)  # what a launch may reuse it for
        self.closed = False  # closed: its connections are gone, its directory too
        self.ahead_s = 0.0  # time spent opening connections ahead of the launch (SshBackend.prepare)
        self.window = default_window()  # how many connections are opened at once (POPRUN_SSH_FANOUT: the caller's)
        self.routes = Routes({}, self._base)  # how each host is reached (a launch through relays sets them)
        self.connections: dict[str, Connected] = {}  # how each host's connection was opened
        self.unreachable: dict[str, tuple[int, str]] = {}  # hosts that could not be connected to, and why

    def forget_failures(self, hosts: Sequence[str]) -> None:
        """Let ``hosts`` be tried again: what stopped them before (a key not yet copied there) may hold no longer."""
        for host in hosts:
            self.unreachable.pop(host, None)

    def _options(self, slot: int) -> list[str]:
        """Return the options common to every use of connection ``slot`` of a host."""
        return [*self._base, "-o", f"ControlPath={self.directory}/%C" + (f".{slot}" if slot else "")]

    def connect(self, connections: Sequence[tuple[str, int]], *, timeout_s: float,
                window: int | None = None) -> dict[str, tuple[int, str]]:
        """
        Open the (host, slot) connections, ``window`` at a time (:mod:`.fanout`); return ``{host: (ssh's status, its error text)}`` of failures.

        A connection only authenticates (``-N``: no remote command, so no login shell runs);
        it stays in the background for the sessions of the launch. Each attempt may take
        ``timeout_s`` from its own start (then it fails with status -1), and one that failed in
        a way that says nothing about the host (timed out, reset) is tried again. One already
        open (by a command run on the host before the launch) is kept as it is; a host that
        failed before on this client fails again at once (a probe's failure is the launch's).
        How each host connected is added to :attr:`connections`.
        """
        connections = list(dict.fromkeys((self.routes.host(host), slot) for host, slot in connections))
        known = {host: self.unreachable[host] for host, _ in connections if host in self.unreachable}
        up = self._up([c for c in connections if c in self._used])
        todo = [c for c in connections if c[0] not in known and c not in up]
        if any(c in self._used for c in todo):  # a master died: its socket would stop the new one from sharing
            self._clear_stale()
        self._used.update(todo)

        def start(host: str, slot: int) -> subprocess.Popen[bytes]:
            return subprocess.Popen(  # noqa: S603 - ssh, options of our own
                [*self._options(slot), "-o", "ControlMaster=yes", "-o", f"ControlPersist={CONTROL_PERSIST_S}", "-f",
                 "-N", "--", host], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

        failed, opened = open_connections(start, todo, window=window or self.window, timeout_s=timeout_s)
        self.unreachable.update(failed)
        self.connections.update(opened)
        return known | failed

    def usable(self, host: str, *, slot: int = 0) -> bool:
        """Return whether shared connection ``slot`` of ``host`` (of its relay, for a leaf) is open for sessions."""
        key = (self.routes.host(host), slot)
        return key in self._up([key]) if key in self._used else False

    def _clear_stale(self) -> None:
        """
        Remove the sockets of this client's directory that no master listens on any more (one killed leaves its own).

        The directory is the one this client made for itself (:attr:`directory`, 0700, by
        ``private_directory`` in its constructor): what is in it, only this client's ssh masters put
        there. Only sockets (not followed through links) that refuse a connection are removed.
        """
        import socket

        with contextlib.suppress(OSError), os.scandir(self.directory) as entries:
            for entry in entries:
                if not stat.S_ISSOCK(entry.stat(follow_symlinks=False).st_mode):
                    continue
                with socket.socket(socket.AF_UNIX) as probe:
                    try:
                        probe.connect(entry.path)
                    except ConnectionRefusedError:  # nobody listens: a dead master's
                        with contextlib.suppress(OSError):
                            os.unlink(entry.path)  # a DirEntry's path
                    except OSError:
                        continue

    def _up(self, connections: Sequence[tuple[str, int]]) -> set[tuple[str, int]]:
        """
        Return which of ``connections`` (``(host, slot)``, opened by this client) are still up.

        Their masters' processes (or sessions through them, which end with their master; a session
        may have become the master itself) are read at once from /proc (no process started, whatever the
        count: asking each with ``ssh -O check`` costs a process a host); where /proc cannot be
        read, each is asked. A master that died (killed, or its host stopped answering its
        keep-alives) is no longer there, so its connection is opened again in the window, not
        by each session on its own (``ControlMaster=auto``: a race whose losers print ssh's
        complaint into the instances' output).
        """
        if not connections:
            return set()
        masters = _naming(self.directory)
        if masters is None:
            return {c for c in connections if self.connected(c[0], slot=c[1])}
        living = set()
        for argv in masters.values():  # a master, or a session through one (it ends when its master does)
            option = next((a for a in argv if a.startswith(b"ControlPath=")), b"")
            if (b"ControlMaster=yes" in argv or b"ControlMaster=auto" in argv) and b"--" in argv[:-1]:
                suffix = option.rsplit(b"/", 1)[-1].partition(b".")[2]
                living.add((os.fsdecode(argv[argv.index(b"--") + 1]), int(suffix) if suffix.isdigit() else 0))
        return {c for c in connections if c in living}

    def argv(self, host: str, command: str, *, slot: int = 0) -> list[str]:
        """
        Return the command line that runs ``command`` (shell text) on ``host``, through its shared connection.

        A leaf of a relay (:attr:`routes`) is reached through its relay's connection ``slot``.
        Without one yet (it closed), this session opens it and leaves it shared (``ControlMaster=auto``).
        """
        via = self.routes.host(host)
        self._used.add((via, slot))
        return [*self._options(slot), "-o", "ControlMaster=auto", "-o", f"ControlPersist={CONTROL_PERSIST_S}", "-T",
                "--", via, self.routes.command(host, command)]

    def connected(self, host: str, *, slot: int = 0, timeout_s: float = 2.0) -> bool:
        """Return whether shared connection ``slot`` of ``host`` (of its relay, for a leaf) is still up (asked of it here, not of the host)."""
        host = self.routes.host(host)
        try:
            done = subprocess.run([*self._options(slot), "-O", "check", "--", host], stdin=subprocess.DEVNULL,  # noqa: S603
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return done.returncode == 0

    def answers(self, host: str, *, slot: int = 0, timeout_s: float) -> bool:
        """
        Return whether a new session reaches ``host`` within ``timeout_s`` (a leaf: from its relay).

        Asked of a leaf whose session ended with ssh's 255 while its relay's connection is up:
        the relay's ssh to the leaf failed (the leaf stopped answering), or the program there
        exited with 255 itself; only a session that cannot be had tells the two apart.
        """
        argv = [*self._options(slot), "-o", "ControlMaster=no", "-T", "--", self.routes.host(host),
                self.routes.command(host, "exit 0")]
        try:
            done = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,  # noqa: S603
                                  stderr=subprocess.DEVNULL, timeout=timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return False
        return done.returncode != _SSH_FAILED

    def close(self, *, timeout_s: float = 2.0) -> None:
        """
        Close every host's shared connection and remove the control directory. Idempotent.

        A connection that does not close when asked (its host stopped answering: it would wait
        for its keep-alives to fail, or for the link to come back), or that is not asked within
        ``timeout_s`` (thousands of them), is killed: no ssh process of the launch outlives it.
        """
        used = sorted(self._used)
        self._used.clear()
        self.closed = True
        deadline = time.monotonic() + timeout_s
        for first in range(0, len(used), self.window):  # a window at a time: no burst of thousands of processes
            try:
                procs = [subprocess.Popen([*self._options(slot), "-O", "exit", "--", host],  # noqa: S603
                                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL)
                         for host, slot in used[first:first + self.window]]
            except OSError:  # no ssh to ask (it is gone from PATH): the connections are killed below
                break
            for proc in procs:
                try:
                    proc.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            if time.monotonic() >= deadline:
                break  # the rest are killed below
        _kill_naming(self.directory)
        remove_directories([self.directory])
        if self._guard is not None:
            self._guard.close()
            self._guard = None


def _kill_naming(directory: str) -> None:
    """SIGKILL every process whose command line names ``directory`` (poprun's own: a shared connection's socket)."""
    for pid in _naming(directory) or {}:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def _naming(directory: str) -> dict[int, list[bytes]] | None:
    """Return ``{pid: argv}`` of the living processes whose command line names ``directory``; None where /proc cannot be read."""
    needle, me, found = os.fsencode(directory) + b"/", os.getpid(), {}
    try:
        entries = os.listdir("/proc")  # pathlib is slower here
    except OSError:  # not Linux: connections end with their keep-alives, or ControlPersist
        return None
    for entry in entries:
        if entry.isdigit() and int(entry) != me:
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as file:
                    line = file.read()
            except OSError:
                continue
            if needle in line:
                found[int(entry)] = line.rstrip(b"\0").split(b"\0")
    return found


def _send(proc: subprocess.Popen[bytes], data: bytes) -> None:
    """Write ``data`` to ``proc``'s stdin without blocking; a gone session is no error."""
    pipe = proc.stdin
    with contextlib.suppress(OSError, ValueError):
        if pipe is not None:
            os.set_blocking(pipe.fileno(), False)
            os.write(pipe.fileno(), data)


def host_timeout(env: Mapping[str, str]) -> float:
    """
    Return how long a host may not answer before it is declared lost: ``POPRUN_HOST_TIMEOUT``, else 15 s.

    Raises:
        LaunchError: when the variable is not a number of seconds from 3 to 3600.
    """
    text = env.get(HOST_TIMEOUT, "").strip()
    if not text:
        return DEFAULT_HOST_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 3 <= value <= 3600:  # noqa: PLR2004 - ssh counts keep-alives in whole seconds, three per timeout
        raise launch_error("PR225", "invalid setting", detail=f"{HOST_TIMEOUT}={text!r} is not a number of seconds from 3 to 3600",
                           span=SourceSpan.env(HOST_TIMEOUT),
                           hint=f"set {HOST_TIMEOUT} to a number of seconds from 3 to 3600, or unset it (15 s)")
    return value
