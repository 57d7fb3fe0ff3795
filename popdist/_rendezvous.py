"""
The TCP backend's rendezvous: :func:`open_tcp` connects every instance to instance 0.

Standalone: standard library only; never imports ``poprun``; imported by ``popdist.init()`` only.
Instance 0 (the hub) listens on ``MASTER_ADDR:MASTER_PORT+1`` (``MASTER_PORT`` itself is left
to torch's store); every other instance (a spoke) connects and says hello, and ``init`` returns
everywhere once all have. Wire format: one JSON object per line: ``hello``, answered by ``ack``
or ``reject``, then ``welcome`` once all have joined. A hello names the protocol and the instance
count, so a spoke of another launch on the same port is refused with a message; anything else
answering on the port (an HTTP proxy, say) is skipped, not trusted.

Addresses: ``MASTER_ADDR`` resolved to IPv4, then ``127.0.0.1``: the hub listens on the first it
can bind, spokes try both in turn. A multi-host *offline* launch runs every instance here while
``MASTER_ADDR`` names a planned host that may not resolve or may be another machine; loopback
then still meets.
"""

from __future__ import annotations

import contextlib
import errno
import socket
import time

from popdist._contract import BackendError
from popdist._tcp import Link, TcpHub, TcpSpoke, remaining

TYPE_CHECKING = False
if TYPE_CHECKING:
    from popdist._tcp import Message

PROTOCOL = "popdist-tcp/1"
LOOPBACK = "127.0.0.1"
_RETRY_S = 0.05
_CONNECT_TIMEOUT_S = 1.0
_HELLO_TIMEOUT_S = 2.0
_ACK_TIMEOUT_S = 5.0


def open_tcp(*, index: int, count: int, host: str, port: int, timeout_s: float) -> TcpHub | TcpSpoke:
    """
    Return this instance's end of the rendezvous, once all ``count`` instances have joined.

    Raises:
        BackendError: when they cannot all meet within ``timeout_s`` seconds.
    """
    deadline = time.monotonic() + timeout_s
    addresses = _addresses(host)
    if index == 0:
        return TcpHub(_gather(_listen(addresses, port, count), count, deadline, timeout_s), count)
    return TcpSpoke(_join(addresses, port, index=index, count=count, deadline=deadline, timeout_s=timeout_s),
                    index, count)


def _addresses(host: str) -> list[str]:
    """Return where instance 0 may listen: ``host`` resolved to IPv4 if it resolves, then loopback."""
    found = []
    with contextlib.suppress(OSError):
        found.append(socket.gethostbyname(host))
    return [*found, LOOPBACK] if LOOPBACK not in found else found


def _listen(addresses: list[str], port: int, count: int) -> socket.socket:
    """Return a socket listening on the first of ``addresses`` this host can bind."""
    failures = []
    for address in addresses:
        try:
            return socket.create_server((address, port), backlog=count)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise BackendError(f"instance 0 cannot listen on {address}:{port}, which is in use (another "
                                   "launch?); set MASTER_PORT to a free port (popdist uses MASTER_PORT + 1)") from exc
            failures.append(f"{address} ({exc.strerror})")
    raise BackendError(f"instance 0 cannot listen on port {port} at {', '.join(failures)}")


def _gather(server: socket.socket, count: int, deadline: float, timeout_s: float) -> dict[int, Link]:
    """Accept every other instance's hello, then welcome them all; return their links by index."""
    links: dict[int, Link] = {}
    with server:
        while len(links) < count - 1:
            try:
                server.settimeout(remaining(deadline))
                sock, _ = server.accept()
            except TimeoutError as exc:
                missing = sorted(set(range(1, count)) - set(links))
                _close(links)
                raise BackendError(f"instance 0 waited {timeout_s} s on {server.getsockname()} for instances "
                                   f"{missing}, which did not join") from exc
            _admit(Link(sock, peer=-1), links, count, deadline)
    for index, link in links.items():
        try:
            link.send({"op": "welcome"})
        except OSError as exc:
            _close(links)
            raise BackendError(f"instance {index} left before every instance had joined") from exc
    return links


def _close(links: dict[int, Link]) -> None:
    for link in links.values():
        link.sock.close()


def _admit(link: Link, links: dict[int, Link], count: int, deadline: float) -> None:
    """Read ``link``'s hello; add it to ``links``, or refuse it with a reason."""
    try:
        hello = link.receive(min(deadline, time.monotonic() + _HELLO_TIMEOUT_S))
    except (TimeoutError, EOFError, OSError, ValueError, BackendError):
        link.sock.close()
        return
    reason = _refusal(hello, links, count)
    try:
        link.send({"op": "reject", "reason": reason} if reason else {"op": "ack"})
    except OSError:
        reason = reason or "gone"
    if reason:
        link.sock.close()
        return
    link.peer = int(str(hello["instance"]))
    links[link.peer] = link


def _refusal(hello: Message, links: dict[int, Link], count: int) -> str:
    """Return why instance 0 refuses ``hello`` (empty: it does not)."""
    index = hello.get("instance")
    if hello.get("op") != "hello" or hello.get("protocol") != PROTOCOL:
        return f"not a {PROTOCOL} hello"
    if hello.get("instances") != count:
        return f"this launch has {count} instances, not {hello.get('instances')} (another launch on this port?)"
    if not isinstance(index, int) or not 0 < index < count:
        return f"no instance {index} in a launch of {count}"
    if index in links:
        return f"instance {index} already joined (another launch on this port?)"
    return ""


def _join(addresses: list[str], port: int, *, index: int, count: int, deadline: float, timeout_s: float) -> Link:
    """Connect to instance 0, say hello, and return the link once it welcomes everyone."""
    attempt = 0
    while time.monotonic() < deadline:
        address = addresses[attempt % len(addresses)]
        attempt += 1
        link = _hello(address, port, index=index, count=count, deadline=deadline)
        if link is not None:
            return _welcome(link, f"{address}:{port}", index=index, deadline=deadline)
        time.sleep(_RETRY_S)
    raise BackendError(f"instance {index} could not reach instance 0 at {' or '.join(addresses)} port {port} within "
                       f"{timeout_s} s; is MASTER_ADDR ({addresses[0]}) an address of instance 0's host?")


def _hello(address: str, port: int, *, index: int, count: int, deadline: float) -> Link | None:
    """
    Return a link to instance 0 at ``address`` once it acknowledged the hello.

    ``None`` when nothing listens there or something else answers (a proxy, another service).

    Raises:
        BackendError: when a popdist instance 0 there refuses this instance (another launch).
    """
    try:
        link = Link(socket.create_connection((address, port), timeout=_CONNECT_TIMEOUT_S), peer=0)
    except OSError:
        return None
    try:
        link.send({"op": "hello", "protocol": PROTOCOL, "instances": count, "instance": index})
        reply = link.receive(min(deadline, time.monotonic() + _ACK_TIMEOUT_S))
    except (TimeoutError, EOFError, OSError, ValueError, BackendError):
        reply = {}
    if reply.get("op") == "ack":
        return link
    link.sock.close()
    if reply.get("op") == "reject":
        raise BackendError(f"instance 0 at {address}:{port} refused instance {index}: {reply.get('reason')}")
    return None


def _welcome(link: Link, where: str, *, index: int, deadline: float) -> Link:
    """Return ``link`` once instance 0 (at ``where``) says that every instance has joined."""
    try:
        reply = link.receive(deadline)
    except TimeoutError as exc:
        link.sock.close()
        raise BackendError(f"instance {index} reached instance 0 at {where}, but not every instance "
                           "joined in time") from exc
    except (EOFError, OSError, ValueError) as exc:
        link.sock.close()
        raise BackendError(f"instance 0 at {where} closed the connection of instance {index} before every "
                           "instance had joined (it gave up waiting, or failed)") from exc
    if reply.get("op") != "welcome":
        link.sock.close()
        raise BackendError(f"instance 0 at {where} sent {reply} instead of a welcome")
    return link
