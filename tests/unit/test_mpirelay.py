"""poprun's end of the mpirun output relay, driven by real sockets: frames, acknowledgements, resuming, hostile peers."""

from __future__ import annotations

import selectors
import socket
import time

from poprun.backends.mpirun.mpirelay import ACK_EVERY, MAX_FRAME, Relay


class Peer:
    """A relay with a selector, and what it passed on."""

    def __init__(self, count: int = 2) -> None:
        self.relay = Relay(count=count, remote=False, keepalive_s=15)
        self.selector = selectors.DefaultSelector()
        self.relay.attach(self.selector, lambda _fd: None)
        self.fed: dict[tuple[int, str], bytes] = {}
        self.ended: list[tuple[int, str]] = []
        self.sockets: list[socket.socket] = []

    def close(self) -> None:
        """Close the relay (ending its streams) and every socket of the test."""
        self.relay.close(lambda _index, _stream: None)
        self.selector.close()
        for sock in self.sockets:
            sock.close()

    def pump(self, seconds: float = 0.3) -> None:
        """Handle what is readable for ``seconds``."""
        until = time.monotonic() + seconds
        while (left := until - time.monotonic()) > 0:
            for key, _ in self.selector.select(left):
                self.relay.ready(key.fd, feed=self._feed, end=lambda i, s: self.ended.append((i, s)),
                                 lost=lambda _index: None)

    def _feed(self, index: int, stream: str, data: bytes) -> None:
        self.fed[index, stream] = self.fed.get((index, stream), b"") + data

    def connect(self, greeting: bytes) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.relay.port))
        self.sockets.append(sock)
        sock.sendall(greeting)
        return sock

    def wrapper(self, index: int, stream: str) -> tuple[socket.socket, int]:
        """Connect as a wrapper; return the socket and what poprun says it has."""
        sock = self.connect(f"{self.relay.token} {index} {stream}\n".encode())
        self.pump(0.2)
        answer = sock.recv(9)
        assert answer[:1] == b"k"
        return sock, int.from_bytes(answer[1:], "big")


def frame(data: bytes) -> bytes:
    return len(data).to_bytes(4, "big") + data


def test_a_broken_stream_resumes_where_poprun_has_it_and_nothing_comes_twice() -> None:
    """The wrapper's first connection breaks mid-frame; the second is told how much arrived and sends the rest: every byte once."""
    peer = Peer()
    first, have = peer.wrapper(0, "stdout")
    first.sendall(frame(b"a" * 100) + frame(b"b" * 100)[:50])  # the second frame cut by the break
    peer.pump()
    first.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, (1).to_bytes(4, "little") + (0).to_bytes(4, "little"))
    first.close()  # a reset
    peer.pump()

    second, resumed_at = peer.wrapper(0, "stdout")
    second.sendall(frame(b"b" * 100) + frame(b""))
    peer.pump()

    assert (0, 100) == (have, resumed_at)
    assert {(0, "stdout"): b"a" * 100 + b"b" * 100} == peer.fed
    assert [(0, "stdout")] == peer.ended
    assert (200).to_bytes(8, "big") == second.recv(8)  # the final acknowledgement
    peer.close()
    assert [] == peer.relay.lost


def test_poprun_acknowledges_every_ack_every_bytes() -> None:
    """Acknowledgements come as the bytes arrive, so the wrapper may forget them."""
    peer = Peer()
    sock, _ = peer.wrapper(1, "stderr")
    sock.sendall(frame(b"x" * ACK_EVERY))
    peer.pump()

    assert ACK_EVERY.to_bytes(8, "big") == sock.recv(8)
    peer.close()


def test_an_oversized_frame_closes_the_connection_and_a_stream_never_resumed_is_lost() -> None:
    """A frame over MAX_FRAME is not the wrapper's: the connection is closed; at the end the stream is lost, saying why."""
    peer = Peer()
    sock, _ = peer.wrapper(1, "stdout")
    sock.sendall(frame(b"ok\n") + (MAX_FRAME + 1).to_bytes(4, "big") + b"junk")
    peer.pump()

    assert b"" == sock.recv(100)  # closed by poprun
    peer.close()
    why = f"it sent a frame of {MAX_FRAME + 1} bytes (at most {MAX_FRAME}): not poprun's wrapper"
    assert [((1, "stdout"), 3, why)] == peer.relay.lost
    assert {(1, "stdout"): b"ok\n"} == peer.fed


def test_strangers_are_refused_counted_and_a_flood_keeps_few_waiting() -> None:
    """A wrong token, a bad greeting, silence: refused and counted; at most count * 2 + 64 wait at once."""
    peer = Peer(count=1)
    wrong = peer.connect(b"0" * 32 + b" 0 stdout\n")
    web = peer.connect(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    silent = [peer.connect(b"") for _ in range(100)]
    peer.pump(0.5)

    waiting = sum(1 for s in silent if _open(s))
    peer.close()
    assert waiting <= 2 + 64
    assert {"127.0.0.1": 102} == peer.relay.refused
    assert set() == peer.relay.started
    assert (wrong, web) == tuple(peer.sockets[:2])


def _open(sock: socket.socket) -> bool:
    """Return whether poprun still holds ``sock``'s other end (it has not closed it)."""
    sock.setblocking(False)  # noqa: FBT003 - the socket API
    try:
        return sock.recv(1) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False
