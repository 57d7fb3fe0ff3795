"""
The mpirun backend's output relay: each instance's stdout and stderr reach poprun over a connection of their own.

Layer: ``poprun.backends``; the standard library only (and :mod:`poprun.backends.base`, ``popdist.env``'s names; ``poprun.core``'s
exit statuses, and its diagnostics, imported when one is made).

Length: both ends of one wire protocol (the wrapper's relay on the host and poprun's receiver:
frames, acknowledgements, resumption) stay in one file, so that what must match is read side by side.

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
once, however OpenMPI handles output. The relay also holds the instance's original stdout and
stderr (mpirun's pipes) until the program itself ends (a pidfd): OpenMPI stops forwarding
stdin to a process once both are closed, so without them instance 0 would get only the first
64 KiB of poprun's stdin.

Where the wrapper finds poprun: on an instance of this machine at ``127.0.0.1``; on another
host at the address its ssh connection came from (``SSH_CONNECTION``, which mpirun's ssh
passes to its daemon and the daemon to the instances) and at the addresses of mpirun's own
contact URI (``OMPI_MCA_orte_hnp_uri``, the addresses through which mpirun's daemons reach
it). The address that answered is also where the program's progress datagrams go: a
``POPRUN_PROGRESS`` of ``:PORT`` (poprun could not know it) becomes ``ADDRESS:PORT`` before the
program starts (docs/progress.md), right also where mpirun's tree spawn started the host's
daemon from another host (whose address ``SSH_CONNECTION`` then holds). If no connection can be made within a few seconds (no ``python3`` on the host, a firewall
between), the wrapper says so on its stderr and runs the program anyway: its output then goes
through mpirun, tagged, as before, with OpenMPI's losses.

A connection that stays silent is probed by TCP keepalives (:data:`KEEPALIVE`): a host that
stops answering (its link down, its power off) breaks the connections of its instances within
the host timeout, and poprun names it (PR411).

A connection that is reset (``ss -K``, a NAT or firewall flush, a middlebox) loses nothing: the
relay process numbers the bytes it sends (frames, :class:`Relay`), keeps those poprun has not
acknowledged (at most :data:`WINDOW`; then it stops reading the program's pipe until poprun
catches up), connects again and sends on from where poprun has them. A connection that timed
out (poprun unanswered for the host timeout: the host is cut off, and poprun names it lost) is
not made again. A stream whose connection
broke and did not come back within the host timeout (5 s at least) is lost output: PR414 names
the instance, exit 125. Connections to the relay's port that do not authenticate are closed
(beyond two per instance and 64 more waiting at once, the oldest first) and told at the end
(PR415, a warning); an instance whose wrapper could not reach poprun at all is told too (PR416).

The relay process is also the instance's watchdog on its host, as the ssh backend's wrapper is:
when poprun's end of a connection ends (poprun closed it, or died, or refuses a new one) or
breaks for good (no answer to the keepalives, or data unacknowledged, for the host timeout:
``TCP_USER_TIMEOUT``; or reset, and no new connection within the host timeout) while the program still holds the
pipe, the launch is over for this host, whatever happened to mpirun's
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

from popdist.env import PROGRESS
from poprun.core.exitstatus import NOT_EXECUTABLE, NOT_FOUND  # formatted into the wrapper, run on the hosts

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from collections.abc import Callable

    from poprun.backends.base import Stream
    from poprun.core.diagnostic import Diagnostic

RELAY_VARIABLE = "POPRUN_OUTPUT_RELAY"  # "PORT:TOKEN", in mpirun's environment, forwarded by name (-x)
CONNECT_S = 3.0  # how long a wrapper tries one address
_HEADER_MAX = 128  # a greeting longer than this is not a wrapper's
_GREETING_S = 10.0  # a connection that has not greeted within this is dropped
_READ = 1 << 18
MAX_FRAME = 1 << 20  # a frame longer than this is not the wrapper's (it sends at most 256 KiB at once)
_FRAME_HEAD = 4  # a frame's length, big-endian
ACK_EVERY = 1 << 16  # poprun acknowledges what it has every this many bytes of a stream (and at its end)
WINDOW = 4 << 20  # bytes a wrapper keeps unacknowledged at most (then it stops reading the program's pipe)
RECONNECT_S = 5  # how long a wrapper whose connection broke tries to connect again, at least (else the host timeout)
_STRANGERS = 64  # connections that have not greeted kept at most, beyond two per instance
_RESET = (1).to_bytes(4, sys.byteorder) + (0).to_bytes(4, sys.byteorder)  # struct linger {on, 0 s}: close with a reset
_LOST = frozenset((errno.ETIMEDOUT, errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN))

# The wrapper's Python (3.6 and later; no site, no environment): argv is INDEX STREAMS ADDRESSES PROGRAM...
# STREAMS is "12" (a connection each for stdout and stderr) or "1" (one for both: --merge-stderr-to-stdout).
# The program's stdout and stderr are pipes, as under plain mpirun; a relay process, a grandchild
# in a session of its own (no child of the program, out of reach of signals to the instance's
# group), copies each pipe to its connection in frames until
# every writer has closed it (then an empty frame, and poprun's last acknowledgement), keeping
# what poprun has not acknowledged (Out.kept, at most WINDOW bytes); a connection that fails
# (a reset) is made again and the rest sent from where poprun has it (one that timed out, poprun
# unanswered for the host timeout, is not: the host is cut off); one that poprun closes,
# or a port that refuses, means poprun is gone: the relay closes its pipes and ends. It holds
# mpirun's own stdout and stderr of the instance until the program's pid ends (pidfd; without
# pidfd_open, not at all): mpirun forwards stdin only while they are open. When poprun is gone
# (closed, refused, or unreachable for the host timeout) while the program still holds a pipe,
# it kills the program and a daemon parent that outlives it (stop(); "guard" is their pids and
# start times, taken before the exec).
WRAPPER = r"""import errno, os, select, socket, struct, sys, time
def addresses(given):
    found = [a for a in given.split(",") if a]
    ssh = os.environ.get("SSH_CONNECTION", "").split()
    found += ssh[:1]
    for part in os.environ.get("OMPI_MCA_orte_hnp_uri", "").split(";")[1:]:
        found += [a.strip("[]") for a in part.partition("://")[2].rpartition(":")[0].split(",")]
    return [a for i, a in enumerate(found) if a and a not in found[:i]]
def exactly(s, n):
    data = b""
    while len(data) < n:
        part = s.recv(n - len(data))
        if not part:
            raise OSError("closed")
        data += part
    return data
def connect(places, port, token, index, stream):
    refused = 0
    for a in places:
        try:
            s = socket.create_connection((a, port), %(connect)s)
            s.sendall(("%%s %%s %%s\n" %% (token, index, stream)).encode())
            answer = exactly(s, 9)
            if answer[:1] == b"k":
                s.settimeout(None)
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                keep(s)
                return s, struct.unpack(">Q", answer[1:])[0]
            s.close()
        except ConnectionRefusedError:
            refused += 1
        except (OSError, ValueError, struct.error):
            pass
    return None, refused == len(places)
def keep(s):
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        for o, v in ((socket.TCP_KEEPIDLE, %(step)s), (socket.TCP_KEEPINTVL, %(step)s), (socket.TCP_KEEPCNT, 2)):
            s.setsockopt(socket.IPPROTO_TCP, o, v)
        if hasattr(socket, "TCP_USER_TIMEOUT"):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, %(step)s * 3000)
    except (OSError, AttributeError):
        pass
class Out(object):
    def __init__(self, r, s, name):
        self.r, self.s, self.name = r, s, name
        self.kept, self.base, self.acks, self.done, self.gone = bytearray(), 0, b"", False, False
    def send(self, data):
        for at in range(0, len(data), 262144):
            part = data[at:at + 262144]
            self.s.sendall(struct.pack(">I", len(part)) + part)
    def quit(self):
        if self.r is not None:
            os.close(self.r)
            self.r = None
        if self.s is not None:
            self.s.close()
            self.s = None
        self.done = True
    def acked(self, upto):
        if upto < self.base or upto > self.base + len(self.kept):
            raise OSError("bad acknowledgement")
        del self.kept[:upto - self.base]
        self.base = upto
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
def relay(outs, places, port, token, index, held, pid, guard):
    os.setsid()
    watch = None
    try:
        watch = os.pidfd_open(pid)
    except (AttributeError, OSError):
        pass
    if watch is None:
        held = []
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    keepfds = sorted([o.r for o in outs] + [o.s.fileno() for o in outs] + held + ([watch] if held else []))
    low = 3
    for fd in keepfds + [1 << 20]:
        os.closerange(low, min(fd, 1 << 20))
        low = fd + 1
    def broken(o, e):
        try:
            o.s.close()
        except OSError:
            pass
        o.s = None
        if getattr(e, "errno", None) == errno.ETIMEDOUT:
            o.gone = True
            if o.r is not None:
                stop(guard)
            return
        until = time.time() + %(again)s
        while time.time() < until:
            s, have = connect(places, port, token, index, o.name)
            if s is None and have:
                if o.r is not None:
                    stop(guard)
                o.quit()
                return
            if s is not None:
                o.s, o.acks = s, b""
                try:
                    o.acked(have)
                    o.send(bytes(o.kept))
                    if o.r is None:
                        o.s.sendall(struct.pack(">I", 0))
                    return
                except OSError:
                    try:
                        s.close()
                    except OSError:
                        pass
                    o.s = None
            time.sleep(0.2)
        o.gone = True
        if o.r is not None:
            stop(guard)
    if not held:
        watch = None
    while [o for o in outs if not o.done and not o.gone] or [o for o in outs if o.r is not None] or watch is not None:
        reading = dict((o.r, o) for o in outs if o.r is not None and (o.gone or len(o.kept) < %(window)s))
        talking = dict((o.s.fileno(), o) for o in outs if o.s is not None and not o.gone and not o.done)
        ready = select.select(list(reading) + list(talking) + ([watch] if watch is not None else []), [], [], 1.0)[0]
        for fd in ready:
            if fd == watch:
                for h in held:
                    os.close(h)
                os.close(watch)
                watch = None
                continue
            if fd in reading:
                o = reading[fd]
                data = os.read(fd, 262144)
                if not data:
                    os.close(o.r)
                    o.r = None
                if o.gone:
                    continue
                if data:
                    o.kept += data
                try:
                    if o.s is None:
                        raise OSError("not connected")
                    o.send(data) if data else o.s.sendall(struct.pack(">I", 0))
                except OSError as e:
                    broken(o, e)
            elif fd in talking:
                o = talking[fd]
                if o.s is None or o.s.fileno() != fd or o.done:
                    continue  # connected again meanwhile: the new connection is looked at on the next round
                try:
                    got = o.s.recv(4096, socket.MSG_DONTWAIT)
                    if not got:
                        if o.r is not None:
                            stop(guard)
                        o.quit()
                        continue
                    o.acks += got
                    while len(o.acks) >= 8:
                        o.acked(struct.unpack(">Q", o.acks[:8])[0])
                        o.acks = o.acks[8:]
                    if o.r is None and not o.kept:
                        o.done = True
                        o.s.close()
                        o.s = None
                except BlockingIOError:
                    pass
                except OSError as e:
                    if o.r is None and not o.kept:
                        o.done = True
                    else:
                        broken(o, e)
def main():
    index, streams, given = sys.argv[1:4]
    program = sys.argv[4:]
    port, _, token = os.environ.pop("%(variable)s", "").partition(":")
    places = addresses(given)
    outs = []
    pid = os.getpid()
    held = [os.dup(1), os.dup(2)]
    seen = ""
    for fd in (1, 2)[:len(streams)]:
        name = "stdout" if fd == 1 else "stderr"
        s = connect(places, int(port or 0), token, index, name)[0]
        if s is not None and not seen:
            try:
                seen = s.getpeername()[0]
            except OSError:
                pass
        if s is None:
            os.write(2, ("poprun: instance %%s cannot reach poprun at %%s: its output goes through mpirun, which "
                         "may lose lines\n" %% (index, " or ".join(places) or "no address")).encode())
            break
        r, w = os.pipe()
        os.dup2(w, fd)
        if len(streams) == 1:
            os.dup2(w, 2)
        os.close(w)
        outs.append(Out(r, s, name))
    if outs:
        me, parent = os.getpid(), os.getppid()
        guard = (me, born(me), parent, born(parent) if daemon(parent) else None)
        child = os.fork()
        if child == 0:
            try:
                if os.fork() == 0:
                    relay(outs, places, int(port or 0), token, index, held, pid, guard)
            finally:
                os._exit(0)
        os.waitpid(child, 0)
        for o in outs:
            os.close(o.r)
            o.s.close()
    for h in held:
        os.close(h)
    progress = os.environ.get("%(progress)s", "")
    if progress.startswith(":") and seen:
        os.environ["%(progress)s"] = ("[%%s]%%s" if ":" in seen else "%%s%%s") %% (seen, progress)
    try:
        os.execvp(program[0], program)
    except OSError as e:
        os.write(2, ("poprun: cannot run %%s: %%s\n" %% (program[0], e.strerror)).encode())
        os._exit(%(not_found)s if e.errno == 2 else %(not_executable)s)
main()
"""


def _wrapper(keepalive_s: float) -> str:
    """Return the wrapper's code for a host timeout of ``keepalive_s`` (its relay's keepalives)."""
    step = max(1, round(keepalive_s / 3))
    return WRAPPER % {"connect": CONNECT_S, "variable": RELAY_VARIABLE, "progress": PROGRESS, "step": step,
                      "window": WINDOW,
                      "again": max(RECONNECT_S, round(keepalive_s)), "not_found": NOT_FOUND,
                      "not_executable": NOT_EXECUTABLE}


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
    """One accepted connection: its greeting until the wrapper has said whose it is, then frames of that instance's stream."""

    __slots__ = ("buffer", "greeting", "key", "peer", "since", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.greeting = b""
        self.key: tuple[int, Stream] | None = None
        self.since = time.monotonic()
        self.buffer = bytearray()  # the start of a frame not read whole yet
        self.peer = ""


class _Stream:
    """One instance's stdout or stderr: how much of it arrived, over which connection, whether it ended or broke."""

    __slots__ = ("acked", "broke", "conn", "ended", "received", "why")

    def __init__(self) -> None:
        self.received = 0  # bytes passed on
        self.acked = 0  # bytes acknowledged to the wrapper
        self.conn: _Connection | None = None
        self.ended = False
        self.broke: float | None = None  # (monotonic) when its connection broke, until one resumes it
        self.why = ""  # how it broke


class Relay:
    """
    poprun's end of the relay: a listening socket, the token, and the connections of the instances.

    :meth:`fds` and :meth:`ready` let the reading thread of the launch multiplex them with the
    launcher's pipes; each chunk read goes to ``feed(index, stream, data)``, each end of a
    stream to ``end(index, stream)``. ``lost(index)`` is called when an instance's connection
    breaks because its host stopped answering.

    The protocol (:data:`WRAPPER`): the wrapper greets with ``TOKEN INDEX STREAM``; poprun answers
    ``k`` and how many bytes of that stream it has (8 bytes, big-endian). The wrapper then sends
    frames (a 4-byte length, then as many bytes; at most :data:`MAX_FRAME`; length 0 ends the
    stream), and poprun acknowledges what it has every :data:`ACK_EVERY` bytes and at the end.
    A connection that breaks before the stream's end leaves it broken, not ended: the wrapper,
    which keeps what was not acknowledged, connects again (the same greeting) and sends on from
    where poprun has it, so no byte is lost or passed on twice. A stream still broken at the end
    is in :attr:`lost` (PR414). A connection that breaks the protocol (a frame over
    :data:`MAX_FRAME`) is closed, its stream broken.
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
        self._streams: dict[tuple[int, Stream], _Stream] = {}
        self.refused: dict[str, int] = {}  # address -> connections refused (no wrapper's greeting, a wrong token)
        self.lost: list[tuple[tuple[int, Stream], int, str]] = []  # (stream, bytes that arrived, why): set by close()
        self.resumed = 0  # connections that resumed a broken stream
        self.reconnect_s = max(RECONNECT_S, round(keepalive_s))  # how long a wrapper tries to connect again

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
        return {key[0] for key, s in self._streams.items() if s.conn is not None and not s.ended}

    def open_streams(self) -> int:
        """Return how many instance streams have not ended yet (connected, or broken and waiting for their wrapper)."""
        return sum(1 for s in self._streams.values() if not s.ended)

    def awaited(self) -> bool:
        """Return whether a broken stream may still be resumed: its wrapper tries again for :attr:`reconnect_s`."""
        now = time.monotonic()
        return any(s.broke is not None and not s.ended and s.conn is None and now - s.broke < self.reconnect_s + 1
                   for s in self._streams.values())

    def ready(self, fd: int, *, feed: Callable[[int, Stream, bytes], None], end: Callable[[int, Stream], None],
              lost: Callable[[int], None]) -> None:
        """Handle ``fd``, which is readable: accept a connection, or read one."""
        if fd == self.listener.fileno():
            self._accept()
            return
        conn = self._connections.get(fd)
        if conn is None:  # closed while handling another of the same ready batch (replaced, or a stranger dropped)
            return
        try:
            data = conn.sock.recv(_READ)
        except BlockingIOError:
            return
        except OSError as exc:
            self._break(conn, exc.strerror or str(exc))
            if conn.key is not None and exc.errno in _LOST:  # its host stopped answering (PR411): not awaited
                self._streams[conn.key].broke = None
                lost(conn.key[0])
            return
        if conn.key is None:
            self._greet(conn, data)
        elif not data:
            self._break(conn, "it was closed before the end of the stream")  # the relay process ended
        else:
            self._frames(conn, data, feed, end)

    def _frames(self, conn: _Connection, data: bytes, feed: Callable[[int, Stream, bytes], None],
                end: Callable[[int, Stream], None]) -> None:
        """Read the frames in ``data`` (after what is left of the last read): pass on their bytes, take an end."""
        key = conn.key
        assert key is not None
        stream = self._streams[key]
        buffer = conn.buffer
        buffer += data
        view, at = memoryview(buffer), 0
        try:
            while len(buffer) - at >= _FRAME_HEAD:
                size = int.from_bytes(view[at:at + _FRAME_HEAD], "big")
                if size > MAX_FRAME:
                    self._break(conn, f"it sent a frame of {size} bytes (at most {MAX_FRAME}): not poprun's wrapper")
                    return
                if len(buffer) - at - _FRAME_HEAD < size:
                    break
                start, at = at + _FRAME_HEAD, at + _FRAME_HEAD + size
                if size == 0:
                    self._ended(conn, stream, end)
                    return
                if stream.ended:
                    self._break(conn, "it sent bytes after the end of the stream")
                    return
                stream.received += size
                feed(*key, bytes(view[start:at]))
        finally:
            view.release()
        del buffer[:at]
        if stream.received - stream.acked >= ACK_EVERY:
            self._ack(conn, stream)

    def _ack(self, conn: _Connection, stream: _Stream) -> None:
        with contextlib.suppress(OSError):  # a full buffer: the next one says more; a broken one: the next read sees it
            conn.sock.send(stream.received.to_bytes(8, "big"))
            stream.acked = stream.received

    def _ended(self, conn: _Connection, stream: _Stream, end: Callable[[int, Stream], None]) -> None:
        """Take the end of ``conn``'s stream: acknowledge all of it, close the connection, end the stream once."""
        key = conn.key
        assert key is not None
        self._ack(conn, stream)
        first = not stream.ended
        stream.ended, stream.broke, stream.conn = True, None, None
        self._close(conn)
        if first:
            end(*key)

    def _break(self, conn: _Connection, why: str) -> None:
        """Close ``conn``; its stream, unless it ended, is broken until its wrapper connects again."""
        self._close(conn)
        if conn.key is None:
            return
        stream = self._streams[conn.key]
        if stream.conn is conn and not stream.ended:
            stream.conn, stream.broke, stream.why = None, time.monotonic(), why

    def expire(self) -> None:
        """Drop connections that have not greeted within the allowed time (not a wrapper's)."""
        now = time.monotonic()
        for conn in [c for c in self._connections.values() if c.key is None and now - c.since > _GREETING_S]:
            self._refuse(conn)

    def close(self, end: Callable[[int, Stream], None]) -> None:
        """Accept what is waiting, then close every connection (ending its stream) and the listener; note what was lost."""
        self._accept()
        for conn in list(self._connections.values()):
            if conn.key is None:
                self._refuse(conn)  # a stranger's, still waiting to greet
            self._close(conn)
        for key, stream in sorted(self._streams.items()):
            if not stream.ended:
                if stream.conn is None:  # broken, and its wrapper did not come back
                    self.lost.append((key, stream.received, stream.why))
                stream.ended = True
                end(*key)
        if self._selector is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(self.listener)
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                sock, address = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # ECONNABORTED, EMFILE: try again on the next wake
                return
            sock.setblocking(False)  # noqa: FBT003 - the socket API
            conn = self._connections[sock.fileno()] = _Connection(sock)
            with contextlib.suppress(IndexError, TypeError):
                conn.peer = str(address[0]).removeprefix("::ffff:")
            if self._selector is not None:
                self._selector.register(sock, selectors.EVENT_READ, self._callback)
            waiting = [c for c in self._connections.values() if c.key is None]
            if len(waiting) > self.count * 2 + _STRANGERS:  # a flood of connections that do not greet: drop the oldest
                self._refuse(min(waiting, key=lambda c: c.since))

    def _greet(self, conn: _Connection, data: bytes) -> None:
        """Read the wrapper's greeting ``TOKEN INDEX STREAM``; acknowledge it with what poprun has, or drop a stranger."""
        conn.greeting += data
        line, newline, rest = conn.greeting.partition(b"\n")
        if not newline:
            if not data or len(conn.greeting) > _HEADER_MAX:
                self._refuse(conn)
            return
        words = line.split()
        key = _key(words[1:], self.count) if len(words) == 3 and secrets.compare_digest(  # noqa: PLR2004
            words[0], self.token.encode()) else None
        if key is None or rest:
            self._refuse(conn)
            return
        stream = self._streams.get(key)
        if stream is None:
            stream = self._streams[key] = _Stream()
            self.started.add(key[0])
            if conn.peer:
                self.peers[key[0]] = conn.peer
        else:  # its wrapper connects again: its old connection broke (poprun may not have noticed yet)
            self.resumed += 1
            if stream.conn is not None:  # reset, not closed: a wrapper takes a clean close for poprun's going
                with contextlib.suppress(OSError):
                    stream.conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
                self._close(stream.conn)
        conn.key, stream.conn, stream.broke = key, conn, None
        self._keep_alive(conn.sock)
        try:
            conn.sock.send(b"k" + stream.received.to_bytes(8, "big"))
            stream.acked = stream.received
        except OSError as exc:
            self._break(conn, exc.strerror or str(exc))

    def _refuse(self, conn: _Connection) -> None:
        """Close a connection that is not a wrapper's (no greeting in time, a wrong token, a bad greeting)."""
        self.refused[conn.peer or "?"] = self.refused.get(conn.peer or "?", 0) + 1
        self._close(conn)

    def _keep_alive(self, sock: socket.socket) -> None:
        """Probe a silent connection, so that a host that stops answering breaks it within the host timeout."""
        if not KEEPALIVE or sock.family not in (socket.AF_INET, socket.AF_INET6):
            return
        step = max(1, int(self._keepalive_s / 3))
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            for option, value in zip(KEEPALIVE, (step, step, 2), strict=True):
                sock.setsockopt(socket.IPPROTO_TCP, option, value)

    def _close(self, conn: _Connection) -> None:
        if self._connections.pop(conn.sock.fileno(), None) is None:
            return
        if self._selector is not None:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(conn.sock)
        conn.sock.close()


def output_lost(lost: list[tuple[tuple[int, Stream], int, str]], hosts: list[str], reconnect_s: int) -> list[Diagnostic]:
    """Return PR414 for each stream whose connection broke and did not come back: ``(stream, bytes that arrived, why)``."""
    from poprun.core.diagnostic import error
    from poprun.core.span import SourceSpan

    return [error("PR414", f"output of instance {index} lost on its way to poprun",
                  detail=f"the connection of instance {index}'s {stream} on {hosts[index]} broke after {received} "
                         f"bytes ({why}) and its relay did not connect again within {reconnect_s} s: what the "
                         "instance wrote after that did not arrive",
                  span=SourceSpan.environment(f"instance {index}"),
                  hint=f"check the network between this machine and {hosts[index]} (a firewall or NAT that drops or "
                       "resets connections) and that nothing there kills poprun's relay process (a child of the "
                       "instance's wrapper, in a session of its own); --output-filename's files lack that output too")
            for (index, stream), received, why in lost]


def relay_refused(refused: dict[str, int]) -> Diagnostic:
    """Return PR415: connections to the relay's port that were not a wrapper's were refused (``address -> count``)."""
    from poprun.core.diagnostic import warning
    from poprun.core.span import SourceSpan

    count = sum(refused.values())
    where = ", ".join(f"{address} ({n})" if n > 1 else address for address, n in sorted(refused.items())[:5])
    more = f" and {len(refused) - 5} more addresses" if len(refused) > 5 else ""  # noqa: PLR2004
    return warning("PR415", "connections to the output relay refused",
                   detail=f"{count} connection{'s' if count > 1 else ''} to poprun's output relay did not authenticate "
                          f"as an instance and {'were' if count > 1 else 'was'} closed, from {where}{more}; no "
                          "instance's output was taken from them",
                   span=SourceSpan.environment("the output relay"),
                   hint="something else connects to the port poprun listens on for its instances' output (a port "
                        "scanner, a health check, another user): harmless to the run, but worth knowing about")


def through_mpirun(indices: list[int], hosts: list[str]) -> Diagnostic:
    """Return PR416: the output of ``indices`` went through mpirun (their wrappers could not reach poprun's relay)."""
    from poprun.core.diagnostic import warning
    from poprun.core.span import SourceSpan

    named = ", ".join(f"{i} on {hosts[i]}" for i in indices)
    many = len(indices) > 1
    return warning("PR416", "instance output went through mpirun",
                   detail=f"the relay wrapper of instance{'s' if many else ''} {named} could not connect to poprun's "
                          f"output relay, so {'their' if many else 'its'} output went through mpirun's --tag-output, "
                          "which loses lines of bulk output and may cut long lines",
                   span=SourceSpan.environment("the output relay"),
                   hint="let those hosts connect back to this machine on the relay's port (a firewall between them), "
                        "and give them python3 (or poprun's Python at the same path)")


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
