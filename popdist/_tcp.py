"""
The standard-library TCP backend's barriers, relayed by instance 0 (:class:`TcpHub`) for the others.

Standalone: standard library only; never imports ``poprun``; imported by ``popdist.init()`` only,
through :mod:`popdist._rendezvous`, which connects the instances. In a barrier, each member of
the group tells instance 0, which releases them all when the last has arrived. Instance 0 relays
while it is itself in a barrier (or closing), so a barrier among instances without instance 0
completes once instance 0 next waits in one (``execute_on_instances`` always ends in one).
A hub or spoke that fails a barrier closes its connections, so the others fail at once too
instead of waiting. Wire format: one JSON object per line (``barrier`` and ``release`` here).
Nothing touches the disk.
"""

from __future__ import annotations

import json
import selectors
import socket
import time

from popdist._contract import BackendError

TYPE_CHECKING = False
if TYPE_CHECKING:
    Key = tuple[tuple[int, ...], int]
    Message = dict[str, object]


class Link:
    """One connection, read and written one JSON line at a time."""

    def __init__(self, sock: socket.socket, peer: int) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self.peer = peer
        self._buffer = b""

    def send(self, message: Message) -> None:
        """Write one message."""
        self.sock.sendall(json.dumps(message).encode() + b"\n")

    def read_available(self) -> list[Message]:
        """Read what one ``recv`` brings; return the complete messages. Raises EOFError when closed."""
        chunk = self.sock.recv(65536)
        if not chunk:
            raise EOFError
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        return [_decode(line) for line in lines]

    def receive(self, deadline: float | None) -> Message:
        """Return the next message, waiting until ``deadline`` (TimeoutError after it)."""
        while b"\n" not in self._buffer:
            self.sock.settimeout(remaining(deadline))
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return _decode(line)


def _decode(line: bytes) -> Message:
    message = json.loads(line)
    if not isinstance(message, dict):
        raise BackendError(f"unexpected message from another instance: {line!r}")
    return message


def deadline_after(timeout_s: float | None) -> float | None:
    return None if timeout_s is None else time.monotonic() + timeout_s


def remaining(deadline: float | None) -> float | None:
    """Return the seconds left before ``deadline`` (None: no limit); TimeoutError when none are."""
    if deadline is None:
        return None
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    return left


def _next_key(counters: dict[tuple[int, ...], int], group: frozenset[int]) -> Key:
    """Return the key of this instance's next barrier of ``group``: the members and a sequence number."""
    members = tuple(sorted(group))
    counters[members] = counters.get(members, 0) + 1
    return members, counters[members]


class TcpHub:
    """Instance 0: holds a link to every other instance and relays their barriers."""

    name = "tcp"

    def __init__(self, links: dict[int, Link], count: int) -> None:
        self._links = links
        self._count = count
        self._counters: dict[tuple[int, ...], int] = {}
        self._arrived: dict[Key, set[int]] = {}
        self._released: set[Key] = set()
        self._broken = False
        self._closed = False
        self._selector = selectors.DefaultSelector()
        for link in links.values():
            self._selector.register(link.sock, selectors.EVENT_READ, link)

    def barrier(self, group: frozenset[int], timeout_s: float | None) -> None:
        """Arrive at the barrier of ``group``; relay every instance's barriers until it is released."""
        _refuse_if_broken(self._broken)
        key = _next_key(self._counters, group)
        self._arrive(key, 0)
        deadline = deadline_after(timeout_s)
        try:
            while key not in self._released:
                self._pump(deadline, key)
        except BaseException:
            # The others must not wait for a hub that gave up: closing the links wakes them.
            self._broken = True
            self._drop()
            raise
        self._released.discard(key)

    def _arrive(self, key: Key, who: int) -> None:
        members, seq = key
        arrived = self._arrived.setdefault(key, set())
        arrived.add(who)
        if len(arrived) < len(members):
            return
        del self._arrived[key]
        for member in members:
            if member == 0:
                self._released.add(key)
                continue
            try:
                self._links[member].send({"op": "release", "group": list(members), "seq": seq})
            except OSError as exc:
                raise BackendError(f"instance {member} left (it exited or failed) before a barrier of instances "
                                   f"{list(members)} ended") from exc

    def _pump(self, deadline: float | None, waiting: Key) -> None:
        """Handle the messages that arrive before ``deadline``."""
        try:
            events = self._selector.select(remaining(deadline))
        except TimeoutError:
            events = []
        if not events:
            missing = sorted(set(waiting[0]) - self._arrived.get(waiting, set()))
            raise BackendError(f"barrier of instances {list(waiting[0])} timed out waiting for instances {missing}")
        for selected, _ in events:
            link: Link = selected.data
            try:
                messages = link.read_available()
            except (EOFError, OSError) as exc:
                raise BackendError(f"instance {link.peer} left (it exited or failed) while instance 0 waited in a "
                                   f"barrier of instances {list(waiting[0])}") from exc
            for message in messages:
                self._arrive(_barrier_key(message, link.peer), link.peer)

    def close(self) -> None:
        """Wait for every instance to close (unless a barrier failed), then drop the links."""
        try:
            if not self._broken and not self._closed:
                self.barrier(frozenset(range(self._count)), None)
        finally:
            self._drop()

    def _drop(self) -> None:
        if not self._closed:
            self._closed = True
            self._selector.close()
            for link in self._links.values():
                link.sock.close()


def _refuse_if_broken(broken: bool) -> None:
    """Raise when an earlier barrier failed: the connections are gone, and the instances out of step."""
    if broken:
        raise BackendError("popdist's TCP backend failed earlier, so it cannot hold a barrier; restart the launch")


def _barrier_key(message: Message, peer: int) -> Key:
    """Return the barrier ``message`` from ``peer`` arrives at."""
    group, seq = message.get("group"), message.get("seq")
    if message.get("op") != "barrier" or not isinstance(group, list) or not isinstance(seq, int) \
            or peer not in group:
        raise BackendError(f"unexpected message from instance {peer}: {message}")
    return tuple(int(i) for i in group), seq


class TcpSpoke:
    """Any instance but 0: one link to instance 0."""

    name = "tcp"

    def __init__(self, link: Link, index: int, count: int) -> None:
        self._link = link
        self._index = index
        self._count = count
        self._counters: dict[tuple[int, ...], int] = {}
        self._broken = False
        self._closed = False

    def barrier(self, group: frozenset[int], timeout_s: float | None) -> None:
        """Tell instance 0 this instance arrived; return when it releases the barrier."""
        _refuse_if_broken(self._broken)
        members, seq = _next_key(self._counters, group)
        expected: Message = {"op": "release", "group": list(members), "seq": seq}
        try:
            self._link.send({"op": "barrier", "group": list(members), "seq": seq})
            reply = self._link.receive(deadline_after(timeout_s))
        except TimeoutError as exc:
            raise self._fail(f"barrier of instances {list(members)} timed out after {timeout_s} s") from exc
        except (EOFError, OSError, ValueError) as exc:
            raise self._fail(f"instance 0 left (it exited, failed or gave up) while instance {self._index} waited "
                             f"in a barrier of instances {list(members)}") from exc
        if reply != expected:
            raise self._fail(f"instances out of step: expected {expected}, got {reply}")

    def _fail(self, message: str) -> BackendError:
        """Return the error to raise, having closed the link: a broken spoke takes no further part."""
        self._broken = True
        self._link.sock.close()
        return BackendError(message)

    def close(self) -> None:
        """Wait for every instance to close (unless a barrier failed), then drop the link."""
        closing, self._closed = not self._closed, True
        try:
            if closing and not self._broken:
                self.barrier(frozenset(range(self._count)), None)
        finally:
            self._link.sock.close()
