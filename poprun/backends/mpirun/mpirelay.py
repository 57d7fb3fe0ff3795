"""
The mpirun backend's output relay: each instance's stdout and stderr reach poprun over a connection of their own.

Layer: ``poprun.backends``; the standard library only (and :mod:`poprun.backends.base`).

Why: OpenMPI 4.1's ``--tag-output`` loses output (it tags each 4 KiB read into an 8 KiB
buffer and drops what does not fit: ``mpirun --tag-output seq 2000`` prints about 1,300
lines), and untagged, the lines of two instances interleave mid-line. So poprun does not let
the instances' output go through mpirun at all. Each app context runs the program through a
small wrapper (:func:`relay_words`: ``sh``, then poprun's own Python where the host has it at
the same path, else the host's ``python3``, with ``-I -S``) that connects
to poprun's listening socket, authenticates with the launch's random token (given to the
wrapper in the environment, never on a command line, and removed before the program starts),
waits for poprun's acknowledgement, and execs the program with pipes for its stdout and stderr
(as under plain mpirun: ``/dev/stdout`` opens, ``isatty`` is false), which a relay process
copies to the connections. The relay is a grandchild of the wrapper in a session of its own:
no child of the program (a shell's ``wait`` does not wait for it), out of reach of the signals
that stop the instance's group, and it ends when every writer of the pipes has closed them or
when poprun closes the connection. The program is then mpirun's child exactly as before (same
pid, same signals, same exit status); only its output goes to poprun directly, whole and
once, however OpenMPI handles output.

Where the wrapper finds poprun: on an instance of this machine at ``127.0.0.1``; on another
host at the address its ssh connection came from (``SSH_CONNECTION``, which mpirun's ssh
passes to its daemon and the daemon to the instances) and at the addresses of mpirun's own
contact URI (``OMPI_MCA_orte_hnp_uri``, the addresses through which mpirun's daemons reach
it). If no connection can be made within a few seconds (no ``python3`` on the host, a firewall
between), the wrapper says so on its stderr and runs the program anyway: its output then goes
through mpirun, tagged, as before, with OpenMPI's losses.

A connection that stays silent is probed by TCP keepalives (:data:`KEEPALIVE`): a host that
stops answering (its link down, its power off) breaks the connections of its instances within
the host timeout, and poprun names it (PR411).

The relay process is also the instance's watchdog on its host, as the ssh backend's wrapper is:
when poprun's end of a connection ends (poprun closed it, or died) or breaks (no answer to the
keepalives, or data unacknowledged, for the host timeout: ``TCP_USER_TIMEOUT``) while the
program still holds the pipe, the launch is over for this host, whatever happened to mpirun's
daemon there (its ssh session killed, the daemon hung, the host cut off). The relay then
SIGKILLs the program's process group (mpirun's daemon makes each program a group leader) and,
when the program's parent is mpirun's daemon (``orted``, ``prted``) that has not ended on its
own within 2 s, that daemon. Both are known by pid and start time, taken before the program
started: a reused pid is never killed. A wrapper that could not reach poprun has no relay, and
no such watchdog.
"""

from __future__ import annotations

import contextlib
import errno
import secrets
import selectors
import socket
import sys
import time

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from collections.abc import Callable

    from poprun.backends.base import Stream

RELAY_VARIABLE = "POPRUN_OUTPUT_RELAY"  # "PORT:TOKEN", in mpirun's environment, forwarded by name (-x)
CONNECT_S = 3.0  # how long a wrapper tries one address
_HEADER_MAX = 128  # a greeting longer than this is not a wrapper's
_GREETING_S = 10.0  # a connection that has not greeted within this is dropped
_READ = 1 << 18
_LOST = frozenset((errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN))

# The wrapper's Python (3.6 and later; no site, no environment): argv is INDEX STREAMS ADDRESSES PROGRAM...
# STREAMS is "12" (a connection each for stdout and stderr) or "1" (one for both: --merge-stderr-to-stdout).
# The program's stdout and stderr are pipes, as under plain mpirun; a relay process, a grandchild
# in a session of its own (no child of the program, out of reach of signals to the instance's
# group, holding no descriptor of mpirun's), copies each pipe to its connection until every
# writer has closed it, or until poprun closes the connection (the socket becomes readable:
# poprun never writes after its "k"): then, or when a send fails, it kills the program and a daemon
# parent that outlives it (stop(); "watch" is their pids and start times, taken before the exec).
WRAPPER = r"""import os, select, socket, sys
def addresses(given):
    found = [a for a in given.split(",") if a]
    ssh = os.environ.get("SSH_CONNECTION", "").split()
    found += ssh[:1]
    for part in os.environ.get("OMPI_MCA_orte_hnp_uri", "").split(";")[1:]:
        found += [a.strip("[]") for a in part.partition("://")[2].rpartition(":")[0].split(",")]
    return [a for i, a in enumerate(found) if a and a not in found[:i]]
def connect(places, port, token, index, stream):
    for a in places:
        try:
            s = socket.create_connection((a, port), %(connect)s)
            s.sendall(("%%s %%s %%s\n" %% (token, index, stream)).encode())
            if s.recv(1) == b"k":
                s.settimeout(None)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                keep(s)
                return s
            s.close()
        except (OSError, ValueError):
            pass
    return None
def keep(s):
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for o, v in ((socket.TCP_KEEPIDLE, %(step)s), (socket.TCP_KEEPINTVL, %(step)s), (socket.TCP_KEEPCNT, 2)):
            s.setsockopt(socket.IPPROTO_TCP, o, v)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, %(step)s * 3000)
    except (OSError, AttributeError):
        pass
def born(pid):
    try:
        with open("/proc/%%d/stat" %% pid, "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None
def daemon(pid):
    try:
        with open("/proc/%%d/comm" %% pid, "rb") as f:
            return f.read().strip() in (b"orted", b"prted")
    except OSError:
        return False
def stop(watch):
    me, mine, parent, theirs = watch
    if mine is not None and born(me) == mine:
        for kill in (os.killpg, os.kill):
            try:
                kill(me, 9)
            except OSError:
                pass
    if theirs is None:
        return
    for _ in range(20):
        if born(parent) != theirs:
            return
        select.select([], [], [], 0.1)
    try:
        os.kill(parent, 9)
    except OSError:
        pass
def relay(pairs, watch):
    os.setsid()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    keep = sorted([r for r, _ in pairs] + [s.fileno() for _, s in pairs])
    low = 3
    for fd in keep + [1 << 20]:
        os.closerange(low, min(fd, 1 << 20))
        low = fd + 1
    back = {s.fileno(): (r, s) for r, s in pairs}
    ends = dict((r, s) for r, s in pairs)
    while ends:
        ready = select.select(list(ends) + list(back), [], [])[0]
        for fd in ready:
            if fd in back:
                stop(watch)
                return
            s = ends[fd]
            data = os.read(fd, 262144)
            try:
                if data:
                    s.sendall(data)
                    continue
            except OSError:
                stop(watch)
                return
            del ends[fd]
            back.pop(s.fileno(), None)
            s.close()
def main():
    index, streams, given = sys.argv[1:4]
    program = sys.argv[4:]
    port, _, token = os.environ.pop("%(variable)s", "").partition(":")
    places = addresses(given)
    pairs = []
    for fd in (1, 2)[:len(streams)]:
        s = connect(places, int(port or 0), token, index, "stdout" if fd == 1 else "stderr")
        if s is None:
            os.write(2, ("poprun: instance %%s cannot reach poprun at %%s: its output goes through mpirun, which "
                         "may lose lines\n" %% (index, " or ".join(places) or "no address")).encode())
            break
        r, w = os.pipe()
        os.dup2(w, fd)
        if len(streams) == 1:
            os.dup2(w, 2)
        os.close(w)
        pairs.append((r, s))
    if pairs:
        me, parent = os.getpid(), os.getppid()
        watch = (me, born(me), parent, born(parent) if daemon(parent) else None)
        child = os.fork()
        if child == 0:
            try:
                if os.fork() == 0:
                    relay(pairs, watch)
            finally:
                os._exit(0)
        os.waitpid(child, 0)
        for r, s in pairs:
            os.close(r)
            s.close()
    try:
        os.execvp(program[0], program)
    except OSError as e:
        os.write(2, ("poprun: cannot run %%s: %%s\n" %% (program[0], e.strerror)).encode())
        os._exit(127 if e.errno == 2 else 126)
main()
"""


def _wrapper(keepalive_s: float) -> str:
    """Return the wrapper's code for a host timeout of ``keepalive_s`` (its relay's keepalives)."""
    step = max(1, round(keepalive_s / 3))
    return WRAPPER % {"connect": CONNECT_S, "variable": RELAY_VARIABLE, "step": step}


# Runs the wrapper with $1 (poprun's own Python, when the host has it at the same path), else the host's
# python3; without either, the program as it is (its output then goes through mpirun).
SHELL = ('p=$1; shift; if [ -x "$p" ]; then exec "$p" -I -S -c "$0" "$@"; fi; '
         'if command -v python3 >/dev/null 2>&1; then exec python3 -I -S -c "$0" "$@"; fi; '
         'echo "poprun: instance $1: no python3 on $(hostname): its output goes through mpirun, which may lose '
         'lines" >&2; shift 3; exec "$@"')

KEEPALIVE = (socket.TCP_KEEPIDLE, socket.TCP_KEEPINTVL, socket.TCP_KEEPCNT) if hasattr(socket, "TCP_KEEPIDLE") else ()


def relay_words(index: int, *, local: bool, merge: bool, keepalive_s: float) -> list[str]:
    """
    Return the words that run an instance's program through the wrapper; the program's words follow them.

    ``local``: the instance runs on this machine (it finds poprun at 127.0.0.1); ``merge``:
    its stderr goes with its stdout (``--merge-stderr-to-stdout``); ``keepalive_s``: the host
    timeout (the relay process gives up on a poprun that does not answer within it).
    """
    return ["sh", "-c", SHELL, _wrapper(keepalive_s), sys.executable or "python3", str(index), "1" if merge else "12",
            "127.0.0.1" if local else ""]


class _Connection:
    """One accepted connection: its greeting until the wrapper has said whose it is, then that instance's stream."""

    __slots__ = ("greeting", "key", "since", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.greeting = b""
        self.key: tuple[int, Stream] | None = None
        self.since = time.monotonic()


class Relay:
    """
    poprun's end of the relay: a listening socket, the token, and the connections of the instances.

    :meth:`fds` and :meth:`ready` let the reading thread of the launch multiplex them with the
    launcher's pipes; each chunk read goes to ``feed(index, stream, data)``, each end of a
    stream to ``end(index, stream)``. ``lost(index)`` is called when an instance's connection
    breaks because its host stopped answering.
    """

    def __init__(self, *, count: int, remote: bool, keepalive_s: float) -> None:
        self.count = count
        self.token = secrets.token_hex(16)
        self._keepalive_s = keepalive_s
        self.listener = _listen(remote=remote)
        self.port = self.listener.getsockname()[1]
        self.listener.setblocking(False)  # noqa: FBT003 - the socket API
        self._connections: dict[int, _Connection] = {}
        self._selector: selectors.BaseSelector | None = None
        self._callback: Callable[[int], None] | None = None
        self.started: set[int] = set()  # instances whose wrapper connected
        self.peers: dict[int, str] = {}  # instance -> the address its connection came from
        self._taken: set[tuple[int, Stream]] = set()

    @property
    def variable(self) -> str:
        """Return the value of :data:`RELAY_VARIABLE` for the wrappers."""
        return f"{self.port}:{self.token}"

    def attach(self, selector: selectors.BaseSelector, callback: Callable[[int], None]) -> None:
        """Register the listener, and from now on each connection, with ``selector``; ``callback(fd)`` handles them."""
        self._selector, self._callback = selector, callback
        selector.register(self.listener, selectors.EVENT_READ, callback)

    def open_instances(self) -> set[int]:
        """Return the instances with a stream still connected (not ended)."""
        return {c.key[0] for c in self._connections.values() if c.key is not None}

    def open_streams(self) -> int:
        """Return how many instance streams are connected and not ended yet."""
        return sum(1 for c in self._connections.values() if c.key is not None)

    def ready(self, fd: int, *, feed: Callable[[int, Stream, bytes], None], end: Callable[[int, Stream], None],
              lost: Callable[[int], None]) -> None:
        """Handle ``fd``, which is readable: accept a connection, or read one."""
        if fd == self.listener.fileno():
            self._accept()
            return
        conn = self._connections[fd]
        try:
            data = conn.sock.recv(_READ)
        except BlockingIOError:
            return
        except OSError as exc:
            if conn.key is not None and exc.errno in _LOST:
                lost(conn.key[0])
            data = b""
        if conn.key is None:
            self._greet(conn, data)
        elif data:
            feed(*conn.key, data)
        else:
            self._close(conn, end)

    def expire(self) -> None:
        """Drop connections that have not greeted within the allowed time (not a wrapper's)."""
        now = time.monotonic()
        for conn in [c for c in self._connections.values() if c.key is None and now - c.since > _GREETING_S]:
            self._close(conn, None)

    def close(self, end: Callable[[int, Stream], None]) -> None:
        """Accept what is waiting, then close every connection (ending its stream) and the listener."""
        self._accept()
        for conn in list(self._connections.values()):
            self._close(conn, end)
        if self._selector is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(self.listener)
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # ECONNABORTED, EMFILE: try again on the next wake
                return
            sock.setblocking(False)  # noqa: FBT003 - the socket API
            self._connections[sock.fileno()] = _Connection(sock)
            if self._selector is not None:
                self._selector.register(sock, selectors.EVENT_READ, self._callback)

    def _greet(self, conn: _Connection, data: bytes) -> None:
        """Read the wrapper's greeting ``TOKEN INDEX STREAM``; acknowledge it, or drop a stranger."""
        conn.greeting += data
        line, newline, rest = conn.greeting.partition(b"\n")
        if not newline:
            if not data or len(conn.greeting) > _HEADER_MAX:
                self._close(conn, None)
            return
        words = line.split()
        key = _key(words[1:], self.count) if len(words) == 3 and secrets.compare_digest(  # noqa: PLR2004
            words[0], self.token.encode()) else None
        if key is None or key in self._taken or rest:
            self._close(conn, None)
            return
        conn.key = key
        self._taken.add(key)
        self.started.add(key[0])
        with contextlib.suppress(OSError, IndexError):
            peer = conn.sock.getpeername()[0]
            self.peers[key[0]] = peer.removeprefix("::ffff:")  # an IPv4 address on a dual-stack socket
        self._keep_alive(conn.sock)
        try:
            conn.sock.send(b"k")
        except OSError:
            self._close(conn, None)

    def _keep_alive(self, sock: socket.socket) -> None:
        """Probe a silent connection, so that a host that stops answering breaks it within the host timeout."""
        if not KEEPALIVE or sock.family not in (socket.AF_INET, socket.AF_INET6):
            return
        step = max(1, int(self._keepalive_s / 3))
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            for option, value in zip(KEEPALIVE, (step, step, 2), strict=True):
                sock.setsockopt(socket.IPPROTO_TCP, option, value)

    def _close(self, conn: _Connection, end: Callable[[int, Stream], None] | None) -> None:
        self._connections.pop(conn.sock.fileno(), None)
        if self._selector is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(conn.sock)
        conn.sock.close()
        if conn.key is not None and end is not None:
            end(*conn.key)


def _key(words: list[bytes], count: int) -> tuple[int, Stream] | None:
    """Return (index, stream) from a greeting's ``INDEX STREAM``, or None when it names no instance."""
    index, stream = words
    if not index.isdigit() or int(index) >= count or stream not in (b"stdout", b"stderr"):
        return None
    return int(index), "stdout" if stream == b"stdout" else "stderr"


def _listen(*, remote: bool) -> socket.socket:
    """Return a listening TCP socket: on 127.0.0.1 for a launch on this machine only, else on every address."""
    if not remote:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
    elif socket.has_dualstack_ipv6():
        return socket.create_server(("::", 0), family=socket.AF_INET6, dualstack_ipv6=True, backlog=1024)
    else:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("0.0.0.0", 0))  # noqa: S104 - instances on other hosts connect; the token keeps strangers out
    sock.listen(1024)
    return sock
