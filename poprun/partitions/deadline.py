"""
Sockets with a total deadline: every blocking call waits at most until one moment, in all.

Layer: ``poprun.partitions``; the standard library only.

A socket timeout bounds each read, so a peer that sends one byte at a time (a slowloris) keeps
an exchange alive for ever. A :class:`DeadlineSocket` instead sets, before each call, the time
left until its ``deadline``: the whole exchange (connect, send, every read) ends by then. Both
sides of the emulated V-IPU service use it: the client for each request, the server for each
request it reads and answers. ``http.client`` and ``http.server`` read through
``socket.makefile``, whose reads call :meth:`DeadlineSocket.recv_into`, so they need no change.
"""

from __future__ import annotations

import math
import socket
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer, WriteableBuffer


class DeadlineSocket(socket.socket):
    """A socket whose blocking calls all end by ``deadline`` (a ``time.monotonic()`` value); TimeoutError after."""

    __slots__ = ("deadline",)

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.deadline = math.inf

    @classmethod
    def adopt(cls, sock: socket.socket) -> DeadlineSocket:
        """Return a DeadlineSocket on the connection of ``sock`` (which is detached from it)."""
        return cls(sock.family, sock.type, sock.proto, fileno=sock.detach())

    def start(self, seconds: float) -> None:
        """Set the deadline ``seconds`` from now."""
        self.deadline = time.monotonic() + seconds

    def _arm(self) -> None:
        """Set the socket timeout to the time left. Raises TimeoutError once the deadline has passed."""
        if self.deadline == math.inf:
            self.settimeout(None)
            return
        left = self.deadline - time.monotonic()
        if left <= 0:
            msg = "deadline passed"
            raise TimeoutError(msg)
        self.settimeout(left)

    def connect(self, address: object) -> None:
        """Connect, by the deadline."""
        self._arm()
        super().connect(address)  # type: ignore[arg-type]

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        """Receive, by the deadline."""
        self._arm()
        return super().recv(bufsize, flags)

    def recv_into(self, buffer: WriteableBuffer, nbytes: int = 0, flags: int = 0) -> int:
        """Receive into ``buffer``, by the deadline."""
        self._arm()
        return super().recv_into(buffer, nbytes, flags)

    def send(self, data: ReadableBuffer, flags: int = 0) -> int:
        """Send, by the deadline."""
        self._arm()
        return super().send(data, flags)

    def sendall(self, data: ReadableBuffer, flags: int = 0) -> None:
        """Send everything, by the deadline (Python bounds the whole sendall by the timeout)."""
        self._arm()
        super().sendall(data, flags)


def connect(host: str, port: int, deadline: float) -> DeadlineSocket:
    """
    Return a connected DeadlineSocket to ``host:port`` whose calls all end by ``deadline``.

    Raises OSError (TimeoutError once the deadline passes) and ValueError for an impossible address.
    """
    error: OSError | None = None
    for family, kind, proto, _, address in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        sock = DeadlineSocket(family, kind, proto)
        sock.deadline = deadline
        try:
            sock.connect(address)
        except OSError as exc:
            sock.close()
            error = exc
            if isinstance(exc, TimeoutError):
                break
            continue
        return sock
    raise error or OSError(f"no address for {host}")
