"""
The plan as text: a summary, the per-instance table and, with ``--explain``, every decision.

Layer: ``poprun.render``; imports ``poprun.planner`` (plan model) and ``poprun.core``; never a
backend: what a backend adds (the mpirun command) comes in as text (``backend_text``).
"""

from __future__ import annotations

from collections.abc import Sequence

from poprun.core.secret import is_secret, mask_text
from poprun.planner.plan import (
    NO_MEMBERSHIP,
    NO_OBSERVE,
    NO_RANK_ORDER,
    NO_RECOVERY,
    Decision,
    Instance,
    LaunchPlan,
    Membership,
    Observe,
    Recovery,
)

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from poprun.planner.plan import RankGroup

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
    if _policy_set(plan.recovery):
        lines.append(f"recovery: {describe_recovery(plan.recovery)}")
    if plan.membership != NO_MEMBERSHIP:
        lines.append(f"membership: {describe_membership(plan.membership, len(t.hosts))}")
    if plan.observe != NO_OBSERVE:
        lines.append(f"observe: {describe_observe(plan.observe)}")
    if plan.rank_order != NO_RANK_ORDER:
        lines.append(f"rank order: {describe_rank_order(plan)}")
    return "\n".join(lines) + "\n"


def _policy_set(recovery: Recovery) -> bool:
    """Whether the plan restarts or limits the run (the port plan is not a policy of the user's)."""
    r, no = recovery, NO_RECOVERY
    return (r.max_restarts, r.timeout_ms, r.stall_timeout_ms, r.heartbeat_timeout_ms, r.straggler_policy) != (
        no.max_restarts, no.timeout_ms, no.stall_timeout_ms, no.heartbeat_timeout_ms, no.straggler_policy)


def _seconds(millis: int) -> str:
    whole, part = divmod(millis, 1000)
    return (str(whole) if not part else f"{whole}.{part:03d}".rstrip("0")) + " s"


def describe_recovery(r: Recovery) -> str:
    """Return the recovery policy in one line: restarts, then the time limits."""
    if r.max_restarts:
        scope = "every instance" if r.scope == "all" else "the failed instance only"
        parts = [(f"up to {_plural(r.max_restarts, 'restart')} of {scope} in the whole run, waiting "
                  f"{_seconds(r.backoff_ms)} (doubling, at most {_seconds(r.backoff_max_ms)})")]
        if r.min_uptime_ms:
            parts.append(f"{_plural(r.crash_loop, 'failure')} within {_seconds(r.min_uptime_ms)} of start in a row "
                         "end the run")
        never = ",".join(map(str, r.never_retry)) or "none"
        parts.append(f"never retried: {never}")
        if r.pre_restart:
            from poprun.core.secret import printable

            parts.append(f"before each: {_short(printable(r.pre_restart))}")
    else:
        parts = ["no restart"]
    if r.timeout_ms:
        from poprun.planner.value import signal_name

        signal = f", SIG{signal_name(r.signal)} {_seconds(r.signal_before_ms)} before it" if r.signal else ""
        parts.append(f"time limit {_seconds(r.timeout_ms)}{signal}")
    if r.stall_timeout_ms:
        parts.append(f"stall limit {_seconds(r.stall_timeout_ms)}")
    if r.heartbeat_timeout_ms:
        parts.append(f"heartbeat limit {_seconds(r.heartbeat_timeout_ms)} per instance")
    if r.straggler_policy != NO_RECOVERY.straggler_policy:
        parts.append(f"a straggler ends its attempt ({r.straggler_policy})")
    return "; ".join(parts)


def render_recovery(plan: LaunchPlan) -> str:
    """Return the recovery section of ``--explain``: the policy, then each part with where it came from."""
    rows = [["part", "value", "source", "reason"]]
    rows += [[d.key.removeprefix(RECOVERY_KEY), _short(d.value), d.source, d.reason]
             for d in plan.explanation if d.key.startswith(RECOVERY_KEY)]
    table = "\n".join(_table(rows)) + "\n" if len(rows) > 1 else ""
    return f"recovery: {describe_recovery(plan.recovery)}\n{table}"


RECOVERY_KEY = "recovery."
MEMBERSHIP_KEY = "membership."
CASE_KEY = "membership.case."


def describe_membership(m: Membership, hosts: int) -> str:
    """Return the membership policy in one line: the spares, the fewest hosts, the health check."""
    from poprun.core.hostlist import compress, expand

    listed = compress(m.spares) if m.spares else ""
    if listed and expand(listed) != m.spares:  # a range would hide the order in which spares take places
        listed = ", ".join(m.spares)
    parts = [f"spare hosts {listed}, in this order" if len(m.spares) > 1 else f"spare host {listed}" if listed
             else "no spare host"]
    smallest = m.smallest(hosts)
    parts.append(f"down to {_plural(smallest, 'host')}" if smallest < hosts else "never fewer hosts")
    if m.health_check:
        from poprun.core.secret import printable

        parts.append(f"health check on every host (at most {_seconds(m.health_check_timeout_ms)}): "
                     f"{_short(printable(m.health_check))}")
    return "; ".join(parts)


def _case_name(case: str) -> str:
    """Return a ``membership.case.*`` key as the case column shows it: ``hosts_3`` -> ``3 hosts left``."""
    if case.startswith("hosts_"):
        return f"{case.removeprefix('hosts_')} hosts left"
    return {"replaced": "a spare left", "fewer": "fewer left"}.get(case, case)


def render_membership(plan: LaunchPlan) -> str:
    """
    Return the membership section of ``--explain``: the policy, each part with where it came from, then each case.

    The cases say what the plan becomes when hosts are lost: replaced by spares, shrunk to each
    smaller size (or no plan, and why), and below the minimum, the end of the run.
    """
    from poprun.core.secret import printable

    decisions = [d for d in plan.explanation if d.key.startswith(MEMBERSHIP_KEY) and d.key != MEMBERSHIP_KEY + "replan"]
    parts = [[d.key.removeprefix(MEMBERSHIP_KEY), _short(printable(str(d.value))), d.source, d.reason]
             for d in decisions if not d.key.startswith(CASE_KEY)]
    cases = [[_case_name(d.key.removeprefix(CASE_KEY)), _short(d.value, 60), d.reason]
             for d in decisions if d.key.startswith(CASE_KEY)]
    text = f"membership: {describe_membership(plan.membership, len(plan.topology.hosts))}\n"
    if len(parts) > 0:
        text += "\n".join(_table([["part", "value", "source", "reason"], *parts])) + "\n"
    if cases:
        text += "what the plan becomes in each case:\n" + "\n".join(_table([["case", "plan", "why"], *cases])) + "\n"
    elif not plan.membership.replans:
        text += "what the plan becomes in each case: a lost host ends the run (no spare host, no fewer hosts)\n"
    replanned = [d for d in plan.explanation if d.key == MEMBERSHIP_KEY + "replan"]
    text += "".join(f"re-planned on {d.value}: {d.reason}\n" for d in replanned)
    return text


OBSERVE_KEY = "observe."


def describe_observe(o: Observe) -> str:
    """Return the notifier and the metrics file in one line (what ``plan`` shows)."""
    from poprun.core.secret import printable

    parts = []
    if o.notify:
        parts.append(f"notify '{_short(printable(o.notify))}' on {', '.join(o.notify_on)} (each at most "
                     f"{_seconds(o.notify_timeout_ms)})")
    if o.metrics_file:
        parts.append(f"metrics in {printable(o.metrics_file)} (once a second)")
    return "; ".join(parts) or "no notifier, no metrics file"


def render_observe(plan: LaunchPlan) -> str:
    """
    Return the observe section of ``--explain``: what is notified, when and with which deadline; where the metrics go.

    Then each part with where it came from.
    """
    from poprun.core.secret import printable

    o = plan.observe
    lines = [f"observe: {describe_observe(o)}"]
    if o.notify:
        lines.append(f"  notified: {', '.join(o.notify_on)} events, each as one JSON line (as --events writes it) on "
                     "the standard input of the command, run by /bin/sh on this machine in a process group of its own")
        lines.append(f"  deadline: {_seconds(o.notify_timeout_ms)} per notification (its group is killed after); at the "
                     f"end poprun waits for those left at most {_seconds(o.notify_timeout_ms)} in all; a failure is a "
                     "warning, never the run's")
    if o.metrics_file:
        lines.append(f"  metrics: {printable(o.metrics_file)}, OpenMetrics text replaced once a second while the run lives and "
                     "at its end (run state, attempt, restarts, each instance's step, step time and ETA)")
    rows = [[d.key.removeprefix(OBSERVE_KEY), _short(printable(str(d.value))), d.source, d.reason]
            for d in plan.explanation if d.key.startswith(OBSERVE_KEY)]
    table = "\n".join(_table([["part", "value", "source", "reason"], *rows])) + "\n" if rows else ""
    return "\n".join(lines) + "\n" + table


RANK_KEY = "rank_order."


def describe_rank_order(plan: LaunchPlan) -> str:
    """Return the rank order in one line: its mode and, under topology, where the groups come from."""
    r = plan.rank_order
    if r.mode == "topology":
        what = "leaf switch" if r.kind == "tree" else "block"
        return (f"topology, from {r.source} ({_plural(len(r.groups), 'group')}: hosts grouped by {what}, natural "
                "within each)")
    if r.mode == "natural":
        return "natural (numbers by value: node7 before node66)"
    return "given (the hosts as listed)"


def _hosts_text(hosts: tuple[str, ...]) -> str:
    """Return ``hosts`` as a host list when it keeps their order, else joined by commas."""
    from poprun.core.hostlist import compress, expand

    listed = compress(hosts)
    return listed if expand(listed) == hosts else ",".join(hosts)


def _group_rows(plan: LaunchPlan, groups: tuple[RankGroup, ...]) -> list[list[str]]:
    """Return the rows of the groups table: each group, its hosts, its instances and the switches above it."""
    rows = [["group", "hosts", "instances", "above"]]
    by_host: dict[str, list[int]] = {}
    for i in plan.instances:
        by_host.setdefault(i.host, []).append(i.index)
    for g in groups:
        mine = sorted(index for host in g.hosts for index in by_host.get(host, ()))
        shown = (str(mine[0]) if len(mine) == 1 else f"{mine[0]}-{mine[-1]}") if mine else "-"
        rows.append([g.name, _short(_hosts_text(g.hosts), 60), shown, " < ".join(g.parents) or "-"])
    return rows


def render_rank_order(plan: LaunchPlan) -> str:
    """Return the rank order section of ``--explain``: the order, each part with where it came from, then each group."""
    rows = [[d.key.removeprefix(RANK_KEY), _short(d.value), d.source, d.reason]
            for d in plan.explanation if d.key.startswith(RANK_KEY)]
    text = f"rank order: {describe_rank_order(plan)}\n"
    if rows:
        text += "\n".join(_table([["part", "value", "source", "reason"], *rows])) + "\n"
    if plan.rank_order.groups:
        text += "groups, in rank order:\n" + "\n".join(_table(_group_rows(plan, plan.rank_order.groups))) + "\n"
    return text


NETWORK_KEY = "network."


def describe_network(plan: LaunchPlan) -> str:
    """Return the network decision in one line: what poprun sets, and how each host's interface is chosen."""
    n = plan.network
    if n.source == "none":
        return f"nothing decided ({n.reason})" if n.reason else "nothing decided"
    sets = ", ".join(n.sets) or "nothing (every variable and parameter is the user's)"
    rule = f"the interface with an address in {n.subnet} (--host-subnet)" if n.source == "host-subnet" else \
        f"the interface on the route to MASTER_ADDR {n.master_addr or '(forwarded from the launching shell)'}"
    return f"sets {sets}; on each host {rule}"


def render_network(plan: LaunchPlan) -> str:
    """Return the network section of ``--explain``: per host the interface, its address and what chose it."""
    from poprun.core.secret import printable

    n = plan.network
    lines = [f"network: {describe_network(plan)}"]
    if n.source != "none" and n.sets:
        rows = [["host", "interface", "address", "chosen by"]]
        for h in n.hosts:
            if h.interface:
                rows.append([h.host, printable(h.interface), h.address, h.how])
            elif h.how:
                rows.append([h.host, "none", "", h.how])
            else:
                what = f"an address in {n.subnet}" if n.source == "host-subnet" else \
                    f"route get {n.master_addr or 'MASTER_ADDR'}"
                rows.append([h.host, "at launch", "", f"{what}, read on the host before the first start"])
        lines += _table(rows)
        mca = [name for name in n.sets if name.endswith("_if_include")]
        if mca and n.mca_value():
            lines.append(f"  mpirun: {' '.join(f'--mca {name} {n.mca_value()}' for name in mca)}")
        elif mca:
            lines.append(f"  mpirun: --mca {' and '.join(mca)}: the hosts' subnets (CIDR), read at launch")
    if n.user:
        lines.append(f"  the user's: {', '.join(n.user)} (poprun sets none of them)")
    rows = [[d.key.removeprefix(NETWORK_KEY), _short(printable(str(d.value))), d.source, d.reason]
            for d in plan.explanation if d.key.startswith(NETWORK_KEY)]
    table = "\n".join(_table([["part", "value", "source", "reason"], *rows])) + "\n" if rows else ""
    return "\n".join(lines) + "\n" + table


def render_settings(plan: LaunchPlan) -> str:
    """Return the settings section of ``--explain``: each setting the backend reads, its value and where it came from."""
    from poprun.planner.setting import DEFAULT, SETTINGS, describe_default

    rows = {row.name: row for row in SETTINGS}
    table = [["setting", "value", "source"]]
    for setting in plan.backend.settings:
        row = rows.get(setting.name)
        if row is not None and setting.source == DEFAULT:
            shown = describe_default(row)
        else:
            shown = f"{setting.value} s" if row is not None and row.kind == "seconds" else setting.value
        table.append([setting.name, _short(shown or "unset"), setting.source])
    return f"settings of the {plan.backend.name} backend:\n" + "\n".join(_table(table)) + "\n"


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    return ["  " + "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows]


def render_instances(instances: Sequence[Instance], *, groups: bool = False) -> str:
    """
    Return the per-instance table: host, local index, ILD, GCD, replicas and key variables.

    With ``groups``, each one's group (rank order topology); its devices when any are assigned.
    """
    devices = any(i.devices for i in instances)
    rows: list[list[str]] = [["instance", "host", "local", "ILD", "GCD", "replicas", "numa",
                              *(["group"] if groups else []), *(["devices"] if devices else [])]]
    for i in instances:
        last = i.replica_offset + i.num_local_replicas - 1
        replicas = str(i.replica_offset) if last == i.replica_offset else f"{i.replica_offset}-{last}"
        rows.append([str(i.index), i.host, str(i.local_index), str(i.ild), str(i.gcd), replicas,
                     i.placement.strategy if i.placement.numa_aware else "off",
                     *([i.group or "-"] if groups else []), *([",".join(i.devices)] if devices else [])])
    return "instances:\n" + "\n".join(_table(rows)) + "\n"


DEVICES_KEY = "devices."
_VISIBILITY = {"own": "each instance sees only its own devices", "local-rank-zero":
               "each instance sees only its own devices, LOCAL_RANK=0", "all": "each instance sees every device of its host"}


def render_devices(plan: LaunchPlan) -> str:
    """
    Return the devices section of ``--explain``: per host, each device, its NUMA node and the instance that has it.

    Then each part with where it came from (the count, the visibility, the variables, each host's reason).
    """
    from poprun.core.secret import printable

    d = plan.devices
    seen = _VISIBILITY.get(d.visibility, d.visibility)
    lines = [f"devices: {_plural(d.per_instance, 'device')} per instance; {seen} ({', '.join(d.variables)})"]
    for host in d.hosts:
        owner = {device: i.index for i in plan.instances if i.host == host.host for device in i.devices}
        lines.append(f"  {host.host} ({_plural(len(host.devices), 'device')}, from {host.source})")
        rows = [[f"device {x.index}", x.bus_id, f"NUMA {x.numa_node if x.numa_node >= 0 else '?'}", printable(x.name) or "-",
                 f"instance {owner[str(x.index)]}" if str(x.index) in owner else "free"] for x in host.devices]
        lines += ["  " + line for line in _table(rows)]
    rows = [[x.key.removeprefix(DEVICES_KEY), _short(x.value), x.source, x.reason]
            for x in plan.explanation if x.key.startswith(DEVICES_KEY)]
    table = "\n".join(_table([["part", "value", "source", "reason"], *rows])) + "\n" if rows else ""
    return "\n".join(lines) + "\n" + table


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
    rows += [[d.key, _short(d.value), d.source, d.reason] for d in decisions
             if not d.key.startswith((RECOVERY_KEY, MEMBERSHIP_KEY, OBSERVE_KEY, RANK_KEY, DEVICES_KEY, NETWORK_KEY))]
    return "decisions:\n" + "\n".join(_table(rows)) + "\n"


def _short(value: str | int | bool, limit: int = 40) -> str:
    text = ("yes" if value else "no") if isinstance(value, bool) else str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _network_at_launch(plan: LaunchPlan) -> str:
    """Return the line that says which network variables apply sets at launch ("" when none are left to it)."""
    n = plan.network
    names = [name for name in n.sets if not name.endswith("_if_include")]
    first = n.of(plan.instances[0].host) if plan.instances else None
    if not names or first is None or first.interface:
        return ""
    return f"  {', '.join(names)}: at launch (the interface chosen on {first.host}; see network)"


def render_environment(instance: Instance, mask: tuple[str, ...] = (), *, port_host: str | None = None,
                       network: str = "") -> str:
    """
    Return one instance's environment, secrets (and the variables of ``mask``) masked.

    ``port_host``: the host whose free port the apply step picks for MASTER_PORT (None: the plan sets it).
    ``network``: a line saying which network variables the apply step sets ("" for none).
    """
    lines = [f"environment of instance {instance.index} ({instance.host}):"]
    for name, value in instance.env.set:
        shown = "********" if is_secret(name, mask) else value
        lines.append(f"  {name}={shown}")
    if port_host is not None:
        lines.append(f"  MASTER_PORT: chosen at apply time (a free port on {port_host}, and the next one for "
                     "popdist's hub)")
    if network:
        lines.append(network)
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
    from poprun.core.rawbytes import shell_join

    def argv(instance: Instance) -> str:
        return shell_join(instance.argv) if instance.argv else "(no program)"

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

    Values of variables whose names look secret or are in the plan's ``mask`` show as
    ``********``; the password of every URL (``postgres://u:****@h/db``) and the value of every
    ``NAME=VALUE`` word whose name looks secret (``--password=****``) as ``****``.

    ``backend_text`` is what the plan's backend adds, after the program (its ``describe``:
    :func:`poprun.backends.registry.describe`); ``""`` adds nothing.
    """
    parts = [render_summary(plan), render_instances(plan.instances, groups=plan.rank_order.mode == "topology")]
    if explain:
        parts.append(render_decisions(plan.explanation))
        parts.append(render_recovery(plan))
        if plan.devices.per_instance:
            parts.append(render_devices(plan))
        if plan.membership != NO_MEMBERSHIP or any(d.key.startswith(MEMBERSHIP_KEY) for d in plan.explanation):
            parts.append(render_membership(plan))
        if plan.observe != NO_OBSERVE or any(d.key.startswith(OBSERVE_KEY) for d in plan.explanation):
            parts.append(render_observe(plan))
        if plan.rank_order != NO_RANK_ORDER or any(d.key.startswith(RANK_KEY) for d in plan.explanation):
            parts.append(render_rank_order(plan))
        if plan.network.source != "none":
            parts.append(render_network(plan))
        if plan.backend.settings:
            parts.append(render_settings(plan))
        if plan.partition is not None:
            parts.append("partition actions:\n" + "".join(f"  - {a}\n" for a in plan.partition.actions))
        if any(i.placement.numa_aware for i in plan.instances):
            parts.append(render_placement(plan.instances))
        port_host = plan.instances[0].host if plan.recovery.choose_port else None
        parts.append(render_environment(plan.instances[0], plan.mask, port_host=port_host,
                                        network=_network_at_launch(plan))
                     + _differences(plan.instances))
    parts.append(render_program(plan.instances))
    if backend_text:
        parts.append(backend_text)
    if plan.warnings:
        parts.append("warnings:\n" + "".join(f"  {w.code}: {w.summary} ({w.hint})\n" for w in plan.warnings))
    return mask_text("\n".join(parts), plan.mask)  # a URL's password, --password=..., in an argument or a decision
