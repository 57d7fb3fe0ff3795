"""
Hostile V-IPU servers for tests: real TCP listeners on 127.0.0.1 that answer with what a test scripts.

A :class:`HostileServer` accepts connections in a thread, reads each HTTP request (its head and the
body its Content-Length announces) and hands the socket to a behaviour: send these bytes, trickle
them one at a time, say nothing, or stream without end. It stands in for a broken or malicious
server (a proxy's error page, a wrong program on the port, a slowloris), which the emulated
service itself never is.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable
from typing import Self

Behaviour = Callable[[socket.socket, threading.Event], None]


def read_request(conn: socket.socket) -> bytes:
    """Read one request (head, then the body its Content-Length announces); return the head."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head


class HostileServer:
    """A listener on a free port of 127.0.0.1 that treats every connection with ``behaviour``."""

    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self.stopped = threading.Event()
        self.requests: list[bytes] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.port = int(self._listener.getsockname()[1])
        self._threads: list[threading.Thread] = []
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def _accept(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            worker = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(worker)
            worker.start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10)
            with contextlib.suppress(OSError):
                self.requests.append(read_request(conn))
                self.behaviour(conn, self.stopped)

    def close(self) -> None:
        """Stop accepting, end every behaviour, and close the listener."""
        self.stopped.set()
        self._accepting.join(5)
        for worker in self._threads:
            worker.join(5)
        self._listener.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def reply(raw: bytes) -> Behaviour:
    """Send ``raw`` at once, then close."""
    def behave(conn: socket.socket, _stop: threading.Event) -> None:
        conn.sendall(raw)
    return behave


def http(status: str, body: bytes, *headers: str) -> bytes:
    """Return a complete HTTP/1.1 answer with a Content-Length."""
    head = [f"HTTP/1.1 {status}", "Content-Type: application/json", f"Content-Length: {len(body)}",
            "Connection: close", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def trickle(raw: bytes, *, every_s: float = 0.05) -> Behaviour:
    """Send ``raw`` one byte every ``every_s`` (a slowloris server), then keep trickling spaces."""
    def behave(conn: socket.socket, stop: threading.Event) -> None:
        for byte in raw:
            if stop.wait(every_s):
                return
            conn.sendall(bytes([byte]))
        while not stop.wait(every_s):
            conn.sendall(b" ")
    return behave


def silent(conn: socket.socket, stop: threading.Event) -> None:
    """Read the request and never answer (until the test ends)."""
    stop.wait(60)


def endless(head: bytes) -> Behaviour:
    """Send ``head``, then stream bytes until the client goes away (a huge body)."""
    def behave(conn: socket.socket, stop: threading.Event) -> None:
        conn.sendall(head)
        block = b"[" * 65536
        while not stop.is_set():
            conn.sendall(block)
    return behave
