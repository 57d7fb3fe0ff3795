"""
What changed between two plans: ``poprun plan --diff OLD.json``, as text or JSON.

Layer: ``poprun.render``; imports ``poprun.core`` and the plan model.

:func:`diff_plans` compares two plans section by section (topology, placement, environment,
partition, launch, recovery, membership (its spec, kept to solve again, is not compared, as
what it holds shows in the other sections), observe, rank order (its groups, and the order of the same hosts), devices
(each host's devices, as discovered, are not compared: what the instances got shows in placement), network) and returns
a :class:`Diff`. A change that is the same on several
instances (``POPDIST_NUM_INSTANCES: 2 -> 4``) is one change naming them all. Instances are
matched by index; one only in the old plan is removed, one only in the new plan added (its
environment is then not compared: all of it is new). The plans' explanations (and the
placements' reasons), warnings and poprun versions are not compared. Same plans, same output.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from poprun.core.hostlist import compress
from poprun.core.record import evolve, fields, record
from poprun.core.secret import is_secret, mask_text
from poprun.planner.plan import Instance, LaunchPlan, Partition
from poprun.render.graph import ranges

SECTIONS = ("topology", "placement", "environment", "partition", "launch", "recovery", "membership", "observe",
            "rank_order", "devices", "network")
Value = str | int | bool | tuple[str, ...] | None
_MASK = "********"


@record
class Change:
    """
    One value that differs: ``old`` is None where it is added, ``new`` None where it is removed.

    ``instances`` names the instances the change applies to (by index, sorted); it is empty
    for a change of the plan as a whole (topology, partition, backend ...).
    """

    section: str
    key: str
    old: Value
    new: Value
    instances: tuple[int, ...] = ()


@record
class Diff:
    """The changes from one plan to another, by section (:data:`SECTIONS`), in a fixed order."""

    changes: tuple[Change, ...]
    mask: tuple[str, ...] = ()  # variables masked beside those whose names look secret (either plan's --mask)

    @property
    def equal(self) -> bool:
        """Whether the plans launch the same thing."""
        return not self.changes

    def section(self, name: str) -> tuple[Change, ...]:
        """Return the changes of one section."""
        return tuple(c for c in self.changes if c.section == name)


def diff_plans(old: LaunchPlan, new: LaunchPlan) -> Diff:
    """Return what changed from plan ``old`` to plan ``new``."""
    raw = [*_topology(old, new), *_instances(old, new), *_partition(old.partition, new.partition), *_launch(old, new),
           *_record_changes("recovery", "", old.recovery, new.recovery),
           *_record_changes("membership", "", old.membership, new.membership, skip=("spec",)),
           *_record_changes("observe", "", old.observe, new.observe), *_rank_order(old, new),
           *_record_changes("devices", "", old.devices, new.devices, skip=("hosts",)), *_network(old, new)]
    return Diff(changes=_merge(raw), mask=tuple(sorted(set(old.mask) | set(new.mask))))


def _merge(changes: Sequence[Change]) -> tuple[Change, ...]:
    """Return ``changes`` with equal ones on several instances merged, ordered by section."""
    merged: dict[tuple[str, str, Value, Value], list[int]] = {}
    for change in changes:
        merged.setdefault((change.section, change.key, change.old, change.new), []).extend(change.instances)
    out = [Change(section=s, key=k, old=o, new=n, instances=tuple(sorted(set(i)))) for (s, k, o, n), i in merged.items()]
    return tuple(sorted(out, key=lambda c: SECTIONS.index(c.section)))  # stable: first seen first


def _compare(section: str, key: str, old: Value, new: Value, instances: tuple[int, ...] = ()) -> Iterator[Change]:
    if old != new:
        yield Change(section=section, key=key, old=old, new=new, instances=instances)


def _record_changes(section: str, prefix: str, old: object, new: object, *, skip: tuple[str, ...] = ()) -> Iterator[Change]:
    """Yield a change for each field of two records of one class that differs."""
    for f in fields(type(new)):
        if f.name not in skip:
            yield from _compare(section, prefix + f.name, _value(getattr(old, f.name)), _value(getattr(new, f.name)))


def _network(old: LaunchPlan, new: LaunchPlan) -> Iterator[Change]:
    """Yield the network record's changes (docs/network.md): its rule, then each host's interface as explain shows it."""
    yield from _record_changes("network", "", old.network, new.network, skip=("hosts",))

    def shown(plan: LaunchPlan) -> dict[str, str]:
        return {h.host: f"{h.interface} {h.address}".strip() if h.interface else h.how or "at launch"
                for h in plan.network.hosts}

    was, now = shown(old), shown(new)
    for host in dict.fromkeys([*was, *now]):  # hosts only ever "at launch" on both sides: topology says it
        if {was.get(host), now.get(host)} - {None, "at launch"}:
            yield from _compare("network", f"host {host}", was.get(host), now.get(host))


def _value(value: object) -> Value:
    if isinstance(value, tuple):
        return tuple(str(v) for v in value)
    if value is None or isinstance(value, str | int | bool):
        return value
    return str(value)


def _topology(old: LaunchPlan, new: LaunchPlan) -> Iterator[Change]:
    yield from _record_changes("topology", "", old.topology, new.topology, skip=("hosts",))
    yield from _compare("topology", "hosts", compress(old.topology.hosts), compress(new.topology.hosts))


def _rank_order(old: LaunchPlan, new: LaunchPlan) -> Iterator[Change]:
    """Yield the changes of the rank order: its mode, source and kind, each group, and the order of the hosts."""
    yield from _record_changes("rank_order", "", old.rank_order, new.rank_order, skip=("groups",))
    before = {g.name: ",".join(g.hosts) for g in old.rank_order.groups}
    after = {g.name: ",".join(g.hosts) for g in new.rank_order.groups}
    for name in dict.fromkeys([*before, *after]):
        yield from _compare("rank_order", f"group {name}", before.get(name), after.get(name))
    if old.topology.hosts != new.topology.hosts and set(old.topology.hosts) == set(new.topology.hosts):
        yield Change(section="rank_order", key="host order", old=",".join(old.topology.hosts),
                     new=",".join(new.topology.hosts))


def replicas_of(instance: Instance) -> str:
    """Return an instance's replicas as a range: '0-15', or '4' for one."""
    last = instance.replica_offset + instance.num_local_replicas - 1
    return str(last) if last == instance.replica_offset else f"{instance.replica_offset}-{last}"


_PLACEMENT: tuple[tuple[str, Callable[[Instance], Value]], ...] = (
    ("host", lambda i: i.host),
    ("local_index", lambda i: i.local_index),
    ("ild", lambda i: i.ild),
    ("gcd", lambda i: i.gcd),
    ("replicas", replicas_of),
    ("mpi_local_args", lambda i: i.mpi_local_args),
    ("group", lambda i: i.group),
    ("devices", lambda i: ",".join(i.devices) or None),
)


def _summary(instance: Instance) -> str:
    return (f"{instance.host}, local {instance.local_index}, ILD {instance.ild}, GCD {instance.gcd}, "
            f"replicas {replicas_of(instance)}")


def _instances(old: LaunchPlan, new: LaunchPlan) -> Iterator[Change]:
    """Yield the placement, environment, program and directory changes of every instance."""
    before = {i.index: i for i in old.instances}
    after = {i.index: i for i in new.instances}
    for index in sorted(before.keys() | after.keys()):
        was, now = before.get(index), after.get(index)
        if was is None or now is None:
            yield Change(section="placement", key="instance", old=None if was is None else _summary(was),
                         new=None if now is None else _summary(now), instances=(index,))
            continue
        for key, get in _PLACEMENT:
            yield from _compare("placement", key, get(was), get(now), (index,))
        for change in _record_changes("placement", "placement.", was.placement, now.placement, skip=("reason",)):
            yield evolve(change, instances=(index,))
        yield from _environment(was, now)
        yield from _compare("launch", "argv", was.argv, now.argv, (index,))
        yield from _compare("launch", "cwd", was.cwd, now.cwd, (index,))


def _environment(was: Instance, now: Instance) -> Iterator[Change]:
    """Yield each variable set, forwarded or removed differently in one instance."""
    scope = (now.index,)
    for name in sorted({n for n, _ in was.env.set} | {n for n, _ in now.env.set}):
        yield from _compare("environment", name, was.env.get(name), now.env.get(name), scope)
    yield from _compare("environment", "(forwarded)", was.env.forward, now.env.forward, scope)
    yield from _compare("environment", "(removed)", was.env.unset, now.env.unset, scope)


def _partition(old: Partition | None, new: Partition | None) -> Iterator[Change]:
    if old is None or new is None:
        yield from _compare("partition", "partition", None if old is None else _partition_name(old),
                            None if new is None else _partition_name(new))
        return
    yield from _record_changes("partition", "", old, new)


def _partition_name(partition: Partition) -> str:
    return f"{partition.name or '(the only partition of the allocation)'} on {partition.server_host}:{partition.server_port}"


def _launch(old: LaunchPlan, new: LaunchPlan) -> Iterator[Change]:
    """Yield the changes of how the plan runs: backend (and a setting both backends read), offline mode, output, cache, MPI and ssh keys."""
    yield from _compare("launch", "backend", old.backend.name, new.backend.name)
    old_settings = {s.name: s.value for s in old.backend.settings}
    new_settings = {s.name: s.value for s in new.backend.settings}
    for name in sorted(old_settings.keys() & new_settings.keys()):  # another backend's are not a change of their own
        yield from _compare("launch", f"backend.settings.{name}", old_settings[name], new_settings[name])
    yield from _compare("launch", "offline", old.offline, new.offline)
    yield from _compare("launch", "offline_target", old.offline_target, new.offline_target)
    yield from _compare("launch", "mask", old.mask, new.mask)
    for name in ("output", "cache", "mpi", "ssh_keys"):
        yield from _record_changes("launch", f"{name}.", getattr(old, name), getattr(new, name))


def render_diff(diff: Diff, *, old_name: str, new_name: str) -> str:
    """Return the diff as text: a header, then each section's changes; secret values masked."""
    lines = [f"--- {old_name}", f"+++ {new_name}"]
    if diff.equal:
        lines.append("no differences")
    for section in SECTIONS:
        changes = diff.section(section)
        if changes:
            lines.append(f"{section}:")
            lines.extend(line for change in changes for line in _change_lines(change, diff.mask))
    return mask_text("\n".join(lines) + "\n", diff.mask)


def _change_lines(change: Change, mask: tuple[str, ...]) -> list[str]:
    scope = _scope(change.instances)
    if change.key == "instance":
        what = f"added ({change.new})" if change.old is None else f"removed (was {change.old})"
        return [f"  {scope.strip(' ()')}: {what}"]
    if isinstance(change.old, tuple) and isinstance(change.new, tuple) and change.key == "actions":
        return [f"  {change.key}:{scope}",
                *(f"    - {a}" for a in change.old if a not in change.new),
                *(f"    + {a}" for a in change.new if a not in change.old)]
    old, new = _shown(change, change.old, mask), _shown(change, change.new, mask)
    return [f"  {change.key}: {old} -> {new}{scope}"]


def _scope(instances: tuple[int, ...]) -> str:
    if not instances:
        return ""
    word = "instance" if len(instances) == 1 else "instances"
    return f" ({word} {ranges(instances)})"


def _masked(change: Change, mask: tuple[str, ...]) -> bool:
    return change.section == "environment" and is_secret(change.key, mask)


def _shown(change: Change, value: Value, mask: tuple[str, ...]) -> str:
    if value is None:
        return "(none)"
    if _masked(change, mask):
        return _MASK
    if isinstance(value, bool):
        return "yes" if value else "no"
    from poprun.core.secret import controls_escaped  # one line per change: a newline or an escape sequence escaped

    if isinstance(value, tuple):
        return " ".join(controls_escaped(v) for v in value) if value else "(none)"
    return controls_escaped(str(value)) if value != "" else '""'


def to_diff_dict(diff: Diff, *, old_name: str, new_name: str) -> dict[str, object]:
    """Return the diff as JSON-ready data: ``old``, ``new``, ``equal`` and the list of ``changes``."""
    changes = [{"section": c.section, "key": c.key, "instances": list(c.instances),
                "old": _MASK if _masked(c, diff.mask) and c.old is not None else _json(c.old),
                "new": _MASK if _masked(c, diff.mask) and c.new is not None else _json(c.new)} for c in diff.changes]
    return {"old": old_name, "new": new_name, "equal": diff.equal, "changes": changes}


def _json(value: Value) -> object:
    if isinstance(value, tuple):
        return [mask_text(item) for item in value]
    return mask_text(value) if isinstance(value, str) else value


def render_diff_json(diff: Diff, *, old_name: str, new_name: str) -> str:
    """Return the diff as deterministic JSON (sorted keys, two-space indent, final newline)."""
    import json

    from poprun.core.rawbytes import to_json_data

    return json.dumps(to_json_data(to_diff_dict(diff, old_name=old_name, new_name=new_name)), indent=2,
                      sort_keys=True, ensure_ascii=False) + "\n"
