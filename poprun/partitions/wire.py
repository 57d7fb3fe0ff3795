"""
The emulated V-IPU service's wire format: its records as JSON objects, and its error kinds.

Layer: ``poprun.partitions``; shared by the server (:mod:`poprun.partitions.emulator`) and
its client (:mod:`poprun.partitions.emulated`).

Routes (JSON bodies; an error is ``{"error": KIND, "message": TEXT, "holder": ID?}``):

    GET    /v1/version                   {"version": ..., "inventory": {...}}
    GET    /v1/partitions                {"partitions": [PARTITION...]}
    GET    /v1/partitions/NAME           {"partition": PARTITION}          404 not_found
    POST   /v1/partitions                {"request", "owner"?, "ttl_s"?}   409 exists, capacity
    PUT    /v1/partitions/NAME           the same: remove and create again 409 in_use, capacity
    POST   /v1/partitions/NAME/reset     {}                                404 not_found
    DELETE /v1/partitions/NAME           {"owner"?}                        404, 409 in_use
    PUT    /v1/partitions/NAME/lease     {"owner", "ttl_s"}                404, 409 in_use
    DELETE /v1/partitions/NAME/lease     {"owner"}
"""

from __future__ import annotations

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


def kind_of(exc: ProviderError) -> str:
    """Return the wire kind of a provider error."""
    return next((k for k, (_, cls) in ERRORS.items() if type(exc) is cls), "refused")


def error_from_json(doc: dict[str, Any]) -> ProviderError:
    """Return the provider error an error body stands for."""
    kind, message = str(doc.get("error", "refused")), str(doc.get("message", "request failed"))
    if kind == "in_use":
        return InUseError(message, holder=str(doc.get("holder", "another launch")))
    return ERRORS.get(kind, ERRORS["refused"])[1](message)


def info_to_json(info: PartitionInfo) -> dict[str, Any]:
    """Return a partition as a JSON object."""
    return {"name": info.name, "size": info.size, "num_gcds": info.num_gcds, "num_ilds": info.num_ilds,
            "num_replicas": info.num_replicas, "state": info.state.value, "cluster": info.cluster,
            "allocation": info.allocation, "ipu_link_routing_type": info.ipu_link_routing_type,
            "gw_link_routing_type": info.gw_link_routing_type, "sync_type": info.sync_type,
            "reconfigurable": info.reconfigurable, "leased_by": info.leased_by}


def info_from_json(doc: dict[str, Any]) -> PartitionInfo:
    """Return the partition of a JSON object."""
    return PartitionInfo(
        name=doc["name"], size=int(doc["size"]), num_gcds=int(doc["num_gcds"]), num_ilds=int(doc["num_ilds"]),
        num_replicas=doc.get("num_replicas"), state=PartitionState.from_text(doc["state"]),
        cluster=doc.get("cluster"), allocation=doc.get("allocation"),
        ipu_link_routing_type=doc.get("ipu_link_routing_type"), gw_link_routing_type=doc.get("gw_link_routing_type"),
        sync_type=doc.get("sync_type"), reconfigurable=doc.get("reconfigurable"), leased_by=doc.get("leased_by"))


def request_to_json(request: PartitionRequest) -> dict[str, Any]:
    """Return a create request as a JSON object."""
    return {"name": request.name, "size": request.size, "num_gcds": request.num_gcds, "num_ilds": request.num_ilds,
            "allocation": request.allocation, "ipu_link_routing_type": request.ipu_link_routing_type,
            "gw_link_routing_type": request.gw_link_routing_type, "sync_type": request.sync_type,
            "reconfigurable": request.reconfigurable}


def request_from_json(doc: dict[str, Any]) -> PartitionRequest:
    """Return the create request of a JSON object."""
    return PartitionRequest(
        name=str(doc["name"]), size=int(doc["size"]), num_gcds=int(doc.get("num_gcds", 1)),
        num_ilds=int(doc.get("num_ilds", 0)), allocation=doc.get("allocation"),
        ipu_link_routing_type=doc.get("ipu_link_routing_type"), gw_link_routing_type=doc.get("gw_link_routing_type"),
        sync_type=doc.get("sync_type"), reconfigurable=bool(doc.get("reconfigurable", False)))


def owner_to_json(owner: Owner | None) -> dict[str, Any] | None:
    """Return an owner as a JSON object (None stays None)."""
    return None if owner is None else {"label": owner.label, "host": owner.host, "pid": owner.pid}


def owner_from_json(doc: dict[str, Any] | None) -> Owner | None:
    """Return the owner of a JSON object (None stays None)."""
    return None if doc is None else Owner(label=str(doc["label"]), host=str(doc["host"]), pid=int(doc["pid"]))
