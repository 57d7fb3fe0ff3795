"""
The plan as text: a summary, the per-instance table and, with ``--explain``, every decision.

Layer: ``poprun.render``; imports ``poprun.planner`` (plan model) and ``poprun.core``; never a
backend: what a backend adds (the mpirun command) comes in as text (``backend_text``).
"""

from __future__ import annotations

from collections.abc import Sequence

from poprun.planner.environment import is_secret
from poprun.planner.plan import Decision, Instance, LaunchPlan

KEY_ENV = ("POPDIST_REPLICA_INDEX_OFFSET", "POPDIST_LOCAL_INSTANCE_INDEX", "IPUOF_VIPU_API_GCD_ID")


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def render_summary(plan: LaunchPlan) -> str:
    """Return the one-paragraph summary of a plan."""
    t = plan.topology
    from poprun.core.hostlist import compress

    lines = [
        (f"{_plural(t.num_replicas, 'replica')} x {_plural(t.ipus_per_replica, 'IPU')} = {_plural(t.num_ipus, 'IPU')}, "
         f"over {_plural(t.num_instances, 'instance')} on {_plural(len(t.hosts), 'host')} ({compress(t.hosts)}), "
         f"{_plural(t.num_ilds, 'ILD')}"),
        f"backend: {plan.backend.name} ({plan.backend.reason})",
    ]
    if plan.partition is not None:
        part = plan.partition
        name = part.name or "(the only partition of the allocation)"
        lines.append(f"partition: {name} on {part.server_host}:{part.server_port}, {_plural(part.num_ipus, 'IPU')}, "
                     f"{_plural(part.num_gcds, 'GCD')}, {_plural(part.num_ilds, 'ILD')}")
    else:
        lines.append("partition: none (offline mode)")
    lines.append(f"executable cache: {plan.cache.mode}{' at ' + plan.cache.path if plan.cache.path else ''}")
    return "\n".join(lines) + "\n"


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    return ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def render_instances(instances: Sequence[Instance]) -> str:
    """Return the per-instance table: host, local index, ILD, GCD, replicas and key variables."""
    rows: list[list[str]] = [["instance", "host", "local", "ILD", "GCD", "replicas", "numa"]]
    for i in instances:
        last = i.replica_offset + i.num_local_replicas - 1
        replicas = str(i.replica_offset) if last == i.replica_offset else f"{i.replica_offset}-{last}"
        rows.append([str(i.index), i.host, str(i.local_index), str(i.ild), str(i.gcd), replicas,
                     i.placement.strategy if i.placement.numa_aware else "off"])
    return "instances:\n" + "\n".join(_table(rows)) + "\n"


def render_placement(instances: Sequence[Instance]) -> str:
    """
    Return where each instance is bound, host by host (as mpirun's ``--report-bindings`` would).

    ``localhost (spreadnuma on workstation-1numa)`` then ``instance 0  NUMA 0  CPUs 0-3`` rows; a
    host whose instances are not bound says why once.
    """
    lines = ["placement:"]
    for host in dict.fromkeys(i.host for i in instances):
        mine = [i for i in instances if i.host == host]
        if not any(i.placement.cpus for i in mine):
            lines.append(f"  {host}: not bound: {mine[0].placement.reason}")
            continue
        lines.append(f"  {host} ({mine[0].placement.reason})")
        rows = [[f"instance {i.index}", f"NUMA {i.placement.numa_nodes}", f"CPUs {i.placement.cpus}"] for i in mine]
        lines += ["  " + line for line in _table(rows)]
    return "\n".join(lines) + "\n"


def render_decisions(decisions: Sequence[Decision]) -> str:
    """Return every decision with its value, source and reason."""
    rows = [["key", "value", "source", "reason"]]
    rows += [[d.key, _short(d.value), d.source, d.reason] for d in decisions]
    return "decisions:\n" + "\n".join(_table(rows)) + "\n"


def _short(value: str | int | bool, limit: int = 40) -> str:
    text = ("yes" if value else "no") if isinstance(value, bool) else str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def render_environment(instance: Instance, mask: tuple[str, ...] = ()) -> str:
    """Return one instance's environment, secrets (and the variables of ``mask``) masked."""
    lines = [f"environment of instance {instance.index} ({instance.host}):"]
    for name, value in instance.env.set:
        shown = "********" if is_secret(name, mask) else value
        lines.append(f"  {name}={shown}")
    if instance.env.forward:
        lines.append(f"  forwarded from the launching shell: {' '.join(instance.env.forward)}")
    if instance.env.unset:
        lines.append(f"  removed: {' '.join(instance.env.unset)}")
    return "\n".join(lines) + "\n"


def render_program(instances: Sequence[Instance]) -> str:
    """
    Return the program each instance runs and its working directory, quoted as a shell would need.

    One line when every instance runs the same (as the solver plans), else one line per instance:
    the text shows exactly what apply runs, so a word that was swallowed or changed is seen.
    """
    import shlex

    def argv(instance: Instance) -> str:
        return shlex.join(instance.argv) if instance.argv else "(no program)"

    first = instances[0]
    if all(i.argv == first.argv and i.cwd == first.cwd for i in instances):
        return f"program: {argv(first)}\nworking directory: {first.cwd}\n"
    lines = ["programs (they differ between instances):"]
    lines += [f"  instance {i.index} ({i.host}): {argv(i)}  (in {i.cwd})" for i in instances]
    return "\n".join(lines) + "\n"


def _differences(instances: Sequence[Instance]) -> str:
    """Return which variables vary between instances (the rest are the same everywhere)."""
    if len(instances) < 2:  # noqa: PLR2004 - one instance has nothing to compare
        return ""
    first = instances[0].env.as_dict()
    varying = sorted({name for i in instances[1:] for name, value in i.env.set if first.get(name) != value}
                     | {name for i in instances[1:] for name in first if i.env.get(name) is None})
    text = f"  other instances differ only in: {' '.join(varying)}\n" if varying else ""
    head = instances[0]
    for i in instances[1:]:  # the solver gives every instance the same; a saved plan may not
        for what, mine, theirs in (("forwards", i.env.forward, head.env.forward),
                                   ("removes", i.env.unset, head.env.unset)):
            if mine != theirs:
                text += f"  instance {i.index} {what}: {' '.join(mine) or '(none)'}\n"
    return text


def render_plan(plan: LaunchPlan, *, explain: bool = False, backend_text: str = "") -> str:
    """
    Return the text view of a plan (``poprun plan``), with derivations when ``explain``.

    ``backend_text`` is what the plan's backend adds, after the program (its ``describe``:
    :func:`poprun.backends.registry.describe`); ``""`` adds nothing.
    """
    parts = [render_summary(plan), render_instances(plan.instances)]
    if explain:
        parts.append(render_decisions(plan.explanation))
        if plan.partition is not None:
            parts.append("partition actions:\n" + "".join(f"  - {a}\n" for a in plan.partition.actions))
        if any(i.placement.numa_aware for i in plan.instances):
            parts.append(render_placement(plan.instances))
        parts.append(render_environment(plan.instances[0], plan.mask) + _differences(plan.instances))
    parts.append(render_program(plan.instances))
    if backend_text:
        parts.append(backend_text)
    if plan.warnings:
        parts.append("warnings:\n" + "".join(f"  {w.code}: {w.summary} ({w.hint})\n" for w in plan.warnings))
    return "\n".join(parts)
