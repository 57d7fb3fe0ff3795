"""
A saved plan's network record (``$.network``) checked as untrusted input.

Layer: ``poprun.planner``; imports :mod:`poprun.planner.netroute` (the interface name rule) and
``ipaddress`` on use; imported by :mod:`poprun.planner.plancheck` only for a plan whose network
decides something, so that a plan over one host never loads these modules.

The rules are those :func:`poprun.planner.network.network` keeps: a known source; the names
set and the user's are known ones, each once, never both; one record per host of the plan, in
the plan's order, each host once; an interface is "" (read at launch) or a name Gloo and NCCL
can take; an address, a subnet and the ``--host-subnet`` are addresses and networks; every
text bounded and free of NUL and line breaks (explain prints them). Each broken rule is
reported through ``fail(path, detail)`` (PR114).
"""

from __future__ import annotations

from poprun.planner.netroute import valid_interface

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from collections.abc import Callable

    from poprun.planner import plan as p

__all__ = ["check_network"]

WHERE = "$.network"
SOURCES = ("none", "route", "host-subnet")
NAMES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME", "oob_tcp_if_include", "btl_tcp_if_include")
MAX_TEXT = 1024


def check_network(plan: p.LaunchPlan, fail: Callable[[str, str], None]) -> None:
    """Call ``fail(path, detail)`` for each broken rule of ``plan.network``."""
    n = plan.network
    if n.source not in SOURCES:
        fail(f"{WHERE}.source", f"is {n.source[:40]!r}, not one of {', '.join(SOURCES)}")
    for key, names in (("sets", n.sets), ("user", n.user)):
        bad = [name for name in names if name not in NAMES]
        if bad or len(set(names)) != len(names):
            fail(f"{WHERE}.{key}", f"must name each of {', '.join(NAMES)} at most once")
    if set(n.sets) & set(n.user):
        fail(f"{WHERE}.sets", "names a variable the user set (poprun sets none of those)")
    hosts = tuple(dict.fromkeys(i.host for i in plan.instances))
    if n.source != "none" and tuple(h.host for h in n.hosts) != hosts:
        fail(f"{WHERE}.hosts", "must hold one record per host of the plan, in the plan's order")
    if n.source == "none" and (n.hosts or n.sets):
        fail(f"{WHERE}.hosts", "must be empty, as sets, when nothing is decided (source none)")
    for text, path in ((n.reason, "reason"), (n.master_addr, "master_addr"), (n.subnet, "subnet")):
        _text(fail, f"{WHERE}.{path}", text)
    if n.subnet and not _network(n.subnet):
        fail(f"{WHERE}.subnet", f"is {n.subnet[:60]!r}, not a subnet in CIDR form")
    for k, h in enumerate(n.hosts):
        where = f"{WHERE}.hosts[{k}]"
        if h.interface and not valid_interface(h.interface):
            fail(f"{where}.interface", f"is {h.interface[:40]!r}, not a name GLOO_SOCKET_IFNAME can take")
        if h.address and not _address(h.address):
            fail(f"{where}.address", f"is {h.address[:60]!r}, not an address")
        if h.subnet and not _network(h.subnet):
            fail(f"{where}.subnet", f"is {h.subnet[:60]!r}, not a subnet in CIDR form")
        _text(fail, f"{where}.how", h.how)


def _text(fail: Callable[[str, str], None], path: str, text: str) -> None:
    if len(text) > MAX_TEXT or any(c in text for c in "\0\n\r"):
        fail(path, f"must be at most {MAX_TEXT} characters on one line, without NUL")


def _address(text: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def _network(text: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_network(text, strict=False)
    except ValueError:
        return False
    return "/" in text
