"""
The ``emulated`` provider: a client of the emulated V-IPU service (``poprun vipu-server``).

Layer: ``poprun.partitions``; the standard library (``http.client``) and
:mod:`poprun.partitions.wire`. Every request opens one connection with the given timeout, so
a server that is down or silent costs at most ``timeout_s``.
"""

from __future__ import annotations

import http.client
import json
from typing import Any
from urllib.parse import quote

from poprun.partitions import wire
from poprun.partitions.provider import (
    NotFoundError,
    Owner,
    PartitionInfo,
    PartitionRequest,
    UnreachableError,
)


class EmulatedProvider:
    """The emulated service at ``host:port`` (a :class:`~poprun.partitions.provider.Provider`)."""

    def __init__(self, host: str, port: int, *, timeout_s: float = 120.0) -> None:
        self.host, self.port, self.timeout_s = host, port, timeout_s

    @property
    def address(self) -> str:
        """``host:port``."""
        return f"{self.host}:{self.port}"

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        """Send one request; return the JSON body, or raise the provider error it carries."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        try:
            data = None if body is None else json.dumps(body).encode()
            conn.request(method, path, body=data, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            doc: dict[str, Any] = json.loads(response.read() or b"{}")
        except TimeoutError as exc:
            msg = f"no answer within {self.timeout_s:g} s"
            raise UnreachableError(msg) from exc
        except OSError as exc:
            raise UnreachableError(exc.strerror or str(exc)) from exc
        except (http.client.HTTPException, ValueError) as exc:
            msg = f"not an emulated V-IPU server: {exc}"
            raise UnreachableError(msg) from exc
        finally:
            conn.close()
        if response.status >= 400:  # noqa: PLR2004 - HTTP's own threshold
            raise wire.error_from_json(doc)
        return doc

    def version(self) -> str:
        """Return the server's version line."""
        return str(self._call("GET", "/v1/version")["version"])

    def list(self) -> tuple[PartitionInfo, ...]:
        """Return every partition, sorted by name."""
        return tuple(wire.info_from_json(d) for d in self._call("GET", "/v1/partitions")["partitions"])

    def get(self, name: str) -> PartitionInfo | None:
        """Return the partition ``name``, or None."""
        try:
            return wire.info_from_json(self._call("GET", _path(name))["partition"])
        except NotFoundError:
            return None

    def create(self, request: PartitionRequest, *, owner: Owner | None = None) -> PartitionInfo:
        """Create a partition, leased to ``owner``."""
        body = {"request": wire.request_to_json(request), "owner": wire.owner_to_json(owner)}
        return wire.info_from_json(self._call("POST", "/v1/partitions", body)["partition"])

    def update(self, request: PartitionRequest, *, owner: Owner | None = None) -> PartitionInfo:
        """Remove the partition and create it again, leased to ``owner``."""
        body = {"request": wire.request_to_json(request), "owner": wire.owner_to_json(owner)}
        return wire.info_from_json(self._call("PUT", _path(request.name), body)["partition"])

    def reset(self, name: str) -> PartitionInfo:
        """Reset the partition."""
        return wire.info_from_json(self._call("POST", _path(name) + "/reset", {})["partition"])

    def remove(self, name: str, *, owner: Owner | None = None) -> None:
        """Remove the partition."""
        self._call("DELETE", _path(name), {"owner": wire.owner_to_json(owner)})

    def lease(self, name: str, owner: Owner, *, ttl_s: float) -> None:
        """Lease or renew the partition for ``owner``."""
        self._call("PUT", _path(name) + "/lease", {"owner": wire.owner_to_json(owner), "ttl_s": ttl_s})

    def release(self, name: str, owner: Owner) -> None:
        """End ``owner``'s lease."""
        self._call("DELETE", _path(name) + "/lease", {"owner": wire.owner_to_json(owner)})


def _path(name: str) -> str:
    return "/v1/partitions/" + quote(name, safe="")

