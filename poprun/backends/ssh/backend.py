"""
The ``ssh`` backend: instances on other hosts through the OpenSSH client, those on this machine as children.

Layer: ``poprun.backends``; imports :mod:`poprun.backends.base`, :mod:`poprun.backends._process`,
``poprun.core`` (diagnostics) and ``poprun.planner.plan``; never the spec, never another backend. Needs ``ssh`` here and a POSIX login shell, ``sh`` and
``setsid`` (util-linux) on the hosts.

The client runs non-interactively (``BatchMode``), with a connect timeout, and with one
multiplexed connection per host (``ControlMaster``) that every instance of that host reuses
(:class:`SshClient`); ``POPRUN_SSH_CONFIG`` names an ``ssh_config`` file to use (``-F``), else
the user's own is. Before anything starts, every host is checked in parallel: each instance's
session first runs a check and waits for poprun's "G" (:class:`_Sessions`), sent only when
every host passed. A host whose name is unknown (PR405), that cannot be reached (PR406),
whose host key is not trusted (PR407), that refuses the key (PR408), or that lacks the working
directory, the program or its interpreter (PR409) is reported, each with the seed's advice
(section 2.2.1), within :data:`PREFLIGHT_S` seconds, never a hang. With ``--distribute-ssh-key``
the key is copied to every host first (:mod:`poprun.backends.ssh.sshkey`).

Each remote instance runs in the plan's working directory (section 2.2.4: the same on every
host) with the host's login environment minus ``env.unset``, plus the forwarded variables
with their values here, plus ``env.set``: every value is single-quoted for the remote shell,
so quotes, spaces, ``$(...)``, backticks, newlines and any Unicode arrive unchanged.

Teardown. On the host, :data:`_WRAPPER` runs the program in a session of its own and reads the
ssh connection's standard input: a ``T`` line sends SIGTERM to the program's whole process
group (poprun stopping the launch gracefully), and the end of input, which comes when the ssh
client here dies (killed after the grace period, or with poprun itself, even by SIGKILL, by
the launch's watchdog), sends SIGKILL. The local ssh clients are spared SIGTERM, so that
a graceful stop reaches the remote program instead of cutting its connection: the clients live in a
process group of their own, led by a second watchdog, which gets SIGKILL but never SIGTERM.
So no remote process survives a failure, a Ctrl-C or the death of poprun.
"""

from __future__ import annotations

import contextlib
import os
import re
import selectors
import shlex
import signal
import stat
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from popdist.env import EXECUTABLE_CACHE_PATH
from poprun.backends._process.files import private_directory, remove_directories
from poprun.backends._process.instance import (
    DEFAULT_GRACE_S,
    abandon,
    bound_argv,
    directories_to_remove,
    ensure_open_files,
    executable,
    forwarded_stdin,
    start_instance,
)
from poprun.backends._process.output import Router
from poprun.backends._process.supervisor import LocalLaunch, Respawn
from poprun.backends._process.watchdog import Watchdog, WatchdogError
from poprun.backends.base import (
    CHECKS_BEFORE_START,
    PROCESSES,
    RESTARTS_INSTANCES,
    Event,
    LaunchError,
    OutputSink,
    Restarter,
    TemporaryCache,
    environment,
)
from poprun.backends.ssh.fanout import Connected, default_window, open_connections, window
from poprun.backends.ssh.relay import Routes, relays
from poprun.core.diagnostic import Diagnostic, error
from poprun.core.events import HostChecked, HostConnected, PhaseEnded
from poprun.core.localhost import is_this_machine
from poprun.core.record import evolve
from poprun.core.span import SourceSpan
from poprun.planner.plan import Instance, LaunchPlan

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from typing import ClassVar

    from poprun.planner.machine import HostTopology

SSH_CONFIG = "POPRUN_SSH_CONFIG"
CONNECT_TIMEOUT_S = 3  # ssh's ConnectTimeout
PREFLIGHT_S = 4.5  # the longest the whole preflight takes (or the host timeout, when longer and set by the user)
SESSIONS_PER_CONNECTION = 8  # sshd's MaxSessions is 10 by default: room for instance 0's stdin session and a check
CONTROL_PERSIST_S = 30  # how long a host's shared connection outlives its last use, should poprun die
HOST_TIMEOUT = "POPRUN_HOST_TIMEOUT"  # seconds without an answer before a host is declared lost
DEFAULT_HOST_TIMEOUT_S = 15.0
_SSH_FAILED = 255  # ssh's status when it, not the remote command, failed
_MARK = "poprun-preflight"
_OK = f"{_MARK} ok\n".encode()  # the last line of a host's check: nothing else follows it until "G"
_MADE = ".poprun-made"  # in a temporary cache made on a host: the record that this poprun made it (holds _TOKEN)
_TOKEN = os.urandom(8).hex()  # this poprun's own: a cache is removed on a host only when its _MADE holds it
_LOCK = ".poprun-lock"  # ... and the file each instance there holds a shared lock on while it runs
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")  # a POSIX variable name: the only kind that reaches a shell
# The scripts below name their own variables __poprun_*: they run with the instance's exported
# variables, whose names are the user's, and must neither read nor change any of those.
#
# The wrapper waits for poprun's "G" (go: every host passed the preflight; anything else, or the
# end of stdin, and it exits 0 without starting anything), then runs the program ($4...) in its
# own session. Then it reads poprun's lines: "T" stops the program's group with SIGTERM, "S" and
# "C" stop and continue it (Ctrl-Z and fg: SIGSTOP, since a SIGTSTP to the program's session of
# its own, an orphaned process group, is discarded by the kernel), "H" is poprun's heartbeat; the end of stdin, or no
# line for $1 seconds while not stopped (the link to poprun is down: poprun sends "H" three
# times in that time), kills the group. Exits with the program's status (128+N: signal N).
# (`kill -TERM -PGID`, not `kill -TERM -- -PGID`: dash's kill takes no `--`.)
# With a directory $2 (not "-"), the program reads a FIFO made in it, which poprun's second
# session for the instance (:data:`_STDIN`) fills with poprun's own standard input; the wrapper
# made the directory (it fails if the directory exists), so it removes it at the end.
# With a temporary cache $3 that this poprun made on the host (its own directory, whose _MADE
# holds this poprun's _TOKEN: a record, not a name), the wrapper
# holds a shared lock on its _LOCK while the program runs, and at the end the one that gets the
# lock alone removes the cache: the last instance of the host to end, or any, when none started.
_WRAPPER = f"""\
__poprun_k=$3
__poprun_made() {{
  [ "$__poprun_k" != - ] && [ -d "$__poprun_k" ] && [ ! -h "$__poprun_k" ] && [ -O "$__poprun_k" ] &&
    [ "$(cat -- "$__poprun_k/{_MADE}" 2>/dev/null)" = {_TOKEN} ]
}}
__poprun_done() {{
  __poprun_made || return 0
  (command exec 9<"$__poprun_k/{_LOCK}" && flock -n -x 9 && rm -rf -- "$__poprun_k") 2>/dev/null
  return 0
}}
IFS= read -r __poprun_go; [ "$__poprun_go" = G ] || {{ __poprun_done; exit 0; }}
__poprun_t=$1; __poprun_f=$2; __poprun_p=$4; shift 4
command -v -- "$__poprun_p" >/dev/null 2>&1 || {{ [ -x "./$__poprun_p" ] && __poprun_p=./$__poprun_p; }}
__poprun_made && command exec 9<"$__poprun_k/{_LOCK}" && flock -s 9
exec 3<&0
if [ "$__poprun_f" = - ]; then setsid -- "$__poprun_p" "$@" </dev/null 3<&- 9<&- &
else mkdir -m 700 -- "$__poprun_f" || exit 125
  mkfifo -m 600 -- "$__poprun_f/in" || {{ rm -rf -- "$__poprun_f"; exit 125; }}
  setsid -- "$__poprun_p" "$@" <"$__poprun_f/in" 3<&- 9<&- &
fi
__poprun_c=$!
{{ __poprun_z=
  while :; do
    if [ -n "$__poprun_z" ]; then IFS= read -r __poprun_w || break; __poprun_w=x$__poprun_w
    else __poprun_w=$(timeout "$__poprun_t" sh -c 'IFS= read -r w && echo "x$w"') || break; fi
    case $__poprun_w in
      xT) kill -TERM -$__poprun_c || kill -TERM $__poprun_c;;
      xS) __poprun_z=1; kill -STOP -$__poprun_c || kill -STOP $__poprun_c;;
      xC) __poprun_z=; kill -CONT -$__poprun_c || kill -CONT $__poprun_c;;
    esac
  done
  kill -KILL -$__poprun_c || kill -KILL $__poprun_c; }} <&3 3<&- 9<&- >/dev/null 2>&1 &
__poprun_r=$!
exec 3<&- >/dev/null 2>/dev/null
wait $__poprun_c; __poprun_s=$?
kill -KILL -$__poprun_c 2>/dev/null
kill $__poprun_r 2>/dev/null
[ "$__poprun_f" = - ] || rm -rf -- "$__poprun_f"
exec 9<&-
__poprun_done
exit $__poprun_s"""
# The second session of an instance that reads poprun's standard input: once the wrapper has
# made the FIFO ($1/in, waited for 10 s at most), copy this session's input into it, only if
# the directory and the FIFO are this user's (a FIFO planted by someone else never gets a byte).
# The copy ends when the wrapper has removed the directory (its instance ended, or was killed
# for want of poprun's heartbeat): on a host cut off from poprun, its input never ends.
_STDIN = """\
__poprun_i=0
until [ -d "$1" ] && [ ! -h "$1" ] && [ -O "$1" ] && [ -p "$1/in" ] && [ ! -h "$1/in" ] && [ -O "$1/in" ]; do
  [ $__poprun_i -lt 200 ] || exit 0; sleep 0.05; __poprun_i=$((__poprun_i + 1)); done
exec 3<&0
cat <&3 > "$1/in" 3<&- &
__poprun_c=$!
exec 3<&- </dev/null
while [ -d "$1" ] && kill -0 $__poprun_c 2>/dev/null; do sleep 1; done
kill $__poprun_c 2>/dev/null
wait $__poprun_c
"""
# Reads the environment poprun sends before anything else (a count of bytes, then that many
# bytes of `export NAME='value'` lines), so that no value is ever on a command line (ps shows
# those). `head -c` reads exactly that many bytes, at once: the lines that follow are the wrapper's.
_READ_ENV = """\
IFS= read -r __poprun_n || exit 0
__poprun_e=$(head -c "$__poprun_n"; echo .) || exit 0
eval "${__poprun_e%.}"; unset __poprun_e __poprun_n"""
_LINES = {int(signal.SIGTSTP): b"S\n", int(signal.SIGCONT): b"C\n"}  # to the wrappers: stop, continue
_INTERPRETERS = ("python", "python3", "bash", "sh", "perl")


class PreflightError(LaunchError):
    """Some hosts cannot run the plan; ``diagnostics`` says which and why, one each."""

    def __init__(self, diagnostics: Sequence[Diagnostic]) -> None:
        super().__init__(f"{len(diagnostics)} host(s) cannot run the plan: "
                         + "; ".join(d.detail for d in diagnostics), diagnostics=tuple(diagnostics))


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
        self.kept = 0  # how many times it was kept for a launch to come (:func:`_park`)
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
                            os.unlink(entry.path)  # noqa: PTH108 - a DirEntry's path
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
        entries = os.listdir("/proc")  # noqa: PTH208 - pathlib is slower here
    except OSError:  # not Linux: connections end with their keep-alives, or ControlPersist
        return None
    for entry in entries:
        if entry.isdigit() and int(entry) != me:
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as file:  # noqa: PTH123
                    line = file.read()
            except OSError:
                continue
            if needle in line:
                found[int(entry)] = line.rstrip(b"\0").split(b"\0")
    return found


def remote_command(instance: Instance, *, cache: str | None = None, cache_instances: Sequence[int] = (),
                   host_timeout_s: float = DEFAULT_HOST_TIMEOUT_S, stdin_directory: str | None = None,
                   check: bool = True) -> str:
    """
    Return the shell text that checks, then (on poprun's "G") runs ``instance`` on its host.

    The text holds no value of the environment: the session reads them first from its input
    (:func:`environment_input`), so that no secret is ever on a command line. Only the names the
    plan sets or forwards are exported; the rest of the remote environment is the host's own.
    The check (:func:`_check_script`) prints what is missing, then ``ok``.

    ``cache`` is the temporary executable cache this process made (None: there is none to make
    or remove). The first instance of a host (``cache_instances``: that host's instances, the
    first of them when this is the one) makes it there if it does not exist, with a file per
    instance of the host in it, and only then is it removed, by the last instance of the host to
    end; a directory that already exists (a shared file system: the one made here) is used as it is
    and never removed there. Anything else at that path (a link, a directory of another user but
    root) fails the check: an instance never uses a cache that someone else could fill.

    ``stdin_directory``: the program reads its standard input from a FIFO that its wrapper makes
    in this new directory there, and :func:`stdin_command`'s session fills (None: /dev/null).
    Without ``check`` (an instance started again: its host passed already), the session prints
    nothing of its own and starts on "G".
    """
    lines = [_READ_ENV, f"cd -- {shlex.quote(instance.cwd)} || exit 125"]
    if instance.env.unset:
        lines.append("unset " + " ".join(shlex.quote(name) for name in instance.env.unset))
    where = "-"
    if cache is not None:
        lines.append(_cache_script(cache, first=bool(cache_instances) and cache_instances[0] == instance.index))
        where = '"$__poprun_k"'
    # the check prints in a subshell that survives a closed session (poprun killed meanwhile): the
    # wrapper must still run, to see the end of its input and remove what the first instance made
    if check:
        lines.append(f"(trap '' PIPE\n{_check_script(instance)}\n)")
    lines.append(f"sh -c {shlex.quote(_WRAPPER)} poprun-instance {host_timeout_s:g} "
                 f"{shlex.quote(stdin_directory or '-')} {where} " + shlex.join(bound_argv(instance)))
    return "\n".join(lines)


def _cache_script(cache: str, *, first: bool) -> str:
    """
    Return the lines that choose the temporary cache on a host (``$__poprun_k``) and, for its first instance, make it.

    The cache is at the path made here when its parent exists there (a shared file system: the
    very directory), else under the host's /tmp with the same name; POPDIST_EXECUTABLE_CACHE_PATH
    says which. The first instance makes it, with _LOCK and _MADE (this poprun's _TOKEN) in it, unless it exists: an
    existing directory is used as it is, and never removed there, if it is this user's (or
    root's) and not a link; anything else fails the check.
    """
    parent, name = os.path.split(cache)
    path, other = shlex.quote(cache), shlex.quote(f"/tmp/{name}")  # noqa: S108
    lines = [f"if [ -d {shlex.quote(parent or '/')} ]; then __poprun_k={path}; else __poprun_k={other}; fi",
             f"export {EXECUTABLE_CACHE_PATH}=$__poprun_k"]
    if first:
        lines.append(f'if mkdir -m 700 -- "$__poprun_k" 2>/dev/null; then : > "$__poprun_k/{_LOCK}" && '
                     f'printf %s {_TOKEN} > "$__poprun_k/{_MADE}" || echo "{_MARK} cache $__poprun_k"\n'
                     'elif [ -d "$__poprun_k" ] && [ ! -h "$__poprun_k" ] && { [ -O "$__poprun_k" ] || '
                     '{ __poprun_o=$(ls -ldn -- "$__poprun_k") && set -- $__poprun_o && [ "$3" = 0 ]; }; }; then :\n'
                     f'else echo "{_MARK} cache $__poprun_k"; fi')
    return "\n".join(lines)


def stdin_command(directory: str) -> str:
    """Return the shell text of the session that copies poprun's standard input to the FIFO in ``directory``."""
    return f"sh -c {shlex.quote(_STDIN)} poprun-stdin {shlex.quote(directory)}"


def environment_input(instance: Instance, env: Mapping[str, str]) -> bytes:
    """
    Return what a session of ``instance`` reads first: its exported variables, for :data:`_READ_ENV`.

    ``env`` is the instance's environment as it would be here (:func:`environment`); every value
    is single-quoted for the remote shell, so quotes, ``$(...)``, backticks, newlines and any
    Unicode arrive unchanged.

    Raises:
        LaunchError: for a name that is not a POSIX variable name (only a hand-made plan has one).
    """
    names = [name for name in dict.fromkeys([*instance.env.forward, *(k for k, _ in instance.env.set)]) if name in env]
    bad = next((name for name in [*names, *instance.env.unset] if not _NAME.match(name)), None)
    if bad is not None:
        raise LaunchError(f"instance {instance.index}: {bad!r} is not a variable name")
    text = "".join(f"export {shlex.quote(f'{name}={env[name]}')}\n" for name in names).encode(errors="surrogateescape")
    return b"%d\n%s" % (len(text), text)


def _check_script(instance: Instance) -> str:
    """Return the check of an instance's host: setsid, its program, and the script given to an interpreter."""
    words = [f"command -v setsid >/dev/null 2>&1 || echo '{_MARK} setsid'",
             f"command -v flock >/dev/null 2>&1 || echo '{_MARK} flock'",
             f"command -v timeout >/dev/null 2>&1 || echo '{_MARK} timeout'"]
    if instance.placement.cpus:
        words.append(f"command -v taskset >/dev/null 2>&1 || echo '{_MARK} taskset'")
    argv = instance.argv
    if argv:
        program = shlex.quote(argv[0])
        words.append(f"command -v -- {program} >/dev/null 2>&1 || [ -x ./{program} ] || "
                     f"echo '{_MARK} program '{program}")
        script = argv[1] if len(argv) > 1 else ""
        if os.path.basename(argv[0]).rstrip("0123456789.") in _INTERPRETERS and script and not script.startswith("-"):  # noqa: PTH119
            words.append(f"[ -e {shlex.quote(script)} ] || echo '{_MARK} script '{shlex.quote(script)}")
    # which machine answered: its boot and its network (one of a pair of names for one machine: PR413)
    words.append(f'echo "{_MARK} id $(cat /proc/sys/kernel/random/boot_id 2>/dev/null) '
                 f'$(readlink /proc/self/ns/net 2>/dev/null)"')
    words.append(f"echo '{_MARK} ok'")
    return "\n".join(words)


def _diagnose(host: str, status: int, out: str, err: str, cwd: str) -> Diagnostic | None:
    """Return what the preflight's answer from ``host`` (or ssh's error) says is wrong, or None."""
    said = [line.partition(_MARK + " ")[2] for line in out.splitlines() if _MARK + " " in line]  # after a greeting too
    said = [item for item in said if not item.startswith("id ")]  # which machine answered: not a problem
    if said == ["ok"]:
        return None
    if said and said[-1] == "ok":
        what = []
        for item in said[:-1]:
            kind, _, name = item.partition(" ")
            what.append({"setsid": "'setsid' (util-linux) is not installed",
                         "timeout": "'timeout' (coreutils) is not installed",
                         "flock": "'flock' (util-linux) is not installed",
                         "cache": f"the temporary executable cache {name} exists there and is not this user's "
                                  "directory, or cannot be made",
                         "taskset": "'taskset' (util-linux), which binds the instance to its CPUs, is not installed",
                         "program": f"program '{name}' is not found",
                         "script": f"'{name}' does not exist in {cwd}"}.get(kind, item))
        return _missing(host, f"on {host}: " + "; ".join(what))
    if status == 125 and not said:  # noqa: PLR2004 - remote_command's exit status for a missing cwd
        return _missing(host, f"the working directory {cwd} does not exist on {host}")
    text = " ".join(line.strip() for line in err.splitlines() if line.strip()) or f"ssh exited with {status}"
    if "Could not resolve hostname" in text or "Name or service not known" in text:
        return error("PR405", f"host name '{host}' is unknown", detail=f"ssh found no address for '{host}'",
                     span=_span(host),
                     hint="check the host name, or give its IP address (use ifconfig on the host to find it, "
                          "or add it to /etc/hosts; seed 2.2.1)")
    if "Host key verification failed" in text or "HOST IDENTIFICATION HAS CHANGED" in text:
        return error("PR407", f"host key verification failed for '{host}'", detail=text, span=_span(host),
                     hint=f"the key of {host} is not in ~/.ssh/known_hosts; poprun runs ssh non-interactively, so "
                          f"log into it once with 'ssh {host}' to accept its key (seed 2.2.1)")
    if "Permission denied" in text:
        return error("PR408", f"permission denied by '{host}'", detail=text, span=_span(host),
                     hint=f"add this host's public key to ~/.ssh/authorized_keys on {host} (ssh-copy-id, or poprun "
                          "--distribute-ssh-key); password authentication is not supported (seed 2.2.1)")
    return _unreachable(host, text)


def _unreachable(host: str, detail: str) -> Diagnostic:
    return error("PR406", f"host '{host}' cannot be reached", detail=detail, span=_span(host),
                 hint=f"check that {host} is up, runs an SSH server and is reachable from here (try 'ssh {host}'); "
                      "with several networks, --host-subnet or --mpi-global-args picks the interface (seed 2.2.3)")


def _missing(host: str, detail: str) -> Diagnostic:
    return error("PR409", f"'{host}' cannot run the program", detail=detail, span=_span(host),
                 hint="every host needs the same file system layout: the working directory, the program and its "
                      "interpreter at the same paths (a shared file system is easiest; seed 2.2.4)")


def _span(host: str) -> SourceSpan:
    return SourceSpan.environment(f"host {host}")


def _machine(answer: bytes) -> str:
    """
    Return which machine a check's ``answer`` came from (its boot id and network namespace), or "" when it did not say.

    The check's own line is the last of its kind (just before ``ok``): a login shell's greeting may hold the mark too.
    """
    for line in reversed(answer.decode(errors="replace").splitlines()):
        _, found, rest = line.partition(_MARK + " id ")
        parts = rest.split()
        if found and len(parts) == 2:  # noqa: PLR2004 - the boot id and the network namespace
            return " ".join(parts)
    return ""


def _one_machine(plan: LaunchPlan, machines: Mapping[str, str]) -> dict[str, Diagnostic]:
    """Return PR413 for each host that is a machine another host of the plan names already (``machines``: host -> id)."""
    first: dict[str, str] = {}
    problems = {}
    for host in dict.fromkeys(instance.host for instance in plan.instances):
        machine = machines.get(host, "")
        if not machine:
            continue
        if machine in first:
            other = first[machine]
            problems[host] = error(
                "PR413", f"hosts '{other}' and '{host}' are one machine", span=_span(host),
                detail="both answered from the same system (boot and network); their instances would share its "
                       "IPUs and local indexes as if they were on two machines",
                hint=f"name each machine once in --host (keep '{other}' or '{host}')")
        else:
            first[machine] = host
    return problems


class _Sessions:
    """
    The ssh sessions of a launch's remote instances, from their checks to the "G" that starts them.

    Each session first reads its environment (``inputs``: written here while the checks are
    read, so that a large one cannot block), prints its check and waits; :meth:`await_checks`
    reads every check (at most until the deadline) and returns the problems, one per host;
    :meth:`go` starts them all. Output read past a check (a login shell's greeting) is kept for
    the router.
    """

    def __init__(self, procs: dict[int, subprocess.Popen[bytes]], inputs: Mapping[int, bytes], *,
                 budget_s: float = PREFLIGHT_S, window: int = 0) -> None:
        self.procs, self._budget_s, self._window = procs, budget_s, window
        self.routes = Routes({}, [])  # how each host was reached (open() takes the client's)
        self.began = self.checked = time.monotonic()  # when the sessions were opened, and when every check was read
        self.early: dict[int, bytes] = {}  # stdout read with the check, that is not part of it
        self._inputs = {index: memoryview(data) for index, data in inputs.items() if data}

    def open(self, plan: LaunchPlan, commands: Mapping[int, str], *, client: SshClient, slots: Mapping[int, int],
             env: Mapping[str, str], group: int) -> None:
        """Start the session of each instance of ``commands`` (its :func:`remote_command`), in process group ``group``."""
        self.began, self.routes = time.monotonic(), client.routes
        for index, command in commands.items():
            self.procs[index] = subprocess.Popen(  # noqa: S603 - ssh with the plan's command
                client.argv(plan.instances[index].host, command, slot=slots[index]), stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, process_group=group)

    def await_checks(self, plan: LaunchPlan) -> list[Diagnostic]:
        """Return the problems the checks found, one per host (that of its first instance), in host order."""
        return list(self._problems(plan).values())

    def _problems(self, plan: LaunchPlan) -> dict[str, Diagnostic]:
        """Return the problem each host's checks found (that of its first instance), by host, in host order."""
        problems: dict[str, Diagnostic] = {}
        machines: dict[str, str] = {}  # host -> which machine answered its check
        answers, waited = self._read_checks()
        for index, answer in answers.items():
            instance = plan.instances[index]
            problem: Diagnostic | None
            if answer is None:
                problem = _unreachable(instance.host, f"connected, but its check did not answer within {waited:.3g} s")
            elif answer.endswith(_OK):
                problem = _diagnose(instance.host, 0, answer.decode(errors="replace"), "", instance.cwd)
                self.early[index] = _greeting(answer)
            else:  # the session ended before its check did: ssh failed, or the directory is missing
                problem = self._failure(instance, answer)
            if problem is not None and problem.code != "PR409" and instance.host in self.routes.via:
                relay = self.routes.via[instance.host]
                problem = evolve(problem, detail=f"{problem.detail} (from its relay {relay}; POPRUN_SSH_RELAY=off "
                                                 "connects to every host from here)")
            if problem is not None:
                problems.setdefault(instance.host, problem)
            elif answer is not None and (machine := _machine(answer)):
                machines.setdefault(instance.host, machine)
        for host, problem in _one_machine(plan, machines).items():
            problems.setdefault(host, problem)
        return problems

    def check(self, plan: LaunchPlan, *, tell: Callable[[Event], None] | None = None) -> None:
        """
        Read every check (at most until the deadline); ``tell`` hears each remote host's answer (a HostChecked event).

        Raises:
            PreflightError: naming each host that cannot run the plan, and why.
        """
        problems = self._problems(plan)
        self.checked = time.monotonic()
        if tell is not None and self.procs:
            tell(PhaseEnded(phase="preflight", ms=_ms_since(self.began)))
        if tell is not None:
            for host in dict.fromkeys(plan.instances[index].host for index in sorted(self.procs)):
                problem = problems.get(host)
                tell(HostChecked(host=host, ok=problem is None,
                                 problem=f"{problem.code}: {problem.summary}" if problem is not None else ""))
        if problems:
            raise PreflightError(list(problems.values()))

    def _read_checks(self) -> tuple[dict[int, bytes | None], float]:
        """
        Return each session's answer (up to its check's ``ok``, to its end, or None if neither came in time), and how long it waited.

        In time: while the sessions answer, one after another, the wait goes on (every session's
        connection is up, so a late check is a busy host, or a busy launcher); it ends once no
        session has said anything for the budget, or after the budget once per window of sessions in all.
        """
        answers: dict[int, bytes] = dict.fromkeys(self.procs, b"")
        pending = set(self.procs)
        began = time.monotonic()
        windows = -(-len(self.procs) // self._window) if self._window else 1
        deadline, cap = began + self._budget_s, began + self._budget_s * max(1, windows)
        with selectors.DefaultSelector() as selector:
            for index, proc in self.procs.items():
                assert proc.stdout is not None
                selector.register(proc.stdout, selectors.EVENT_READ, index)
                if index in self._inputs and proc.stdin is not None:
                    os.set_blocking(proc.stdin.fileno(), False)
                    selector.register(proc.stdin, selectors.EVENT_WRITE, -1 - index)
            while pending and (left := min(deadline, cap) - time.monotonic()) > 0:
                for key, _ in selector.select(left):
                    if key.data < 0:
                        self._write_input(selector, key)
                        continue
                    chunk = os.read(key.fd, 65536)
                    answers[key.data] += chunk
                    deadline = time.monotonic() + self._budget_s
                    if not chunk or answers[key.data].endswith(_OK):  # nothing follows ok until "G"
                        selector.unregister(key.fileobj)
                        pending.discard(key.data)
        return ({index: None if index in pending else answer for index, answer in sorted(answers.items())},
                time.monotonic() - began)

    def _write_input(self, selector: selectors.BaseSelector, key: selectors.SelectorKey) -> None:
        """Write what the pipe takes of a session's environment; stop watching it once written or gone."""
        index = -1 - key.data
        data = self._inputs[index]
        try:
            written = os.write(key.fd, data[:65536])
        except BlockingIOError:
            return
        except OSError:  # the session is gone: its end says why
            written = len(data)
        self._inputs[index] = data[written:]
        if not self._inputs[index]:
            selector.unregister(key.fileobj)

    def _failure(self, instance: Instance, answer: bytes) -> Diagnostic | None:
        """Return why the session of ``instance`` ended early, from its status and ssh's error text."""
        proc = self.procs[instance.index]
        try:
            status = proc.wait(self._budget_s)
        except subprocess.TimeoutExpired:
            return _unreachable(instance.host, f"its session did not end within {self._budget_s:g} s")
        assert proc.stderr is not None
        err = proc.stderr.read().decode(errors="replace")
        return _diagnose(instance.host, status, answer.decode(errors="replace"), err, instance.cwd)

    def go(self, router: Router, *, tell: Callable[[Event], None] | None = None) -> None:
        """
        Pass on what the checks' answers held besides the checks, then start every instance: "G" on its input.

        ``tell`` hears that the start phase ended (from the end of the checks: this machine's
        instances were started meanwhile).
        """
        for index, early in self.early.items():
            if early:
                router.feed(index, "stdout", early)
        for proc in self.procs.values():
            _send(proc, b"G\n")
        router.started()
        if tell is not None:
            tell(PhaseEnded(phase="start", ms=_ms_since(self.checked)))


def _greeting(answer: bytes) -> bytes:
    """Return what a login shell printed around a check's lines (a greeting, even one without a newline)."""
    mark = (_MARK + " ").encode()
    kept = []
    for line in answer.splitlines(keepends=True):
        if mark in line:
            line = line.partition(mark)[0]  # noqa: PLW2901 - what came before the mark on its line
        kept.append(line)
    return b"".join(kept)


def _send(proc: subprocess.Popen[bytes], data: bytes) -> None:
    """Write ``data`` to ``proc``'s stdin without blocking; a gone session is no error."""
    pipe = proc.stdin
    with contextlib.suppress(OSError, ValueError):
        if pipe is not None:
            os.set_blocking(pipe.fileno(), False)
            os.write(pipe.fileno(), data)


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


_PARKED: list[SshClient] = []  # the topology probe's client, for the launch that follows it in this process
_PARK_LOCK = threading.Lock()
PARKED_S = 30.0  # a kept client that no launch took within this is closed (ssh's ControlPersist is as long)
_atexit_registered = False


def _park(client: SshClient) -> None:
    """
    Keep ``client`` (a probe's, prepare's, a command's before a launch) for the next launch with its settings.

    The one kept before is closed. So is this one when no launch took it within :data:`PARKED_S`
    (a library caller that never launches keeps nothing), and at the latest when poprun exits.
    """
    global _atexit_registered
    with _PARK_LOCK:
        old, _PARKED[:] = list(_PARKED), [client]
        first, _atexit_registered = not _atexit_registered, True
        client.kept += 1  # this keeping's number: an older one's expiry does not close it
    for other in old:
        if other is not client:
            other.close()
    if first:
        import atexit

        atexit.register(_close_parked)
    expiry = threading.Timer(PARKED_S, _expire, args=(client, client.kept))
    expiry.daemon = True
    expiry.start()


def _expire(client: SshClient, kept: int) -> None:
    """Close ``client`` if it is still kept since its ``kept``-th keeping (no launch took it meanwhile)."""
    with _PARK_LOCK:
        if client not in _PARKED or client.kept != kept:
            return
        _PARKED.remove(client)
    client.close()


def _take_parked(settings: tuple[str | None, str, float, float]) -> SshClient | None:
    """Return the parked client made with ``settings`` (no longer parked: the caller closes it), or None."""
    with _PARK_LOCK:
        for client in _PARKED:
            if not client.closed and client.settings == settings:
                _PARKED.remove(client)
                return client
    return None


def _close_parked() -> None:
    with _PARK_LOCK:
        parked, _PARKED[:] = list(_PARKED), []
    for client in parked:
        client.close()


class SshBackend:
    """Runs the instances of remote hosts through ssh, and those of this machine as child processes."""

    name: ClassVar[str] = "ssh"
    capabilities: ClassVar[frozenset[str]] = frozenset({PROCESSES, CHECKS_BEFORE_START, RESTARTS_INSTANCES})

    def __init__(self, *, grace_s: float = DEFAULT_GRACE_S) -> None:
        self.grace_s = grace_s
        self._client: SshClient | None = None  # the last client made: a launch's, or run_on_host's for the next launch
        self._client_lock = threading.Lock()

    def run_on_host(self, host: str, script: str, *, environ: Mapping[str, str],
                    timeout_s: float) -> tuple[int, bytes]:
        """
        Run ``script`` on ``host`` (:class:`~poprun.backends.base.HostCommands`): here, or over its shared connection.

        See :mod:`.hostcommand`: the connection is the running launch's, or one that the next
        launch of this backend reuses.

        Raises:
            LaunchError: when the host cannot be reached (PR405-PR408, in one line).
        """
        from poprun.backends.ssh.hostcommand import run_on_host, run_once

        with self._client_lock:
            client = self._client if self._client is not None and not self._client.closed else None
        if client is not None:  # a launch runs: through its connection
            return run_on_host(lambda _source: client, host, script, environ=environ, timeout_s=timeout_s)
        # before a launch (the port plan): through a client kept for the launch that follows (its connection is
        # the launch's), guarded by a watchdog of its own, so that a poprun killed meanwhile leaves no control
        # directory and no connection behind
        settings = self._settings(environ)
        try:
            parked = _take_parked(settings) or SshClient(config=settings[0], host_timeout_s=settings[2],
                                                         connect_timeout_s=settings[3], guarded=dict(environ))
        except WatchdogError:  # no watchdog: a connection of its own, that leaves nothing behind
            return run_once(host, script, environ=environ, timeout_s=timeout_s, settings=settings)
        try:
            return run_on_host(lambda _source: parked, host, script, environ=environ, timeout_s=timeout_s)
        finally:
            _park(parked)

    @staticmethod
    def _settings(source: Mapping[str, str]) -> tuple[str | None, str, float, float]:
        """Return the client settings (config, ssh, host timeout, connect timeout) a launch with ``source`` uses."""
        config = os.path.abspath(source[SSH_CONFIG]) if source.get(SSH_CONFIG) else None  # noqa: PTH100 - relays run elsewhere
        timeout_s = host_timeout(source)
        budget = preflight_budget(source, timeout_s)  # ssh's own connect timeout a little shorter: its word is clearer
        return (config, "ssh", timeout_s, CONNECT_TIMEOUT_S if budget == PREFLIGHT_S else budget - 1.5)

    def _shared_client(self, source: Mapping[str, str]) -> SshClient:
        """
        Return the client a launch with ``source`` uses: the open one made with the same settings (a probe's too), else a new one.

        Raises:
            LaunchError: for a host timeout or fan-out window that is not a number in range.
        """
        settings = self._settings(source)
        try:
            fanout = window(source)
        except ValueError as exc:
            raise LaunchError(str(exc)) from None
        with self._client_lock:
            if self._client is None or self._client.closed or self._client.settings != settings:
                self._client = _take_parked(settings) or SshClient(config=settings[0], host_timeout_s=settings[2],
                                                                   connect_timeout_s=settings[3])
            self._client.window = fanout
            return self._client

    def prepare(self, plan: LaunchPlan, *, environ: Mapping[str, str]) -> None:
        """
        Open every remote host's shared connection for ``plan``, ahead of its launch (:class:`~poprun.backends.base.Prepares`).

        The apply step calls this before it reads instance 0's host (the port plan): that host's
        connection is then opened with all the others, in one window, not alone before them (one
        key exchange's time less). The client is kept for the launch, which takes it over and
        counts this time in its connect phase. A host that cannot be connected to is not raised
        here: the launch reports it (its failure is kept on the client, so nobody waits for it twice).
        """
        if all(is_this_machine(instance.host) for instance in plan.instances):
            return
        try:
            settings, budget = self._settings(environ), preflight_budget(environ, host_timeout(environ))
            fanout, how = window(environ), _relay_mode(environ)
            client = _take_parked(settings) or SshClient(config=settings[0], host_timeout_s=settings[2],
                                                         connect_timeout_s=settings[3], guarded=dict(environ))
        except (ValueError, LaunchError, WatchdogError):
            return  # a setting out of range, or no watchdog: the launch says so, or opens its connections itself
        try:
            client.window = fanout
            client.routes = _routes(plan, client, how)
            began = time.monotonic()
            connections = _shared_connections(plan, _slots(plan, client.routes), client.routes)
            client.connect(connections, timeout_s=budget)
            client.ahead_s += time.monotonic() - began
        except OSError:  # no ssh to run: the launch says so
            client.close()
            return
        except BaseException:  # an interrupt: nothing of it is left
            client.close()
            raise
        _park(client)

    def probe_topologies(self, hosts: tuple[str, ...], *,
                         environ: Mapping[str, str]) -> Mapping[str, HostTopology | str]:
        """
        Return each host's topology, read through ssh, or why it could not be (:mod:`.probe`).

        The probe's client is kept for the launch that follows in this process (:func:`_park`):
        its connections are the launch's.
        """
        from poprun.backends.ssh.probe import probe_topologies

        settings = self._settings(environ)
        try:
            client = _take_parked(settings) or SshClient(config=settings[0], host_timeout_s=settings[2],
                                                         connect_timeout_s=settings[3], guarded=dict(environ))
        except WatchdogError as exc:
            return dict.fromkeys(hosts, f"cannot start a watchdog: {exc.strerror}")
        with contextlib.suppress(ValueError):  # a window out of range: the launch says so
            client.window = window(environ)
        try:
            return probe_topologies(hosts, environ=environ, client=client)
        finally:
            _park(client)

    def launch(self, plan: LaunchPlan, *, env_source: Mapping[str, str], sink: OutputSink,
               cache: TemporaryCache | None = None, restarter: Restarter | None = None) -> LocalLaunch:
        """
        Check every host, then start every instance; return without waiting.

        With ``restarter``, a failed instance starts again alone when it says so (:func:`_respawner`).

        ``cache``, when to be removed at the end, is made on every remote host that lacks it
        (see :func:`remote_command`) and removed there by the last of its instances.

        Raises:
            PreflightError: when any host cannot run the plan (nothing has started).
            LaunchError: when an instance on this machine cannot start.
        """
        source = dict(env_source)
        envs = [environment(i, source) for i in plan.instances]
        config = source.get(SSH_CONFIG) or None
        hosts = list(dict.fromkeys(i.host for i in plan.instances if not is_this_machine(i.host)))
        if plan.ssh_keys.enabled:
            from poprun.backends.ssh.sshkey import distribute_key

            distribute_key(plan.ssh_keys, hosts, env=source, config=config)
        timeout_s = host_timeout(source)
        client = self._shared_client(source)  # a connection run_on_host or the probe opened is this launch's
        if plan.ssh_keys.enabled:  # a host that refused the key before (the port plan's command) may take it now
            client.forget_failures(hosts)
        try:
            return self._launch(plan, envs, source, client, sink, timeout_s=timeout_s, cache=cache, restarter=restarter)
        except BaseException:
            client.close()
            raise

    def _launch(self, plan: LaunchPlan, envs: list[dict[str, str]], source: dict[str, str], client: SshClient,
                sink: OutputSink, *, timeout_s: float, cache: TemporaryCache | None,
                restarter: Restarter | None = None) -> LocalLaunch:
        budget = preflight_budget(source, timeout_s)
        remote = frozenset(i.index for i in plan.instances if not is_this_machine(i.host))
        ensure_open_files(len(plan.instances) + len(remote))  # a remote one: its session and the stdin copy
        client.routes = _routes(plan, client, _relay_mode(source))
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
                raise LaunchError(f"cannot start ssh: {exc.strerror}") from exc
            raise
        ordered = [procs[i] for i in range(len(plan.instances))]
        sessions.go(router, tell=tell)
        beat = _Heartbeat(procs, sorted(remote), interval_s=timeout_s / 3)
        feeder = _feed(client, plan.instances[0].host, stdin, stdin_directory, env=source, group=clients.group)

        def stop(sig: int) -> None:
            if sig == signal.SIGKILL:
                clients.signal(signal.SIGKILL)  # the remote wrappers see their input end, and kill
                return
            line = _LINES.get(sig, b"T\n")  # stop, continue, or end
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
        return LocalLaunch(plan, ordered, watchdog=watchdog, router=router, sink=sink, grace_s=self.grace_s,
                           remove=remove, stop=stop, remote=remote, finish=finish,
                           lost=_lost(plan, client, remote, slots), restarter=restarter,
                           respawn=respawn)


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
    Return the :data:`~poprun.backends._process.supervisor.Respawn` of a launch: an instance of this machine as it first started, a remote one in a new session.

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
            raise LaunchError(f"cannot start ssh: {exc.strerror}") from exc
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
        raise LaunchError(str(exc.strerror)) from exc
    try:
        return watchdog, Watchdog(env=env)
    except WatchdogError as exc:
        watchdog.close()
        raise LaunchError(str(exc.strerror)) from exc


def _commands(plan: LaunchPlan, remote: frozenset[int], cache: str | None, timeout_s: float,
              stdin_directory: str | None) -> dict[int, str]:
    """Return the :func:`remote_command` of each remote instance, by index (instance 0 with ``stdin_directory``)."""
    on_host: dict[str, list[int]] = {}
    for index in sorted(remote):
        on_host.setdefault(plan.instances[index].host, []).append(index)
    return {index: remote_command(plan.instances[index], cache=cache, cache_instances=on_host[plan.instances[index].host],
                                  host_timeout_s=timeout_s, stdin_directory=stdin_directory if index == 0 else None)
            for index in sorted(remote)}


def _connect(plan: LaunchPlan, client: SshClient, connections: list[tuple[str, int]], budget_s: float, *,
             guards: tuple[Watchdog, ...], tell: Callable[[Event], None] | None = None) -> None:
    """
    Open the shared ``connections`` first, in the client's window; on any failure, close the watchdogs ``guards`` too.

    ``tell`` hears how each host connected (HostConnected: its time, attempts, whether slow) and
    the phase's end (PhaseEnded ``connect``).

    Raises:
        PreflightError: naming each host that could not be connected to, and why.
    """
    began, ahead_s, client.ahead_s = time.monotonic(), client.ahead_s, 0.0  # opened ahead: the phase's time too
    try:
        failed = client.connect(connections, timeout_s=budget_s)
    except BaseException as exc:
        for guard in guards:
            guard.close()
        if isinstance(exc, OSError):
            raise LaunchError(f"cannot start ssh: {exc.strerror or exc}") from exc
        raise
    if tell is not None:
        for host in dict.fromkeys(host for host, _ in connections):
            if (how := client.connections.get(host)) is not None:
                tell(HostConnected(host=host, ms=round(how.seconds * 1000), attempts=how.attempts, slow=how.slow))
        hosts = len({i.host for i in plan.instances if not is_this_machine(i.host)})
        through = f" through {client.routes.relay_count()} relays" if client.routes.via else ""
        tell(PhaseEnded(phase="connect", ms=_ms_since(began) + round(ahead_s * 1000),
                        detail=f"{hosts} hosts{through}, {client.window} connections at a time"))
    problems = [d for host, (status, err) in failed.items()
                if (d := _diagnose(host, status, "", err, plan.instances[0].cwd)) is not None]
    if problems:
        for guard in guards:
            guard.close()
        raise PreflightError(problems)


def _ms_since(began: float) -> int:
    return round((time.monotonic() - began) * 1000)


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
        raise LaunchError(str(exc)) from None


def preflight_budget(env: Mapping[str, str], host_timeout_s: float) -> float:
    """
    Return how long the preflight waits for every host: :data:`PREFLIGHT_S`, or the host timeout the user set if longer.

    A host on a slow link is not unreachable when the user said how long a host may take.
    """
    return max(PREFLIGHT_S, host_timeout_s) if env.get(HOST_TIMEOUT, "").strip() else PREFLIGHT_S


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
        raise LaunchError(f"{HOST_TIMEOUT}={text!r} is not a number of seconds from 3 to 3600")
    return value


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
            self._thread.start()

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
