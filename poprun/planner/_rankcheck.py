"""
A saved plan's rank order (``$.rank_order`` and each instance's ``group``) checked as untrusted input.

Layer: ``poprun.planner``; imports the natural order of :mod:`poprun.planner.rankorder`;
imported by :mod:`poprun.planner.plancheck` only for a plan whose order is not the given one
(or whose instances name a group), so that other plans never load these modules.

The rules are those :func:`poprun.planner.rankorder.rank_order` keeps: the mode is ``given``,
``natural`` or ``topology``; only ``topology`` has a source, a kind (``tree`` or ``block``) and
groups, and only then do instances name a group. Under ``natural`` the hosts are in natural
order. Under ``topology`` the groups name the plan's hosts, each once, and in the plan's order
(each group consecutive), every group holds a host, names are names, and each instance's group
is the one its host is in. Each broken rule is reported through ``fail(path, detail)`` (PR114).
"""

from __future__ import annotations

import re

from poprun.planner.rankorder import MODES, natural

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from collections.abc import Callable

    from poprun.planner import plan as p

__all__ = ["check_rank_order"]

WHERE = "$.rank_order"
MAX_SOURCE = 4096  # PATH_MAX
_NAME = re.compile(r"[A-Za-z0-9_.:][A-Za-z0-9_.:+-]{0,252}\Z")


def check_rank_order(plan: p.LaunchPlan, fail: Callable[[str, str], None]) -> None:
    """Call ``fail(path, detail)`` for each broken rule of ``plan.rank_order`` and the instances' groups."""
    r = plan.rank_order
    if r.mode not in MODES:
        fail(f"{WHERE}.mode", f"is {r.mode[:40]!r}, not one of {', '.join(MODES)}")
        return
    if r.mode != "topology":
        for path, value in (("source", r.source), ("kind", r.kind), ("groups", r.groups)):
            if value:
                fail(f"{WHERE}.{path}", f"must be empty under the {r.mode} order")
        for i, instance in enumerate(plan.instances):
            if instance.group is not None:
                fail(f"$.instances[{i}].group", f"names a group under the {r.mode} order")
                break
        if r.mode == "natural" and natural(plan.topology.hosts) != plan.topology.hosts:
            fail("$.topology.hosts", "are not in natural order, as the natural rank order puts them")
        return
    _check_topology(plan, fail)


def _check_topology(plan: p.LaunchPlan, fail: Callable[[str, str], None]) -> None:
    r = plan.rank_order
    if r.kind not in ("tree", "block"):
        fail(f"{WHERE}.kind", f"is {r.kind[:40]!r}, not tree or block")
    if not r.source or len(r.source) > MAX_SOURCE or not r.source.isprintable():
        fail(f"{WHERE}.source", f"must name the topology's file or scontrol (1 to {MAX_SOURCE} printable characters)")
    names: set[str] = set()
    for g, group in enumerate(r.groups):
        for path, name in ((f"{WHERE}.groups[{g}].name", group.name),
                           *((f"{WHERE}.groups[{g}].parents[{k}]", n) for k, n in enumerate(group.parents))):
            if not _NAME.match(name):
                fail(path, f"is {name[:40]!r}: a switch or block name holds letters, digits, '.', '_', ':', '+', '-'")
        if group.name in names:
            fail(f"{WHERE}.groups[{g}].name", f"names group {group.name[:40]!r} twice")
        names.add(group.name)
        if not group.hosts:
            fail(f"{WHERE}.groups[{g}].hosts", "is empty: a group holds at least one of the plan's hosts")
    listed = tuple(h for group in r.groups for h in group.hosts)
    if listed != plan.topology.hosts:
        fail(f"{WHERE}.groups", "must name the plan's hosts ($.topology.hosts), each once, in the plan's order")
        return
    group_of = {h: group.name for group in r.groups for h in group.hosts}
    for i, instance in enumerate(plan.instances):
        if instance.group != group_of.get(instance.host):
            fail(f"$.instances[{i}].group", f"is {instance.group!r}; host {instance.host} is in group "
                 f"{group_of.get(instance.host)!r}")
            break
