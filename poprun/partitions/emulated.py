"""
The ``emulated`` provider: a client of the emulated V-IPU service (``poprun vipu-server``).

Layer: ``poprun.partitions``; the standard library (``http.client``), :mod:`poprun.partitions.wire`
and :mod:`poprun.partitions.deadline`.

The server is a peer, not a part of poprun, and is read as untrusted: each request, from the
connection to the last byte of the answer, ends within ``timeout_s`` in total (a server that
answers one byte at a time is cut off, not waited for); an answer is at most 1 MiB; redirects
are not followed; and every answer is checked for its shape before it is used. A server that
does not answer in time is :class:`~poprun.partitions.provider.UnreachableError` (PR501); one
whose answer is not a V-IPU answer is :class:`~poprun.partitions.provider.MalformedAnswerError`
(PR510). The lease tokens the server grants are kept here, per partition and owner, and shown
only to that server.
"""

from __future__ import annotations

import http.client
import json
import time
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import quote

from poprun.partitions import deadline, wire
from poprun.partitions.provider import (
    LeaseTokens,
    MalformedAnswerError,
    NotFoundError,
    Owner,
    PartitionInfo,
    PartitionRequest,
    UnreachableError,
)

MAX_ANSWER = 1 << 20  # bytes of an answer's body
T = TypeVar("T")


class _Connection(http.client.HTTPConnection):
    """An HTTP connection whose socket ends every call by ``deadline``."""

    def __init__(self, host: str, port: int, end: float) -> None:
        super().__init__(host, port)
        self._end = end

    def connect(self) -> None:
        self.sock = deadline.connect(self.host, self.port, self._end)


class EmulatedProvider:
    """The emulated service at ``host:port`` (a :class:`~poprun.partitions.provider.Provider`)."""

    def __init__(self, host: str, port: int, *, timeout_s: float = 120.0) -> None:
        self.host, self.port, self.timeout_s = host, port, timeout_s
        self._tokens = LeaseTokens()  # (partition, owner id) -> the lease's secret

    @property
    def address(self) -> str:
        """``host:port``."""
        return f"{self.host}:{self.port}"

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None, *,
              parse: Callable[[dict[str, Any]], T]) -> T:
        """Send one request; return ``parse`` of the answer, or raise the provider error it carries."""
        what = f"{method} {path}"
        conn: _Connection | None = None
        response: http.client.HTTPResponse | None = None
        try:
            conn = _Connection(self.host, self.port, time.monotonic() + self.timeout_s)
            data = None if body is None else json.dumps(body).encode()
            conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            raw = _body(response, what)
            status, location = response.status, response.getheader("Location")
        except TimeoutError as exc:
            msg = f"no complete answer within {self.timeout_s:g} s (the timeout bounds the whole request)"
            raise UnreachableError(msg) from exc
        except http.client.RemoteDisconnected as exc:
            msg = "the server closed the connection without answering"
            raise UnreachableError(msg) from exc
        except OSError as exc:
            raise UnreachableError(wire.printable(exc.strerror or str(exc))) from exc
        except http.client.InvalidURL as exc:
            msg = f"invalid server address: {wire.printable(str(exc), 80)}"
            raise UnreachableError(msg) from exc
        except http.client.HTTPException as exc:
            msg = f"{what}: not an HTTP answer ({type(exc).__name__}: {wire.printable(str(exc), 80)})"
            raise MalformedAnswerError(msg) from exc
        except ValueError as exc:  # an address getaddrinfo cannot take (NUL, an invalid IDNA label)
            msg = f"invalid server address: {wire.printable(str(exc), 80)}"
            raise UnreachableError(msg) from exc
        finally:
            if response is not None:
                response.close()
            if conn is not None:
                conn.close()
        try:
            return parse(_answer(status, location, raw))
        except wire.ShapeError as exc:
            msg = f"{what}: {exc}"
            raise MalformedAnswerError(msg) from None

    def version(self) -> str:
        """Return the server's version line."""
        return self._call("GET", "/v1/version", parse=lambda doc: wire.text(doc, "version", "$"))

    def list(self) -> tuple[PartitionInfo, ...]:
        """Return every partition, sorted by name."""
        return self._call("GET", "/v1/partitions", parse=wire.partitions_from_json)

    def get(self, name: str) -> PartitionInfo | None:
        """Return the partition ``name``, or None."""
        try:
            info = self._call("GET", _path(name), parse=wire.partition_from_json)
        except NotFoundError:
            return None
        if info.name != name:
            msg = f"GET {_path(name)}: asked for partition '{wire.printable(name, 60)}', got '{info.name}'"
            raise MalformedAnswerError(msg)
        return info

    def create(self, request: PartitionRequest, *, owner: Owner | None = None) -> PartitionInfo:
        """Create a partition, leased to ``owner`` (whose token is kept)."""
        body = {"request": wire.request_to_json(request), "owner": wire.owner_to_json(owner)}
        info, token = self._call("POST", "/v1/partitions", body, parse=_granted)
        self._keep(request.name, owner, token)
        return info

    def update(self, request: PartitionRequest, *, owner: Owner | None = None) -> PartitionInfo:
        """Remove the partition and create it again, leased to ``owner``."""
        body = {"request": wire.request_to_json(request), "owner": wire.owner_to_json(owner),
                "token": self._token(request.name, owner)}
        info, token = self._call("PUT", _path(request.name), body, parse=_granted)
        self._keep(request.name, owner, token)
        return info

    def reset(self, name: str) -> PartitionInfo:
        """Reset the partition."""
        return self._call("POST", _path(name) + "/reset", {}, parse=wire.partition_from_json)

    def remove(self, name: str, *, owner: Owner | None = None) -> None:
        """Remove the partition (with ``owner``'s token, when it holds the lease)."""
        self._call("DELETE", _path(name), {"token": self._token(name, owner)}, parse=_nothing)
        self._keep(name, owner, None)

    def lease(self, name: str, owner: Owner, *, ttl_s: float) -> None:
        """Lease or renew the partition for ``owner``."""
        body = {"owner": wire.owner_to_json(owner), "ttl_s": ttl_s, "token": self._token(name, owner)}
        self._keep(name, owner, self._call("PUT", _path(name) + "/lease", body,
                                           parse=lambda doc: wire.text(doc, "token", "$", limit=256)))

    def release(self, name: str, owner: Owner) -> None:
        """End ``owner``'s lease (a no-op when it holds none)."""
        token = self._token(name, owner)
        if token is not None:
            self._call("DELETE", _path(name) + "/lease", {"token": token}, parse=_nothing)
            self._keep(name, owner, None)

    def _token(self, name: str, owner: Owner | None) -> str | None:
        return self._tokens.get(name, owner)

    def _keep(self, name: str, owner: Owner | None, token: str | None) -> None:
        self._tokens.keep(name, owner, token)


def _body(response: http.client.HTTPResponse, what: str) -> bytes:
    """Return the answer's body, at most MAX_ANSWER bytes. Raises MalformedAnswerError (too large, cut short)."""
    announced = response.length
    if announced is not None and announced > MAX_ANSWER:
        msg = f"{what}: the answer is larger than 1 MiB ({announced} bytes announced)"
        raise MalformedAnswerError(msg)
    raw = response.read(MAX_ANSWER + 1)
    if len(raw) > MAX_ANSWER:
        msg = f"{what}: the answer is larger than 1 MiB"
        raise MalformedAnswerError(msg)
    if announced is not None and len(raw) < announced:
        msg = f"{what}: the answer was cut short ({len(raw)} of {announced} bytes)"
        raise MalformedAnswerError(msg)
    return raw


def _answer(status: int, location: str | None, raw: bytes) -> dict[str, Any]:
    """Return the JSON object of a 2xx answer; raise the error an error answer carries. Raises ShapeError."""
    if 300 <= status < 400:  # noqa: PLR2004 - HTTP's redirect range
        where = wire.printable(location or "nowhere", 200)
        raise wire.ShapeError("$", f"a redirect (HTTP {status}) to {where}; poprun does not follow redirects")
    if status >= 400:  # noqa: PLR2004 - HTTP's error threshold
        try:
            error = wire.error_from_json(wire.parse_json(raw))
        except wire.ShapeError as exc:
            raise wire.ShapeError("$", f"HTTP {status} with a body that is not a V-IPU error ({exc})") from None
        raise error
    if not 200 <= status < 300:  # noqa: PLR2004 - HTTP's success range
        raise wire.ShapeError("$", f"unexpected HTTP status {status}")
    return wire.expect_object(wire.parse_json(raw or b"{}"), "$")


def _granted(doc: dict[str, Any]) -> tuple[PartitionInfo, str | None]:
    """Return the partition of an answer and the lease token it grants (None when no owner was given)."""
    return wire.partition_from_json(doc), wire.token_from_json(doc)


def _nothing(_doc: dict[str, Any]) -> None:
    """Parse an answer whose body does not matter."""


def _path(name: str) -> str:
    return "/v1/partitions/" + quote(name, safe="")
