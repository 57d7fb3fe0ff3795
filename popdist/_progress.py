r"""
Progress and heartbeats: how an instance tells poprun how it is doing, one UDP datagram at a time.

Layer: standalone, like all of popdist: the standard library only; never imports ``poprun``.
Imported on the first use of ``popdist.progress`` or ``popdist.heartbeat`` (``import popdist``
does not import it); ``socket`` and ``json`` come with the first call that has somewhere to
send, never without ``POPRUN_PROGRESS``. poprun's reader of what this writes is
``poprun/core/progress.py``: the two keep to the format below.

- ``progress(step, total=None, *, step_time=None, **metrics)``: this instance finished step
  ``step`` (of ``total``, when known); ``step_time`` is its own measure of a step in seconds
  (else poprun takes the time between steps); ``metrics`` are a few names and values to show.
- ``heartbeat()``: alive, no step (a long step, an evaluation, a checkpoint being written).

Both return None at once, whatever they are given, and never raise. Without
``POPRUN_PROGRESS`` (a program run without poprun, or a run without a receiver) both are
no-ops that cost one dictionary lookup after the first call.

The wire format, version 1
--------------------------

One UDP datagram per send, at most 1,400 bytes (below any path's MTU: never fragmented)::

    b"PRP1 " + TOKEN + b" " + JSON

``TOKEN`` is ``POPRUN_PROGRESS_TOKEN`` (32 lowercase hex characters, random per run): poprun
drops a datagram without its run's token. ``JSON`` is one compact object
(``separators=(",", ":")``, ASCII only: every other character ``\uXXXX``-escaped; never NaN or
Infinity):

=====  ====================  ==================================================================
key    value                 meaning
=====  ====================  ==================================================================
``i``  int, 0 to 2**31-1     the instance index (``POPDIST_INSTANCE_INDEX``, as
                             ``popdist.getInstanceIndex()`` reads it)
``a``  int, 0 to 2**31-1     the attempt (``POPRUN_RESTART_COUNT``; 0 when unset)
``k``  ``"p"`` or ``"h"``    progress, or a heartbeat only
``s``  int or finite float   the step (``"p"`` only); an int beyond +-2**63 is sent as a float
``n``  int >= 0 or null      the total (``"p"`` only); null when not given or not a whole number
                             from 0 to 2**31-1
``t``  float                 the instance's ``time.time()`` when the (last coalesced) call was made
``c``  int, 1 to 2**31-1     the calls this datagram stands for: made since the last one sent
``d``  float >= 0            the step time the caller gave (``step_time=``) in seconds; absent
                             when not given, negative or not finite
``m``  object                metrics: string keys of at most 64 characters to a finite number
                             (booleans as 0 and 1), null, or a string of at most 64 characters;
                             absent when there are none
``x``  int, 1 to 2**31-1     metrics left out (they did not fit the 1,400 bytes, or their key
                             could not be made a string, or repeated one); absent when none
=====  ====================  ==================================================================

Values are converted when a datagram is sent, not at the call: an ``int`` or ``float`` as it
is; a ``bool`` as 0 or 1; anything else through ``operator.index`` then ``float`` (``Decimal``,
NumPy scalars, a one-element tensor: a GPU tensor synchronises then, at most ten times a
second, not at every step). A step that cannot be made a finite number (NaN, infinity, an
object whose ``__float__`` raises, a string) turns that datagram into a heartbeat (``"k":"h"``,
its metrics kept): the instance is alive, its step unknown. A metric value that is not a number
is its ``str()`` cut to 64 characters (a list, tuple, dict or set: ``<list of N>``; bytes: their
first 64), or null when even that raises; NaN and infinities are null. Keys are cut to 64 characters (``**metrics`` keys are always strings: Python refuses any
other keyword at the call, before popdist runs); metrics are taken in the order given until the
next does not fit, and the rest are counted in ``x``.

Coalescing
----------

A call sends at once when at least 0.1 s passed since the last send (or the clock was set
back by more than that), or when it is the process's first call, or when ``step == total``
(at most once a second, so that a program calling ``progress(total, total)`` in a loop is no
flood). Otherwise it only keeps the latest
state (the next sending call, or the process's exit through ``atexit``, sends it, with ``c``
counting every call in between). So an instance sends at most about 10 datagrams a second
whatever it calls, and a call that does not send costs a clock read and storing one tuple
(``bench/progress_bench.py`` measures it). A heartbeat never hides progress: while a progress
call waits unsent, a heartbeat only adds to its count. The last state before a hang may wait
unsent: poprun sees the instance fall silent, which is the point of heartbeats.

Never blocking, never failing
-----------------------------

The socket is an unconnected, non-blocking UDP socket (``sendto`` with ``MSG_DONTWAIT``): a
full buffer (EAGAIN, ENOBUFS), poprun gone (an unconnected socket gets no ECONNREFUSED), no
route, or any other error drops that datagram, and the next send tries again. A
``POPRUN_PROGRESS`` that is malformed, a token that is not 32 lowercase hex characters, or an
index or attempt out of range turn popdist's progress off for the process. A host name in
``POPRUN_PROGRESS`` is resolved once, on a thread of its own (calls go on meanwhile,
coalescing); one that does not resolve turns progress off. A numeric address is never looked up.

- **Threads**: calls from any number of threads are safe; sending takes a lock without waiting
  for it (a thread that finds another sending leaves its state for the next call), so a signal
  handler that calls ``progress`` while the interrupted code was sending cannot deadlock.
- **fork()**: a child starts afresh (``os.register_at_fork``): its own socket, its own
  coalescing, its first call sent at once, under the same instance index.
- **The program's file descriptors**: before each send popdist checks (``fstat``'s device and
  inode) that its descriptor is still its socket. A program that closed it (``os.closerange``)
  or put another file or socket on that number (``dup2``) keeps it: popdist forgets the number
  without closing it, never writes to it, and opens a new socket for the next send.
- **Exit**: the state still waiting is sent by an ``atexit`` handler. ``os._exit``, a fatal
  signal or SIGKILL lose it (at most the last 0.1 s of calls).
"""

from __future__ import annotations

import atexit
import os
from _thread import allocate_lock, start_new_thread
from itertools import count
from time import time as _time

from popdist import _contract

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping
    from socket import socket
    from typing import Any, Literal

    State = tuple[int, float, object, object, object, "Mapping[Any, object] | None"]

__all__ = ["heartbeat", "progress"]

MAGIC = b"PRP1 "
MAX_DATAGRAM = 1400
MAX_TEXT = 64  # characters of a metric's key or string value
INTERVAL_S = 0.1  # the least time between two sends
FINAL_INTERVAL_S = 1.0  # the least time between two sends forced by step == total
MAX_COUNT = 2**31 - 1  # i, a, c, n and x are at most this
_MAX_INT = 2**63 - 1  # a larger step or metric goes as a float
_MAX_EXAMINED = 512  # metrics looked at per datagram: each takes at least 6 bytes, so no more fit
_BEAT = object()  # the step of a heartbeat
_DUE, _FORCED, _EXIT = 0, 1, 2  # why a send: INTERVAL_S passed; step == total; the process exits


def progress(step: object, total: object = None, *, step_time: object = None, **metrics: object) -> None:
    """
    Tell poprun that this instance finished step ``step`` (of ``total``); return at once.

    Never raises and never blocks; a no-op without ``POPRUN_PROGRESS``. Coalesced: at most
    about ten datagrams a second are sent, each with the latest call's values (see the module's
    documentation for the format and the rules).

    Args:
        step: the step just finished (an int, or a finite float: ``epoch + batch / batches``).
        total: the steps of the whole run (an int), for poprun's ETA; None when unknown.
        step_time: this instance's own measure of a step, in seconds (poprun otherwise takes
            the time between steps).
        **metrics: a few names and values to show (``loss=0.12``, ``lr=1e-3``): numbers, or
            short strings; converted when sent, so a tensor costs nothing on other steps.
    """
    global _OWN  # noqa: PLW0603 - one flag per process: the program reports its own steps
    sender = _SENDER
    if not sender and (sender is False or not (sender := _start())):
        return
    _OWN = True
    try:
        now = _time()
        sender.pending = (next(sender.calls), now, step, total, step_time, metrics)
        if -INTERVAL_S < now - sender.last < INTERVAL_S:
            if total is not None and not -FINAL_INTERVAL_S < now - sender.forced < FINAL_INTERVAL_S and step == total:
                sender.flush(now, _FORCED)
            return
        sender.flush(now, _DUE)
    except Exception:  # noqa: BLE001, S110 - popdist never fails the program: a call that went wrong is dropped
        pass


def heartbeat() -> None:
    """
    Tell poprun that this instance is alive, without a step; return at once.

    For a long step, an evaluation or a checkpoint between progress calls. Never raises, never
    blocks; a no-op without ``POPRUN_PROGRESS``; coalesced with :func:`progress` (a heartbeat
    never hides a progress call still waiting to be sent: it only adds to its count).
    """
    sender = _SENDER
    if not sender and (sender is False or not (sender := _start())):
        return
    try:  # noqa: SIM105 - contextlib would be an import more
        _beat(sender, _time())
    except Exception:  # noqa: BLE001, S110 - as in progress()
        pass


def _beat(sender: _Sender, now: float) -> None:
    """Count a heartbeat at ``now``, and send when it is time."""
    calls, pending = next(sender.calls), sender.pending
    if pending is not None and pending[0] > sender.sent and pending[2] is not _BEAT:
        sender.pending = (calls, *pending[1:])  # the progress waiting stays; this call counts
    else:
        sender.pending = (calls, now, _BEAT, None, None, None)
    if not -INTERVAL_S < now - sender.last < INTERVAL_S:
        sender.flush(now, _DUE)


def report(step: int, total: int | None, **metrics: object) -> None:
    """
    Report ``step`` of ``total`` for a helper of popdist (``popdist.torch``'s data loader).

    Until the program calls :func:`progress` itself, this is a progress call; once it has, the
    program's own steps win and this is a :func:`heartbeat`, so the two never interleave.
    """
    if _OWN:
        heartbeat()
        return
    sender = _SENDER
    if not sender and (sender is False or not (sender := _start())):
        return
    try:
        now = _time()
        sender.pending = (next(sender.calls), now, step, total, None, metrics)
        if not -INTERVAL_S < now - sender.last < INTERVAL_S:
            sender.flush(now, _DUE)
        elif not -FINAL_INTERVAL_S < now - sender.forced < FINAL_INTERVAL_S and step == total:
            sender.flush(now, _FORCED)
    except Exception:  # noqa: BLE001, S110 - as in progress()
        pass


class _Sender:
    """
    The process's channel to poprun: where to send, the socket, and the state waiting to be sent.

    ``pending`` is replaced whole by each call (one store: threads and signal handlers see one
    call's values or another's, never a mix); ``calls`` numbers the calls, so that ``c`` is the
    difference between the numbers of two sent states; ``lock`` is only ever tried, never waited for.
    """

    __slots__ = ("address", "attempt", "calls", "family", "forced", "head", "identity", "index", "last", "lock",
                 "pending", "sent", "sock")

    def __init__(self, head: bytes, index: int, attempt: int) -> None:
        self.head = head
        self.index = index
        self.attempt = attempt
        self.calls = count(1)
        self.pending: State | None = None
        self.sent = 0  # the number of the last call sent
        self.last = float("-inf")  # time.time() of the last send
        self.forced = float("-inf")  # of the last send forced by step == total
        self.lock = allocate_lock()
        self.family = 0
        self.address: tuple[Any, ...] | None = None  # None while a host name is being resolved
        self.sock: socket | None = None
        self.identity = (0, 0)  # (st_dev, st_ino) of the socket's descriptor

    def flush(self, now: float, why: int) -> None:
        """
        Send the pending state ``why`` (:data:`_DUE`, :data:`_FORCED`, :data:`_EXIT`), unless it is not due after all.

        Not due: it was sent; another thread is sending; since a send of that kind less than its
        interval passed (checked again under the lock: threads race to the same send); the
        address is still being resolved (then the state waits for the next call).
        """
        if not self.lock.acquire(False):  # noqa: FBT003 - never wait: a signal handler may be interrupting the holder
            return
        try:
            if why == _DUE and -INTERVAL_S < now - self.last < INTERVAL_S:
                return
            if why == _FORCED and -FINAL_INTERVAL_S < now - self.forced < FINAL_INTERVAL_S:
                return
            state = self.pending
            if state is None or state[0] <= self.sent or self.address is None:
                return
            self.last = now
            if why == _FORCED:
                self.forced = now
            calls, self.sent = state[0] - self.sent, state[0]
            self._send(datagram(self.head, self.index, self.attempt, state, calls))
        except Exception:  # noqa: BLE001, S110 - the datagram is dropped; the next send tries again
            pass
        finally:
            self.lock.release()

    def _send(self, data: bytes) -> None:
        """Send ``data`` through this process's own socket, opening one when it has none (or lost it)."""
        import socket

        sock, address = self.sock, self.address
        if address is None:  # still being resolved (flush checked; a fork may have raced it)
            return
        if sock is not None and not self.owns(sock):
            sock.detach()  # the program closed our descriptor or put its own there: forget it, never close it
            sock = self.sock = None
        if sock is None:
            sock = socket.socket(self.family, socket.SOCK_DGRAM | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC)
            stat = os.fstat(sock.fileno())
            self.sock, self.identity = sock, (stat.st_dev, stat.st_ino)
        sock.sendto(data, socket.MSG_DONTWAIT, address)

    def owns(self, sock: socket) -> bool:
        """Return whether ``sock``'s descriptor is still the socket this sender opened."""
        try:
            stat = os.fstat(sock.fileno())
        except (OSError, ValueError):
            return False
        return (stat.st_dev, stat.st_ino) == self.identity

    def release(self) -> None:
        """Close the socket if its descriptor is still ours; else forget it without closing."""
        sock, self.sock = self.sock, None
        if sock is not None:
            if self.owns(sock):
                sock.close()
            else:
                sock.detach()

    def resolve(self, host: str, port: int) -> None:
        """Find the address to send to: a numeric one at once, a name on a thread of its own (once)."""
        import socket

        try:
            found = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM,
                                       flags=socket.AI_NUMERICHOST | socket.AI_NUMERICSERV)
        except (OSError, UnicodeError):
            start_new_thread(self._look_up, (host, port))
            return
        self.family, self.address = found[0][0], found[0][4]

    def _look_up(self, host: str, port: int) -> None:
        """Resolve the host name ``host`` (its own thread); turn progress off when it does not resolve."""
        global _SENDER  # noqa: PLW0603 - off for this process
        import socket

        try:
            found = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM, flags=socket.AI_NUMERICSERV)
            self.family, self.address = found[0][0], found[0][4]
        except Exception:  # noqa: BLE001 - whatever the resolver says, no address is no progress
            if _SENDER is self:
                _SENDER = False


def datagram(head: bytes, index: int, attempt: int, state: State, calls: int) -> bytes:
    """Return the datagram of ``state`` (see the module's documentation), at most :data:`MAX_DATAGRAM` bytes."""
    _, when, step, total, step_time, metrics = state
    number = None if step is _BEAT else _number(step)
    fields = [f'{{"i":{index},"a":{attempt}']
    if number is None:
        fields.append(',"k":"h"')
    else:
        whole = _number(total) if total is not None else None
        if type(whole) is float and whole.is_integer():
            whole = int(whole)
        n = whole if type(whole) is int and 0 <= whole <= MAX_COUNT else None
        fields.append(f',"k":"p","s":{number!r},"n":{"null" if n is None else n}')
    fields.append(f',"t":{float(when)!r},"c":{min(calls, MAX_COUNT)}')
    seconds = None if step_time is None else _number(step_time)
    if seconds is not None and seconds >= 0:
        fields.append(f',"d":{float(seconds)!r}')
    base = "".join(fields)
    room = MAX_DATAGRAM - len(head) - len(base) - len(',"m":{},"x":') - len(str(MAX_COUNT)) - len("}")
    kept, left = _metrics(metrics or {}, room)
    body = base + (',"m":{' + ",".join(kept) + "}" if kept else "") + (f',"x":{min(left, MAX_COUNT)}' if left else "")
    return head + body.encode("ascii") + b"}"


def _metrics(metrics: Mapping[Any, object], room: int) -> tuple[list[str], int]:
    """Return the JSON members of the ``metrics`` that fit in ``room`` characters, and how many were left out."""
    from json.encoder import encode_basestring_ascii as quoted

    kept: list[str] = []
    keys: set[str] = set()
    for examined, (key, value) in enumerate(metrics.items()):
        if examined == _MAX_EXAMINED:
            break
        try:
            name = _text(key)
            if name in keys:
                continue
            member = f"{quoted(name)}:{_metric(value, quoted)}"
        except Exception:  # noqa: BLE001, S112 - a key that cannot be a string is left out (and counted)
            continue
        if len(member) + 1 > room:
            break
        room -= len(member) + 1
        kept.append(member)
        keys.add(name)
    return kept, len(metrics) - len(kept)


def _metric(value: object, quoted: Callable[[str], str]) -> str:
    """Return ``value`` as a metric's JSON value: a finite number, null, or a string of at most 64 characters."""
    if value is None:
        return "null"
    if isinstance(value, str):
        return quoted(_text(value))
    number = _number(value)
    if number is not None:
        return repr(number)
    if not isinstance(value, bytes | bytearray):
        try:
            float(value)  # type: ignore[arg-type] # a number after all: NaN, an infinity
        except OverflowError:
            return "null"  # an int too large for a float
        except Exception:  # noqa: BLE001 - not a float: a signalling NaN (Decimal's), or not a number
            if _is_nan(value):
                return "null"
        else:
            return "null"
    try:
        return quoted(_text(value))
    except Exception:  # noqa: BLE001 - neither a number nor printable
        return "null"


def _text(value: object) -> str:
    """
    Return ``value`` as text of at most :data:`MAX_TEXT` characters, at a cost that does not grow with it.

    A string (a subclass's own methods never called) or bytes: their first characters; a
    container: its type and length (``<list of 3>``: ``str()`` of a million items would take
    long); anything else: its ``str()``, cut.
    """
    if isinstance(value, str):
        return str.__getitem__(value, slice(0, MAX_TEXT))
    if isinstance(value, bytes | bytearray | memoryview):
        return str(bytes(value[:MAX_TEXT]))[:MAX_TEXT]
    if isinstance(value, list | tuple | dict | set | frozenset):
        return f"<{type(value).__name__} of {len(value)}>"
    return str(value)[:MAX_TEXT]


def _is_nan(value: object) -> bool:
    """Return whether ``value`` says it is a NaN (``Decimal("sNaN")``, which ``float()`` refuses)."""
    try:
        return value.is_nan() is True  # type: ignore[attr-defined] # Decimal's, or whatever says so
    except Exception:  # noqa: BLE001 - no such method, or a hostile one
        return False


def _number(value: object) -> int | float | None:
    """Return ``value`` as an int within +-2**63 or a finite float; None when it is not a number or not finite."""
    kind = type(value)
    if kind is float:
        return value if value - value == 0 else None  # type: ignore[operator,return-value] # a float, checked
    if kind is int:
        whole: int = value  # type: ignore[assignment] # checked
    elif isinstance(value, str | bytes | bytearray):
        return None
    else:
        import operator

        try:
            whole = int.__int__(operator.index(value))  # type: ignore[arg-type] # bool, NumPy and tensor integers, exactly int
        except Exception:  # noqa: BLE001 - not an integer: a float, perhaps
            try:
                number = float(value)  # type: ignore[arg-type] # Decimal, NumPy floats, one-element tensors
            except Exception:  # noqa: BLE001 - not a number at all
                return None
            return number if number - number == 0 else None
    if -_MAX_INT <= whole <= _MAX_INT:
        return whole
    try:
        number = float(whole)
    except OverflowError:
        return None
    return number if number - number == 0 else None


def _start() -> _Sender | Literal[False]:
    """
    Make this process's sender from its environment (once); False, progress off, when there is none.

    A call that comes while another is making it (another thread, or a signal handler
    interrupting the code that was making it) is dropped, rather than making a second sender:
    the lock is only tried, never waited for (a flag tested, then set, is one step only while
    the interpreter switches threads at calls and jumps alone; a free-threaded one does not).
    The calls dropped so are those of the first moments (the sender imports json and socket).
    """
    global _SENDER  # noqa: PLW0603 - once per process (and again in a forked child)
    if not _STARTING.acquire(False):  # noqa: FBT003 - never wait (a signal handler may be interrupting the holder)
        return False
    try:
        current = _SENDER
        if current is not None:  # made meanwhile, by the thread that held the lock before
            return current
        try:
            sender: _Sender | Literal[False] = _configure(os.environ)
        except Exception:  # noqa: BLE001 - an environment we cannot read is no progress
            sender = False
        _SENDER = sender
        return sender
    finally:
        _STARTING.release()


def _configure(env: Mapping[str, str]) -> _Sender | Literal[False]:
    """Return the sender that ``env`` describes, or False when it names no receiver or a malformed one."""
    where, token = env.get(_contract.PROGRESS), env.get(_contract.PROGRESS_TOKEN, "")
    if not where or len(token) != 32 or token.strip("0123456789abcdef"):  # noqa: PLR2004 - os.urandom(16).hex()
        return False
    address = parse_address(where, env)
    index, attempt = _contract.instance_index(env), max(_contract.integer(env, _contract.RESTART_COUNT, 0), 0)
    if address is None or not 0 <= index <= MAX_COUNT or attempt > MAX_COUNT:
        return False
    import json.encoder  # noqa: F401 - imported here, at the first call, never first inside a send (a signal handler's)
    import socket  # noqa: F401 - as json

    sender = _Sender(MAGIC + token.encode("ascii") + b" ", index, attempt)
    sender.resolve(*address)
    return sender


def parse_address(value: str, env: Mapping[str, str]) -> tuple[str, int] | None:
    """
    Return the (host, port) of a ``POPRUN_PROGRESS`` value, or None when it is malformed.

    ``HOST:PORT``, ``[IPV6]:PORT``, or ``:PORT``: then the host is ``$SLURM_SRUN_COMM_HOST``,
    else the first field of ``$SSH_CONNECTION``, else ``127.0.0.1``. An IPv6 address without
    brackets is malformed (its last colon would read as the port's).
    """
    value = value.strip()
    if value.startswith("["):
        host, bracket, port = value[1:].partition("]:")
        if not bracket or not host or "]" in host:
            return None
    else:
        host, colon, port = value.rpartition(":")
        if not colon or ":" in host or "[" in host or "]" in host:
            return None
        host = host or _fallback_host(env)
    if not (port.isascii() and port.isdigit() and len(port) <= 5 and 0 < int(port) < 65536):  # noqa: PLR2004
        return None
    return host, int(port)


def _fallback_host(env: Mapping[str, str]) -> str:
    """Return where poprun is when it did not say: Slurm's srun host, the ssh client, or this machine."""
    slurm = env.get("SLURM_SRUN_COMM_HOST", "").strip()
    ssh = env.get("SSH_CONNECTION", "").split()
    return slurm or (ssh[0] if ssh else "127.0.0.1")


def _at_exit() -> None:
    """Send the state still waiting, then close the socket (if its descriptor is still ours)."""
    sender = _SENDER
    if sender:
        sender.flush(_time(), _EXIT)
        sender.release()


def _forked() -> None:
    """In a forked child: start afresh at the next call (the parent's socket closed here, its state not sent)."""
    global _SENDER, _STARTING  # the child is a process of its own
    sender, _SENDER, _STARTING = _SENDER, None, allocate_lock()  # a thread of the parent may have held it
    if sender:
        sender.release()


_SENDER: _Sender | Literal[False] | None = None  # None: not yet looked; False: no progress in this process
_OWN = False  # whether the program called progress() itself (popdist's helpers then only beat)
_STARTING = allocate_lock()  # held while _start() makes the sender (a call meanwhile is dropped)
atexit.register(_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)
