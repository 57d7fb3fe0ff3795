"""
The recovery policy: restarts, time limits and the port plan, decided and explained.

Layer: ``poprun.planner``; imports ``poprun.core``, the plan model and the solver's state.
:func:`recovery` decides each part of :class:`~poprun.planner.plan.Recovery` from the spec
(a flag, a TOML key, a DSL statement, a ``POPRUN_*`` variable) or its default, and records a
decision for each under a ``recovery.`` key, which ``plan --explain`` shows in its own section.
The apply step acts on the result; nothing here starts, waits or picks a port.
"""

from __future__ import annotations

from popdist import env as names
from poprun.core.secret import printable
from poprun.core.span import SourceSpan
from poprun.planner import plan as p
from poprun.planner import value as conv
from poprun.planner.spec import Sourced
from poprun.planner.state import Solver

PREFIX = "recovery."
_DEFAULT = p.NO_RECOVERY
# The restart settings that mean nothing without --max-restarts (PR223), with their flags.
_RESTART_ONLY = (("restart_scope", "--restart-scope"), ("restart_backoff", "--restart-backoff"),
                 ("restart_backoff_max", "--restart-backoff-max"), ("min_uptime", "--min-uptime"),
                 ("crash_loop", "--crash-loop"), ("never_retry", "--never-retry"), ("pre_restart", "--pre-restart"))
MAX_RESTARTS = 100_000  # a budget no run needs more of; the plan check holds saved plans to it
MAX_COMMAND = 4096  # the --pre-restart command, in characters


def recovery(s: Solver, hosts: tuple[str, ...]) -> p.Recovery:
    """
    Return the recovery policy of the spec; ``hosts`` are the plan's hosts (instance 0 runs on the first).

    Diagnostics: PR216 (too many restarts, too long a command), PR219-PR221 (errors), PR223 and PR224 (warnings).
    """
    restarts = _restarts(s)
    scope = s.pick(PREFIX + "scope", s.spec.restart_scope, _DEFAULT.scope,
                   "default: a restart stops every instance and starts them all again (the safe choice for "
                   "collectives)")
    backoff, backoff_max = _backoff(s)
    uptime = _seconds(s, "min_uptime", s.spec.min_uptime, _DEFAULT.min_uptime_ms,
                      "default: a failure sooner than this after its start is a quick one")
    loop_given = s.spec.crash_loop if _bounded(s, s.spec.crash_loop, "quick failures in a row") else None
    crash_loop = s.pick(PREFIX + "crash_loop", loop_given, _DEFAULT.crash_loop,
                        "default: this many quick failures in a row end the run")
    never = _never_retry(s)
    command = _pre_restart(s)
    _restart_settings_alone(s, restarts)
    timeout = _seconds(s, "timeout", s.spec.timeout, 0, "default: no time limit for the run")
    stall = _seconds(s, "stall_timeout", s.spec.stall_timeout, 0, "default: no limit on time without output")
    signal, before = _signal(s, timeout)
    _stall_beyond_timeout(s, stall, timeout)
    heartbeat = _heartbeat(s, timeout, stall)
    stragglers = _straggler_policy(s, restarts)
    choose = _choose_port(s, hosts[0])
    return p.Recovery(max_restarts=restarts, scope=scope, backoff_ms=backoff, backoff_max_ms=backoff_max,
                      min_uptime_ms=uptime, crash_loop=crash_loop, never_retry=never, pre_restart=command,
                      timeout_ms=timeout, stall_timeout_ms=stall, signal=signal, signal_before_ms=before,
                      choose_port=choose, heartbeat_timeout_ms=heartbeat, straggler_policy=stragglers)


def _restarts(s: Solver) -> int:
    given = s.spec.max_restarts
    return s.pick(PREFIX + "max_restarts", given if _bounded(s, given, "restarts") else None, _DEFAULT.max_restarts,
                  "default: a failure ends the run (no restart)")


def _bounded(s: Solver, given: Sourced[int] | None, noun: str) -> bool:
    """Return whether a count given is within :data:`MAX_RESTARTS` (PR216 when not)."""
    if given is None or given.value <= MAX_RESTARTS:
        return True
    s.fail("PR216", "number too large", detail=f"{given.value} {noun} is more than poprun plans for "
           f"(at most {MAX_RESTARTS})", span=given.origin, hint=f"use at most {MAX_RESTARTS}")
    return False


def _seconds(s: Solver, key: str, given: Sourced[int] | None, default: int, reason: str) -> int:
    """Decide a time in milliseconds; the decision shows it in seconds."""
    if given is not None:
        s.decide(PREFIX + key, _shown(given.value), given.origin, "as given")
        return given.value
    s.decide(PREFIX + key, _shown(default), SourceSpan.default(PREFIX + key), reason)
    return default


def _shown(millis: int) -> str:
    return "none" if millis == 0 else f"{conv.seconds_text(millis)} s"


def _backoff(s: Solver) -> tuple[int, int]:
    """Return the first wait and the longest (PR221 when a longest wait given is shorter than the first)."""
    spec = s.spec
    first = _seconds(s, "backoff", spec.restart_backoff, _DEFAULT.backoff_ms,
                     "default: the wait before the first restart; it doubles with each restart")
    longest = spec.restart_backoff_max
    if longest is None and first > _DEFAULT.backoff_max_ms:
        s.decide(PREFIX + "backoff_max", _shown(first), SourceSpan.derived(PREFIX + "backoff_max"),
                 f"not given: the default {_shown(_DEFAULT.backoff_max_ms)} is shorter than the first wait")
        return first, first
    if longest is not None and spec.restart_backoff is not None and longest.value < first:
        s.fail("PR221", "longest restart wait shorter than the first",
               detail=f"--restart-backoff-max {conv.seconds_text(longest.value)} is less than --restart-backoff "
                      f"{conv.seconds_text(first)}: the waits could never grow", span=longest.origin,
               hint=f"give --restart-backoff-max {conv.seconds_text(first)} or more, or a shorter --restart-backoff")
    return first, _seconds(s, "backoff_max", longest, max(_DEFAULT.backoff_max_ms, first),
                           "default: the waits stop doubling here")


def _never_retry(s: Solver) -> tuple[int, ...]:
    given = s.spec.never_retry
    if given is not None:
        s.decide(PREFIX + "never_retry", conv.statuses_text(given.value), given.origin, "as given")
        return given.value
    s.decide(PREFIX + "never_retry", conv.statuses_text(_DEFAULT.never_retry), SourceSpan.default("never_retry"),
             "default: a usage error (2), a program that cannot run (126) or is not found (127) fails again")
    return _DEFAULT.never_retry


def _pre_restart(s: Solver) -> str:
    given = s.spec.pre_restart
    if given is None or not given.value:
        s.decide(PREFIX + "pre_restart", "none", given.origin if given else SourceSpan.default("pre_restart"),
                 "no command before a restart")
        return ""
    if len(given.value) > MAX_COMMAND:
        s.fail("PR216", "number too large", detail=f"the --pre-restart command has {len(given.value)} characters "
               f"(at most {MAX_COMMAND})", span=given.origin, hint="put the command in a script and name the script")
        return ""
    s.decide(PREFIX + "pre_restart", printable(given.value), given.origin,
             "run on this machine before each restart; its failure ends the run")
    return given.value


def _restart_settings_alone(s: Solver, restarts: int) -> None:
    """PR223 (warning): restart settings given while no restart is allowed."""
    given = [(flag, getattr(s.spec, field)) for field, flag in _RESTART_ONLY if getattr(s.spec, field) is not None]
    if restarts or not given:
        return
    named = [flag for flag, _ in given]
    flags = named[0] if len(named) == 1 else f"{', '.join(named[:-1])} and {named[-1]}"
    s.warn("PR223", "restart settings without restarts",
           detail=f"{flags} {'has' if len(given) == 1 else 'have'} no effect: --max-restarts is 0, so a failure "
                  "ends the run", span=given[0][1].origin,
           hint="add --max-restarts N to allow up to N restarts, or drop the restart settings")


def _signal(s: Solver, timeout: int) -> tuple[int, int]:
    """Return the signal and how long before the time limit it is sent (PR219, PR220)."""
    given = s.spec.signal
    if given is None:
        s.decide(PREFIX + "signal", "none", SourceSpan.default("signal"), "default: no signal before the time limit")
        return 0, 0
    number, before = given.value
    if not timeout:
        s.fail("PR219", "signal before a time limit that is not set",
               detail=f"--signal {conv.signal_text(given.value)} is sent some time before --timeout ends the run, "
                      "but no --timeout is given", span=given.origin,
               hint=f"add --timeout SECONDS (more than {conv.seconds_text(before)}), or drop --signal")
    elif before >= timeout:
        s.fail("PR220", "signal not before the time limit",
               detail=f"--signal {conv.signal_text(given.value)} would be sent {conv.seconds_text(before)} s before "
                      f"the end of a run of {conv.seconds_text(timeout)} s: at or before its start",
               span=given.origin,
               hint=f"send it less than {conv.seconds_text(timeout)} s before the end, or give a longer --timeout")
    s.decide(PREFIX + "signal", conv.signal_text(given.value), given.origin,
             f"SIG{conv.signal_name(number)} to every instance {conv.seconds_text(before)} s before the time limit")
    return number, before


def _stall_beyond_timeout(s: Solver, stall: int, timeout: int) -> None:
    """PR224 (warning): a stall limit that the run's time limit always reaches first."""
    given = s.spec.stall_timeout
    if given is None or not stall or not timeout or stall < timeout:
        return
    s.warn("PR224", "stall limit not below the time limit",
           detail=f"--stall-timeout {conv.seconds_text(stall)} is not less than --timeout "
                  f"{conv.seconds_text(timeout)}: the time limit always ends the run first", span=given.origin,
           hint=f"give a --stall-timeout below {conv.seconds_text(timeout)}, or drop it")


def _heartbeat(s: Solver, timeout: int, stall: int) -> int:
    """Decide ``--heartbeat-timeout`` (PR235, a warning: not below the run's time limit)."""
    given = s.spec.heartbeat_timeout
    if given is None or not given.value:
        s.decide(PREFIX + "heartbeat_timeout", "none", given.origin if given else SourceSpan.default("heartbeat_timeout"),
                 "default: an instance's silence is not limited (--stall-timeout watches the output of all)"
                 if given is None else "no limit on an instance's silence")
        return 0
    millis = given.value
    also = (f"; --stall-timeout {conv.seconds_text(stall)} s still ends the run when no instance writes output"
            if stall else "")
    s.decide(PREFIX + "heartbeat_timeout", _shown(millis), given.origin,
             "an instance silent this long after its first report in an attempt (popdist.progress or heartbeat) "
             "is hung; one that never reports is not watched" + also)
    if timeout and millis >= timeout:
        s.warn("PR235", "heartbeat limit not below the time limit",
               detail=f"--heartbeat-timeout {conv.seconds_text(millis)} is not less than --timeout "
                      f"{conv.seconds_text(timeout)}: the time limit always ends the run first", span=given.origin,
               hint=f"give a --heartbeat-timeout below {conv.seconds_text(timeout)}, or drop it")
    return millis


def _straggler_policy(s: Solver, restarts: int) -> str:
    """Decide ``--straggler-policy``; the reason states the rule with the plan's window and factor."""
    from poprun.planner.setting import straggler_rule

    window, factor = straggler_rule(s.ctx.environ)
    rule = (f"an instance whose median step time over its last {window} steps is more than {factor} x the median "
            "of all reporting instances' (2 or more) is a straggler")
    given = s.spec.straggler_policy
    if given is None or given.value == "warn":
        s.decide(PREFIX + "straggler_policy", "warn", given.origin if given else SourceSpan.default("straggler_policy"),
                 f"{'as given' if given else 'default'}: {rule}; it is told (an event), nothing more")
        return "warn"
    then = (f"restarted within the budget (--max-restarts {restarts})" if restarts
            else "not restarted (--max-restarts 0): the run ends (status 124) naming it")
    s.decide(PREFIX + "straggler_policy", "restart", given.origin,
             f"{rule}; it ends the attempt as its failure: {then}; with spare hosts, its host is replaced")
    return "restart"


def user_setting(s: Solver, name: str) -> SourceSpan | None:
    """Return where the user sets or forwards variable ``name`` (``-x``, for all instances or one; ``[env]``), or None."""
    given = [(e.value, e.origin) for e in s.spec.env]
    given += [(v, a.origin) for a in s.spec.instance_args for v in a.value.env]
    return next((origin for var, origin in given if var.name == name), None)


def _choose_port(s: Solver, first_host: str) -> bool:
    """Return whether the apply step picks MASTER_PORT: unless the user set it (``-x``, or the launching shell's)."""
    name = names.TORCH_MASTER_PORT
    given = [(e.value, e.origin) for e in s.spec.env]
    given += [(v, a.origin) for a in s.spec.instance_args for v in a.value.env]
    # a forwarded MASTER_PORT (`-x MASTER_PORT`) that the launching shell leaves unset or empty sets nothing
    given = [(var, where) for var, where in given
             if var.name == name and (var.value is not None or s.ctx.environ.get(name, "").strip())]
    for var, where in given:  # each instance's own, not only the first's: a junk one fails them all the same
        _port_value(s, var.value if var.value is not None else s.ctx.environ[name], where)
    if given:
        origin = given[0][1]
        s.decide(PREFIX + "port", "yours", origin, f"{name} set by you: kept, and checked free before any instance "
                 "starts")
        return False
    if s.ctx.environ.get(name, "").strip():  # `export MASTER_PORT=` leaves it empty: as unset
        _port_value(s, s.ctx.environ[name], SourceSpan.env(name))
        s.decide(PREFIX + "port", s.ctx.environ[name], SourceSpan.env(name), f"{name} of the launching shell: kept, "
                 "and checked free before any instance starts")
        return False
    s.decide(PREFIX + "port", "chosen at apply time", SourceSpan.derived(name),
             f"{name} not set: a free port on {first_host} (and the next one for popdist's hub), picked for each "
             "attempt")
    return True


def _port_value(s: Solver, value: str, where: SourceSpan) -> None:
    """PR212 when ``value``, a MASTER_PORT the user set, is not a TCP port (spaces around it are fine: torch strips them)."""
    text = value.strip()
    if text.isascii() and text.isdigit() and 1 <= int(text) <= 65535:  # noqa: PLR2004 - the TCP port range
        return
    s.fail("PR212", "invalid port", detail=f"MASTER_PORT {value!r} is not a port number", span=where,
           hint="set MASTER_PORT to a port from 1 to 65535, or leave it unset and poprun picks a free one")
