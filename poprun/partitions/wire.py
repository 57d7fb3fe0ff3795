"""
The emulated V-IPU service's wire format: its records as JSON objects, and its error kinds.

Layer: ``poprun.partitions``; shared by the server (:mod:`poprun.partitions.emulator`) and
its client (:mod:`poprun.partitions.emulated`).

Routes (JSON bodies; an error is ``{"error": KIND, "message": TEXT, "holder": ID?}``):

    GET    /v1/version                   {"version": ..., "inventory": {...}}
    GET    /v1/partitions                {"partitions": [PARTITION...]}
    GET    /v1/partitions/NAME           {"partition": PARTITION}          404 not_found
    POST   /v1/partitions                {"request", "owner"?, "ttl_s"?}   409 exists, capacity
    PUT    /v1/partitions/NAME           the same, "token"?: remove and create again 409 in_use, capacity
    POST   /v1/partitions/NAME/reset     {}                                404 not_found
    DELETE /v1/partitions/NAME           {"token"?}                        404, 409 in_use
    PUT    /v1/partitions/NAME/lease     {"owner", "ttl_s", "token"?}      404, 409 in_use
    DELETE /v1/partitions/NAME/lease     {"token"}                         409 in_use

A request that grants a lease (create or update with an ``owner``, a lease of a partition no
one holds) answers ``"token"``: a secret that only the holder has. Renewing, releasing, updating
or removing a leased partition needs it; ``leased_by`` (what anyone may read) is never enough,
and the token is never shown by a GET. A malformed request is 400 ``bad_request`` (404
``no_route``, 405 ``not_allowed``, 408 ``timeout``, 411/413 for bodies without a length or too large).

Both sides read each other's JSON as untrusted: every field is checked for its type and range
(:class:`ShapeError` names the JSON path), and text from the peer is shown only through
:func:`printable`.
"""

from __future__ import annotations

import json
import math
from typing import Any

from poprun.partitions.provider import (
    CapacityError,
    ExistsError,
    InUseError,
    NotFoundError,
    Owner,
    PartitionInfo,
    PartitionRequest,
    PartitionState,
    ProviderError,
)

VERSION = "poprun-emulated-vipu 1"
# Error kind -> (HTTP status, exception class); "refused" is any other ProviderError.
ERRORS: dict[str, tuple[int, type[ProviderError]]] = {
    "not_found": (404, NotFoundError),
    "exists": (409, ExistsError),
    "in_use": (409, InUseError),
    "capacity": (409, CapacityError),
    "refused": (400, ProviderError),
}
MAX_COUNT = 2**31 - 1  # the largest size, GCD or ILD count, or pid accepted from a peer
MAX_NAME = 255  # characters of a partition name
MAX_TEXT = 1024  # characters of any other text field
MAX_TTL_S = 3600.0  # the longest lease a request may ask for


class ShapeError(ValueError):
    """A JSON document is not of the expected shape; the message starts with the JSON path (``$.partitions[0].size``)."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}")
        self.path = path


def printable(text: str, limit: int = 500) -> str:
    r"""Return ``text`` safe to show: control and format characters escaped (as ``\x1b``), at most ``limit`` long."""
    shown = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text[:limit])
    return shown + ("..." if len(text) > limit else "")


def _kind(value: object) -> str:
    """Return what a JSON value is, for messages: ``a list``, ``a string``, ``-3``."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return printable(repr(value), 40)
    names = {dict: "an object", list: "a list", str: "a string", type(None): "null"}
    return names.get(type(value), type(value).__name__)


def parse_json(raw: bytes) -> Any:
    """Return the JSON value of ``raw`` (strict UTF-8). Raises ShapeError ``$: not JSON (...)``."""
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ShapeError("$", f"not JSON (invalid UTF-8: byte 0x{raw[exc.start]:02x} at offset {exc.start})") from None
    except RecursionError:
        raise ShapeError("$", "not JSON (nested too deeply)") from None
    except ValueError as exc:
        raise ShapeError("$", f"not JSON ({printable(str(exc), 100)})") from None


def expect_object(value: object, path: str) -> dict[str, Any]:
    """Return ``value`` if it is a JSON object. Raises ShapeError."""
    if not isinstance(value, dict):
        raise ShapeError(path, f"expected an object, got {_kind(value)}")
    return value


def expect_list(value: object, path: str) -> list[Any]:
    """Return ``value`` if it is a JSON list. Raises ShapeError."""
    if not isinstance(value, list):
        raise ShapeError(path, f"expected a list, got {_kind(value)}")
    return value


def member(doc: dict[str, Any], key: str, path: str) -> Any:
    """Return ``doc[key]``. Raises ShapeError ``PATH.KEY: missing``."""
    if key not in doc:
        raise ShapeError(f"{path}.{key}", "missing")
    return doc[key]


def integer(doc: dict[str, Any], key: str, path: str, *, low: int = 0, high: int = MAX_COUNT,
            default: int | None = None) -> int:
    """Return ``doc[key]``, an integer from ``low`` to ``high`` (``default`` when absent and given). Raises ShapeError."""
    value = default if key not in doc and default is not None else member(doc, key, path)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ShapeError(f"{path}.{key}", f"expected an integer from {low} to {high}, got {_kind(value)}")
    return value


def optional_integer(doc: dict[str, Any], key: str, path: str) -> int | None:
    """Return ``doc[key]``: None (or absent), or a count. Raises ShapeError."""
    return None if doc.get(key) is None else integer(doc, key, path)


def text(doc: dict[str, Any], key: str, path: str, *, limit: int = MAX_TEXT) -> str:
    """Return ``doc[key]``, a non-empty string of printable characters, at most ``limit`` long. Raises ShapeError."""
    return check_text(member(doc, key, path), f"{path}.{key}", limit=limit)


def check_text(value: object, where: str, *, limit: int = MAX_TEXT) -> str:
    """Return ``value`` if it is a non-empty printable string of at most ``limit`` characters. Raises ShapeError."""
    if not isinstance(value, str):
        raise ShapeError(where, f"expected a string, got {_kind(value)}")
    if not value or len(value) > limit:
        raise ShapeError(where, f"expected 1 to {limit} characters, got {len(value)}")
    bad = next((c for c in value if not c.isprintable()), None)
    if bad is not None:
        raise ShapeError(where, f"control character {printable(bad)} in '{printable(value, 60)}'")
    return value


def optional_text(doc: dict[str, Any], key: str, path: str) -> str | None:
    """Return ``doc[key]``: None (or absent), or printable text. Raises ShapeError."""
    return None if doc.get(key) is None else text(doc, key, path)


def optional_boolean(doc: dict[str, Any], key: str, path: str) -> bool | None:
    """Return ``doc[key]``: None (or absent), true or false. Raises ShapeError."""
    value = doc.get(key)
    if value is not None and not isinstance(value, bool):
        raise ShapeError(f"{path}.{key}", f"expected true, false or null, got {_kind(value)}")
    return value


def ttl_from_json(doc: dict[str, Any], default: float) -> float:
    """Return the request's ``ttl_s``: a number of seconds above 0 and at most MAX_TTL_S. Raises ShapeError."""
    value = doc.get("ttl_s", default)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
            or not 0 < value <= MAX_TTL_S:
        raise ShapeError("$.ttl_s", f"expected seconds above 0 and at most {MAX_TTL_S:g}, got {_kind(value)}")
    return float(value)


def token_from_json(doc: dict[str, Any]) -> str | None:
    """Return the request's lease ``token``, or None. Raises ShapeError."""
    return None if doc.get("token") is None else text(doc, "token", "$", limit=256)


def kind_of(exc: ProviderError) -> str:
    """Return the wire kind of a provider error."""
    return next((k for k, (_, cls) in ERRORS.items() if type(exc) is cls), "refused")


def error_from_json(value: object) -> ProviderError:
    """Return the provider error an error body stands for. Raises ShapeError when it is not an error body."""
    doc = expect_object(value, "$")
    kind, message = member(doc, "error", "$"), member(doc, "message", "$")
    for key, found in (("error", kind), ("message", message)):
        if not isinstance(found, str):
            raise ShapeError(f"$.{key}", f"expected a string, got {_kind(found)}")
    if kind == "in_use":
        holder = doc.get("holder")
        return InUseError(printable(message), holder=printable(holder if isinstance(holder, str) else "another launch"))
    return ERRORS.get(kind, ERRORS["refused"])[1](printable(message))


def info_to_json(info: PartitionInfo) -> dict[str, Any]:
    """Return a partition as a JSON object."""
    return {"name": info.name, "size": info.size, "num_gcds": info.num_gcds, "num_ilds": info.num_ilds,
            "num_replicas": info.num_replicas, "state": info.state.value, "cluster": info.cluster,
            "allocation": info.allocation, "ipu_link_routing_type": info.ipu_link_routing_type,
            "gw_link_routing_type": info.gw_link_routing_type, "sync_type": info.sync_type,
            "reconfigurable": info.reconfigurable, "leased_by": info.leased_by}


def info_from_json(value: object, path: str = "$") -> PartitionInfo:
    """Return the partition of a JSON object. Raises ShapeError."""
    doc = expect_object(value, path)
    return PartitionInfo(
        name=text(doc, "name", path, limit=MAX_NAME), size=integer(doc, "size", path),
        num_gcds=integer(doc, "num_gcds", path), num_ilds=integer(doc, "num_ilds", path),
        num_replicas=optional_integer(doc, "num_replicas", path),
        state=PartitionState.from_text(text(doc, "state", path)), cluster=optional_text(doc, "cluster", path),
        allocation=optional_text(doc, "allocation", path),
        ipu_link_routing_type=optional_text(doc, "ipu_link_routing_type", path),
        gw_link_routing_type=optional_text(doc, "gw_link_routing_type", path),
        sync_type=optional_text(doc, "sync_type", path), reconfigurable=optional_boolean(doc, "reconfigurable", path),
        leased_by=optional_text(doc, "leased_by", path))


def partitions_from_json(doc: dict[str, Any]) -> tuple[PartitionInfo, ...]:
    """Return the partitions of a list answer (``{"partitions": [...]}``), sorted by name. Raises ShapeError."""
    items = expect_list(member(doc, "partitions", "$"), "$.partitions")
    return tuple(sorted((info_from_json(item, f"$.partitions[{i}]") for i, item in enumerate(items)),
                        key=lambda info: info.name))


def partition_from_json(doc: dict[str, Any]) -> PartitionInfo:
    """Return the partition of an answer (``{"partition": {...}}``). Raises ShapeError."""
    return info_from_json(member(doc, "partition", "$"), "$.partition")


def request_to_json(request: PartitionRequest) -> dict[str, Any]:
    """Return a create request as a JSON object."""
    return {"name": request.name, "size": request.size, "num_gcds": request.num_gcds, "num_ilds": request.num_ilds,
            "allocation": request.allocation, "ipu_link_routing_type": request.ipu_link_routing_type,
            "gw_link_routing_type": request.gw_link_routing_type, "sync_type": request.sync_type,
            "reconfigurable": request.reconfigurable}


def request_from_json(value: object, path: str = "$.request") -> PartitionRequest:
    """Return the create request of a JSON object. Raises ShapeError."""
    doc = expect_object(value, path)
    return PartitionRequest(
        name=text(doc, "name", path, limit=MAX_NAME), size=integer(doc, "size", path, low=1),
        num_gcds=integer(doc, "num_gcds", path, low=1, default=1), num_ilds=integer(doc, "num_ilds", path, default=0),
        allocation=optional_text(doc, "allocation", path),
        ipu_link_routing_type=optional_text(doc, "ipu_link_routing_type", path),
        gw_link_routing_type=optional_text(doc, "gw_link_routing_type", path),
        sync_type=optional_text(doc, "sync_type", path),
        reconfigurable=bool(optional_boolean(doc, "reconfigurable", path)))


def owner_to_json(owner: Owner | None) -> dict[str, Any] | None:
    """Return an owner as a JSON object (None stays None)."""
    return None if owner is None else {"label": owner.label, "host": owner.host, "pid": owner.pid}


def owner_from_json(value: object, path: str = "$.owner") -> Owner | None:
    """Return the owner of a JSON object (None stays None). Raises ShapeError."""
    if value is None:
        return None
    doc = expect_object(value, path)
    return Owner(label=text(doc, "label", path, limit=MAX_NAME), host=text(doc, "host", path, limit=MAX_NAME),
                 pid=integer(doc, "pid", path, low=1))
