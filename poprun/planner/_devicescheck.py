"""
A saved plan's devices (``$.devices`` and each instance's ``devices``) checked as untrusted input.

Layer: ``poprun.planner``; imports the plan model (its device names);
imported by :mod:`poprun.planner.plancheck` only for a plan that assigns devices or names some,
so that a plan without devices never loads it.

The rules are those :func:`poprun.planner.devices.assign` keeps: ``per_instance`` 0 (no devices,
and no instance names one) or 1 up to the devices of a host; ``visibility`` one of own,
local-rank-zero, all; ``variables`` those of the hosts' vendors; each host of the record is a
host of the plan, once, with devices of one vendor, indices and bus ids once each, NUMA nodes -1
or more; each instance names exactly ``per_instance`` devices, each an index of its host's record,
none also another instance's on the same host. Each broken rule is reported through
``fail(path, detail)`` (PR114).
"""

from __future__ import annotations

import re

from poprun.planner.plan import DEVICE_VARIABLES as VARIABLES
from poprun.planner.plan import DEVICE_VISIBILITIES as VISIBILITIES

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from collections.abc import Callable

    from poprun.planner import plan as p

__all__ = ["check_devices"]

WHERE = "$.devices"
MAX_DEVICES = 4096  # devices of one host: far beyond any server, and the PCI scan's own bound
_BUS = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]\Z")
_NAME = re.compile(r"[^\x00-\x1f\x7f]{0,200}\Z")


def check_devices(plan: p.LaunchPlan, fail: Callable[[str, str], None]) -> None:
    """Call ``fail(path, detail)`` for each broken rule of the plan's devices."""
    d = plan.devices
    if d.visibility not in VISIBILITIES:
        fail(f"{WHERE}.visibility", f"is {d.visibility!r}; it must be one of {', '.join(VISIBILITIES)}")
    if not 0 <= d.per_instance <= MAX_DEVICES:
        fail(f"{WHERE}.per_instance", f"is {d.per_instance}; it must be from 0 to {MAX_DEVICES}")
    indices = _hosts(plan, fail)
    vendors = sorted({x.vendor for h in d.hosts for x in h.devices})
    expected = tuple(v for vendor in vendors for v in VARIABLES.get(vendor, ()))
    if d.variables != expected:
        fail(f"{WHERE}.variables", f"is {list(d.variables)}; the devices' vendors set {list(expected)}")
    taken: dict[str, set[str]] = {}
    for k, instance in enumerate(plan.instances):
        where = f"$.instances[{k}].devices"
        if len(instance.devices) != d.per_instance:
            fail(where, f"names {len(instance.devices)} devices; $.devices.per_instance is {d.per_instance}")
        mine = taken.setdefault(instance.host, set())
        for n, device in enumerate(instance.devices):
            if device not in indices.get(instance.host, set()):
                fail(f"{where}[{n}]", f"is {device!r}, not a device of {instance.host!r} in $.devices.hosts")
            elif device in mine:
                fail(f"{where}[{n}]", f"is {device!r}, which another instance on {instance.host!r} has too")
            mine.add(device)


def _hosts(plan: p.LaunchPlan, fail: Callable[[str, str], None]) -> dict[str, set[str]]:
    """Check each host's record; return each host's device indices (as instances name them)."""
    found: dict[str, set[str]] = {}
    for k, host in enumerate(plan.devices.hosts):
        where = f"{WHERE}.hosts[{k}]"
        if host.host not in plan.topology.hosts:
            fail(f"{where}.host", f"is {host.host!r}, which is not among $.topology.hosts")
        if host.host in found:
            fail(f"{where}.host", f"is {host.host!r} again")
        if not _NAME.match(host.source):
            fail(f"{where}.source", "holds a control character or is longer than 200 characters")
        if len(host.devices) > MAX_DEVICES:
            fail(f"{where}.devices", f"lists {len(host.devices)} devices, more than {MAX_DEVICES}")
        if len({x.vendor for x in host.devices}) > 1:
            fail(f"{where}.devices", "mixes vendors; an instance's devices are of one vendor")
        seen: set[int] = set()
        buses: set[str] = set()
        for n, x in enumerate(host.devices):
            at = f"{where}.devices[{n}]"
            if x.vendor not in VARIABLES:
                fail(f"{at}.vendor", f"is {x.vendor!r}; it must be one of {', '.join(VARIABLES)}")
            if x.index < 0 or x.index in seen:
                fail(f"{at}.index", f"is {x.index}; indices are 0 or more, once each")
            if not _BUS.match(x.bus_id) or x.bus_id in buses:
                fail(f"{at}.bus_id", f"is {x.bus_id!r}; a PCI address such as 0000:1b:00.0, once each")
            if x.numa_node < -1:
                fail(f"{at}.numa_node", f"is {x.numa_node}; -1 (not known) or a node number")
            for key in ("name", "uuid"):
                if not _NAME.match(getattr(x, key)):
                    fail(f"{at}.{key}", "holds a control character or is longer than 200 characters")
            seen.add(x.index)
            buses.add(x.bus_id)
        found[host.host] = {str(i) for i in seen}
    return found
