"""
A saved plan is untrusted input: check it as strictly as the solver builds one.

Layer: ``poprun.planner``; imports ``poprun.core``, the plan model, the limits of
:mod:`constraint`, the option table's choices, and the traits and settings tables.

:func:`validate_plan_data` checks the JSON data before it becomes a :class:`LaunchPlan`
(no NUL character in any string, no value of the wrong JSON type, bounded numbers);
:func:`validate_plan` checks the plan's invariants: the instance indices are exactly
``0..n-1``, the replica ranges divide ``[0, R)``, the counts are positive, hosts are host
names, variable names are POSIX names, bindings are bounded CPU lists, and every index names
an instance that exists; the membership policy's hosts, sizes, command and kept spec
(:mod:`poprun.planner._membershipcheck`); the notifier and the metrics file
(:mod:`poprun.planner._observecheck`); the rank order (:mod:`poprun.planner._rankcheck`); the devices
(:mod:`poprun.planner._devicescheck`); the network record (:mod:`poprun.planner._networkcheck`). Each problem is one
PR114 diagnostic naming its JSON path
(``$.instances[1].host``), so that what ``plan --explain``, ``plan --diff`` and ``apply``
show of a saved plan is exactly what apply runs.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from poprun.core.diagnostic import Diagnostic, error
from poprun.core.span import SourceSpan
from poprun.planner import plan as p
from poprun.planner.constraint import LIMITS
from poprun.planner.option import PLACEMENTS, SCOPES, SSH_KEY_TYPES, STRAGGLER_POLICIES
from poprun.planner.recovery import MAX_COMMAND, MAX_RESTARTS
from poprun.planner.value import MAX_SECONDS, MAX_SIGNAL, MAX_STATUS

HINT = "make the plan again with 'poprun plan --format json -o FILE'"
MAX_PROBLEMS = 20  # a plan with more problems than this is not worth listing them all
MAX_CPU = 65_535  # the kernel's largest CPU number (NR_CPUS is at most 8192 today)
MAX_NUMA_NODE = 4_095
MAX_STRING = 1 << 20  # one string of a plan: 1 MiB (a whole plan file is at most 4 MiB)
MAX_PORT = 65_535
MAX_NUMBER = 1 << 62  # no count, port or timeout of a plan comes near this
_HOST = re.compile(r"[A-Za-z0-9_.:][A-Za-z0-9_.:-]*\Z")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_BACKEND = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")
_CPU_LIST = re.compile(r"\d{1,6}(-\d{1,6})?(,\d{1,6}(-\d{1,6})?)*\Z")
_WORD = re.compile(r"[a-z][a-z0-9_-]{0,63}\Z")
_PLUGIN = re.compile(r"[A-Za-z0-9_]{1,32}\Z")  # srun --mpi=NAME
_CACHE_MODES = ("disabled", "user", "temporary")
_HOST_MAX = 253


def validate_plan_data(data: object, *, file: str) -> list[Diagnostic]:
    """Return PR114 for each string of ``data`` (parsed JSON) that holds a NUL or is too long, and each huge number."""
    found: list[Diagnostic] = []
    for path, value in _walk(data, "$"):
        if isinstance(value, str) and "\0" in value:
            found.append(_problem(file, path, "holds a NUL character, which no name, argument or value may hold"))
        elif isinstance(value, str) and len(value) > MAX_STRING:
            found.append(_problem(file, path, f"is a string of {len(value)} characters (at most {MAX_STRING})"))
        elif isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_NUMBER:
            found.append(_problem(file, path, f"is {value}, too large for any number of a plan"))
        elif isinstance(value, float):
            found.append(_problem(file, path, f"is {value!r}: a plan holds whole numbers only"))
        if len(found) >= MAX_PROBLEMS:
            break
    return found


def _walk(data: object, path: str) -> Iterator[tuple[str, object]]:
    """Yield every value of ``data`` (and every key of its objects) with its JSON path."""
    stack: list[tuple[str, object]] = [(path, data)]
    while stack:
        where, value = stack.pop()
        yield where, value
        if isinstance(value, dict):
            for key, item in reversed(list(value.items())):
                inner = f"{where}.{key}" if _ENV_NAME.match(key) else f"{where}[{key!r}]"
                yield inner, key
                stack.append((inner, item))
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", item) for i, item in reversed(list(enumerate(value))))


def validate_plan(plan: p.LaunchPlan, *, file: str) -> list[Diagnostic]:
    """Return PR114 for each broken invariant of ``plan`` (at most :data:`MAX_PROBLEMS`)."""
    check = _Checker(file)
    check.topology(plan.topology, len(plan.instances))
    check.instances(plan)
    check.output(plan.output, len(plan.instances))
    check.cache(plan.cache)
    if plan.partition is not None:
        check.partition(plan.partition)
    check.rest(plan)
    check.recovery(plan.recovery)
    if plan.membership != p.NO_MEMBERSHIP:  # a plan without membership never imports its modules
        from poprun.planner._membershipcheck import check_membership

        check_membership(plan, check.fail)
    if plan.observe != p.NO_OBSERVE:  # nor a plan without a notifier or a metrics file
        from poprun.planner._observecheck import check_observe

        check_observe(plan, check.fail)
    if plan.rank_order != p.NO_RANK_ORDER or any(i.group is not None for i in plan.instances):  # nor a given order
        from poprun.planner._rankcheck import check_rank_order

        check_rank_order(plan, check.fail)
    if plan.devices != p.NO_DEVICES or any(i.devices for i in plan.instances):  # nor a plan without devices
        from poprun.planner._devicescheck import check_devices

        check_devices(plan, check.fail)
    if plan.network != p.NO_NETWORK and (plan.network.source != "none" or plan.network.hosts or plan.network.sets):
        from poprun.planner._networkcheck import check_network  # nor a plan over one host

        check_network(plan, check.fail)
    return check.found[:MAX_PROBLEMS]


def _problem(file: str, path: str, detail: str) -> Diagnostic:
    return error("PR114", "invalid plan file", detail=f"{path} {detail}", span=SourceSpan(file=file, key_path=path),
                 hint=HINT)


class _Checker:
    def __init__(self, file: str) -> None:
        self.file = file
        self.found: list[Diagnostic] = []

    def fail(self, path: str, detail: str) -> None:
        self.found.append(_problem(self.file, path, detail))

    def positive(self, path: str, value: int, limit: int | None = None) -> None:
        if value < 1:
            self.fail(path, f"is {value}; it must be at least 1")
        elif limit is not None and value > limit:
            self.fail(path, f"is {value}, more than poprun plans for (at most {limit})")

    def nonneg(self, path: str, value: int, below: int | None = None) -> None:
        if value < 0 or (below is not None and value >= below):
            bound = f"from 0 to {below - 1}" if below is not None else "0 or more"
            self.fail(path, f"is {value}; it must be {bound}")

    def host(self, path: str, name: str) -> None:
        if not name:
            self.fail(path, "is empty; a host name is needed")
        elif name.startswith("-"):
            self.fail(path, f"is {name!r}: a host name cannot start with '-'")
        elif len(name) > _HOST_MAX or not _HOST.match(name):
            self.fail(path, f"is {name!r}: host names hold only letters, digits, '.', '-', '_' and ':'")

    def env_name(self, path: str, name: str) -> None:
        if not _ENV_NAME.match(name):
            self.fail(path, f"is {name!r}: variable names are letters, digits and '_', not starting with a digit")

    def cpu_list(self, path: str, text: str, largest: int) -> None:
        if not text:
            return
        if not _CPU_LIST.match(text):
            self.fail(path, f"is {text!r}: not a list such as 0-3,8")
            return
        for part in text.split(","):
            lo, _, hi = part.partition("-")
            first, last = int(lo), int(hi or lo)
            if last < first or last > largest:
                self.fail(path, f"is {text!r}: '{part}' is not a range within 0-{largest}")
                return

    def topology(self, t: p.Topology, count: int) -> None:
        for name, limit in (("num_replicas", LIMITS["replicas"]), ("num_instances", LIMITS["instances"]),
                            ("num_ilds", LIMITS["ilds"]), ("ipus_per_replica", LIMITS["ipus_per_replica"]),
                            ("num_ipus", None), ("replicas_per_instance", None), ("instances_per_host", None),
                            ("instances_per_ild", None)):
            self.positive(f"$.topology.{name}", getattr(t, name), limit)
        if self.found:
            return
        if t.num_instances != count:
            self.fail("$.topology.num_instances", f"is {t.num_instances}, but the plan lists {count} instances")
        if t.num_ipus != t.num_replicas * t.ipus_per_replica:
            self.fail("$.topology.num_ipus", f"is {t.num_ipus}, not num_replicas x ipus_per_replica "
                                             f"= {t.num_replicas * t.ipus_per_replica}")
        if t.replicas_per_instance * t.num_instances != t.num_replicas:
            self.fail("$.topology.replicas_per_instance", f"is {t.replicas_per_instance}, not num_replicas / "
                                                          f"num_instances ({t.num_replicas} / {t.num_instances})")
        if not t.hosts:
            self.fail("$.topology.hosts", "is empty; a plan runs on at least one host")
        for k, name in enumerate(t.hosts):
            self.host(f"$.topology.hosts[{k}]", name)
        if len(set(t.hosts)) != len(t.hosts):
            self.fail("$.topology.hosts", "names a host twice")

    def instances(self, plan: p.LaunchPlan) -> None:
        t = plan.topology
        if not plan.instances:
            self.fail("$.instances", "is empty; a plan has at least one instance")
        covered = 0
        for k in sorted(range(len(plan.instances)), key=lambda k: plan.instances[k].replica_offset):
            i = plan.instances[k]
            if i.replica_offset != covered:
                self.fail(f"$.instances[{k}].replica_offset",
                          f"is {i.replica_offset}; the replica ranges must divide 0-{t.num_replicas - 1} "
                          f"without gap or overlap (expected {covered})")
                break
            covered += i.num_local_replicas
        else:
            if plan.instances and covered != t.num_replicas:
                self.fail("$.instances", f"cover replicas 0-{covered - 1}, not 0-{t.num_replicas - 1}")
        for k, i in enumerate(plan.instances):
            where = f"$.instances[{k}]"
            if i.index != k:
                self.fail(f"{where}.index", f"is {i.index}; instance indices are 0, 1, 2 ... in order "
                                            f"(this is instance {k})")
            self.nonneg(f"{where}.replica_offset", i.replica_offset)
            self.positive(f"{where}.num_local_replicas", i.num_local_replicas)
            self.nonneg(f"{where}.local_index", i.local_index, max(t.instances_per_host, 1))
            self.nonneg(f"{where}.ild", i.ild, max(t.num_ilds, 1))
            self.nonneg(f"{where}.gcd", i.gcd, max(t.num_instances, 1))
            self.host(f"{where}.host", i.host)
            if i.host and i.host not in t.hosts:
                self.fail(f"{where}.host", f"is {i.host!r}, which is not among $.topology.hosts")
            if not i.cwd:
                self.fail(f"{where}.cwd", "is empty: the working directory must be named")
            if i.argv and not i.argv[0]:
                self.fail(f"{where}.argv[0]", "is empty: the program needs a name")
            self.environment(where, i.env)
            self.placement(f"{where}.placement", i.placement)

    def environment(self, where: str, env: p.Environment) -> None:
        for name, _ in env.set:
            self.env_name(f"{where}.env[{name!r}]", name)
        for key in ("forward", "unset"):
            for k, name in enumerate(getattr(env, key)):
                self.env_name(f"{where}.env_{key}[{k}]", name)

    def placement(self, where: str, placement: p.Placement) -> None:
        if not _WORD.match(placement.strategy):  # a name such as spreadnuma: only shown, never run
            self.fail(f"{where}.strategy", f"is {placement.strategy!r}, not a strategy name such as "
                                           f"{', '.join(PLACEMENTS)}")
        self.cpu_list(f"{where}.cpus", placement.cpus, MAX_CPU)
        self.cpu_list(f"{where}.numa_nodes", placement.numa_nodes, MAX_NUMA_NODE)

    def output(self, output: p.Output, count: int) -> None:
        if output.only_from_instance is not None:
            self.nonneg("$.output.only_from_instance", output.only_from_instance, max(count, 1))
        self.nonneg("$.output.verbosity", output.verbosity)
        if output.output_filename is not None and not output.output_filename:
            self.fail("$.output.output_filename", "is empty; write null for no output files")

    def cache(self, cache: p.Cache) -> None:
        if cache.mode not in _CACHE_MODES:
            self.fail("$.cache.mode", f"is {cache.mode!r}, not one of {', '.join(_CACHE_MODES)}")
        elif cache.mode == "user" and (not cache.path or cache.remove_at_exit):
            self.fail("$.cache", "a user's cache has a path and is never removed (remove_at_exit false)")
        elif cache.mode != "user" and cache.path is not None:
            self.fail("$.cache.path", f"is set, but a {cache.mode} cache has no path in the plan")
        elif cache.mode == "disabled" and cache.remove_at_exit:
            self.fail("$.cache.remove_at_exit", "is true for a disabled cache")

    def partition(self, part: p.Partition) -> None:
        self.host("$.partition.server_host", part.server_host)
        if not 1 <= part.server_port <= MAX_PORT:
            self.fail("$.partition.server_port", f"is {part.server_port}, not a port (1-{MAX_PORT})")
        for name in ("timeout_s", "num_ipus", "num_gcds", "num_ilds", "attempts"):
            self.positive(f"$.partition.{name}", getattr(part, name))
        if part.name is not None and not part.name:
            self.fail("$.partition.name", "is empty; write null for the only partition of the allocation")

    def rest(self, plan: p.LaunchPlan) -> None:
        if not _BACKEND.match(plan.backend.name):
            self.fail("$.backend.name", f"is {plan.backend.name!r}, not a backend name")
        self.backend(plan.backend)
        if plan.mpi.srun_plugin is not None and not _PLUGIN.match(plan.mpi.srun_plugin):
            self.fail("$.mpi.srun_plugin", f"is {plan.mpi.srun_plugin!r}, not the name of srun's MPI plugin")
        if plan.ssh_keys.key_type is not None and plan.ssh_keys.key_type not in SSH_KEY_TYPES:
            self.fail("$.ssh_keys.key_type", f"is {plan.ssh_keys.key_type!r}, not one of {', '.join(SSH_KEY_TYPES)}")
        for k, name in enumerate(plan.mask):
            self.env_name(f"$.mask[{k}]", name)


    def backend(self, backend: p.BackendChoice) -> None:
        """Check the traits are the table's words, and the settings sorted, each once, ``POPRUN_*`` names, values they take."""
        from poprun.planner.setting import DEFAULT, SETTINGS
        from poprun.planner.trait import REACHES

        if backend.traits.reaches not in REACHES:
            self.fail("$.backend.traits.reaches", f"is {backend.traits.reaches!r}, not one of {', '.join(REACHES)}")
        names = [s.name for s in backend.settings]
        if names != sorted(set(names)):
            self.fail("$.backend.settings", "is not sorted by name, each setting once")
        rows = {row.name: row for row in SETTINGS}
        for k, setting in enumerate(backend.settings):
            where = f"$.backend.settings[{k}]"
            if not (_ENV_NAME.match(setting.name) and setting.name.startswith("POPRUN_")):
                self.fail(f"{where}.name", f"is {setting.name!r}, not the name of a POPRUN_ setting")
                continue
            if setting.source not in (DEFAULT, SourceSpan.env(setting.name).describe()):
                self.fail(f"{where}.source", f"is {setting.source!r}, not {DEFAULT} or {SourceSpan.env(setting.name).describe()}")
            row = rows.get(setting.name)
            if row is None or not row.planned:
                continue  # a plugin's own setting: its backend reads it
            try:
                row.check(setting.value, recorded=True)
            except ValueError as exc:
                self.fail(f"{where}.value", f"is {setting.value!r}: {exc}")

    def recovery(self, r: p.Recovery) -> None:
        where = "$.recovery"
        if r.scope not in SCOPES:
            self.fail(f"{where}.scope", f"is {r.scope!r}, not one of {', '.join(SCOPES)}")
        self.nonneg(f"{where}.max_restarts", r.max_restarts, MAX_RESTARTS + 1)
        self.positive(f"{where}.crash_loop", r.crash_loop, MAX_RESTARTS)
        if r.straggler_policy not in STRAGGLER_POLICIES:
            self.fail(f"{where}.straggler_policy",
                      f"is {r.straggler_policy!r}, not one of {', '.join(STRAGGLER_POLICIES)}")
        for name in ("backoff_ms", "backoff_max_ms", "min_uptime_ms", "timeout_ms", "stall_timeout_ms",
                     "signal_before_ms", "heartbeat_timeout_ms"):
            self.nonneg(f"{where}.{name}", getattr(r, name), MAX_SECONDS * 1000 + 1)
        for k, status in enumerate(r.never_retry):
            self.nonneg(f"{where}.never_retry[{k}]", status, MAX_STATUS + 1)
        self.nonneg(f"{where}.signal", r.signal, MAX_SIGNAL + 1)
        if r.signal in (9, 19):  # SIGKILL, SIGSTOP (Linux's numbers, as the plan's): no program catches them
            self.fail(f"{where}.signal", f"is {r.signal} ({'SIGKILL' if r.signal == 9 else 'SIGSTOP'}), which no "  # noqa: PLR2004
                                         "program can catch to checkpoint")
        if len(r.pre_restart) > MAX_COMMAND:
            self.fail(f"{where}.pre_restart", f"is a command of {len(r.pre_restart)} characters (at most {MAX_COMMAND})")
        if not r.signal and r.signal_before_ms:
            self.fail(f"{where}.signal_before_ms", f"is {r.signal_before_ms}, but no signal is sent (signal 0)")
        elif r.signal and r.signal_before_ms >= (r.timeout_ms or 1):
            self.fail(f"{where}.signal_before_ms", f"is {r.signal_before_ms}: a signal is sent before a time limit "
                                                   f"(timeout_ms {r.timeout_ms})")


def strict_scalars(conv: Any) -> None:
    """Make ``conv`` structure ``int``, ``bool`` and ``str`` only from JSON values of that very type (no ``"3"``, no ``true`` for 1)."""

    def hook(kind: type, noun: str) -> Any:
        def structure(value: object, _: object) -> object:
            if type(value) is not kind:
                msg = f"expected {noun}, found {_json_type(value)}"
                raise TypeError(msg)
            return value

        return structure

    conv.register_structure_hook(int, hook(int, "a whole number"))
    conv.register_structure_hook(bool, hook(bool, "true or false"))
    conv.register_structure_hook(str, hook(str, "a string"))


def _json_type(value: object) -> str:
    names = {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "an array",
             dict: "an object", type(None): "null"}
    return f"{names.get(type(value), type(value).__name__)} ({value!r})" if not isinstance(value, dict | list) \
        else names[type(value)]
