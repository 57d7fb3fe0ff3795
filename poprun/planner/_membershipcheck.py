"""
A saved plan's membership policy (``$.membership``) checked as untrusted input.

Layer: ``poprun.planner``; imports ``poprun.core``, the plan model and the membership policy's
limits, and on use the TOML front end (to read the kept spec); imported by
:mod:`poprun.planner.plancheck` only for a plan that has a membership policy, so that a plan
without one never loads these modules.

The rules are those :func:`poprun.planner.membership.membership` keeps when it decides the
policy: spares are host names, none a host of the plan, none twice; ``min_hosts`` is 0 (every
host) up to the host count; the health check and its time limit are in range; ``spec`` is
empty, or a bounded TOML spec that the TOML front end reads, kept exactly when a re-plan may
change the hosts (spares, or fewer hosts allowed) and the backend can run an attempt on other
hosts. Each broken rule is reported through ``fail(path, detail)`` (PR114).
"""

from __future__ import annotations

import re

from poprun.core.diagnostic import DiagnosticError
from poprun.planner.membership import MAX_CHECK_S, MAX_COMMAND, SPEC_FILE

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from collections.abc import Callable

    from poprun.planner import plan as p

__all__ = ["MAX_SPEC", "check_membership"]

MAX_SPEC = 256 * 1024  # the spec kept to solve again, in characters: a spec file's worth, never a plan's bulk
_HOST = re.compile(r"[A-Za-z0-9_.:][A-Za-z0-9_.:-]{0,252}\Z")
WHERE = "$.membership"


def check_membership(plan: p.LaunchPlan, fail: Callable[[str, str], None]) -> None:
    """Call ``fail(path, detail)`` for each broken rule of ``plan.membership``."""
    m, hosts = plan.membership, plan.topology.hosts
    _spares(m.spares, hosts, fail)
    if not 0 <= m.min_hosts <= len(hosts):
        fail(f"{WHERE}.min_hosts", f"is {m.min_hosts}; it must be from 0 (every host) to the plan's {len(hosts)} hosts")
    if len(m.health_check) > MAX_COMMAND:
        fail(f"{WHERE}.health_check", f"is a command of {len(m.health_check)} characters (at most {MAX_COMMAND})")
    if not 0 < m.health_check_timeout_ms <= MAX_CHECK_S * 1000:
        fail(f"{WHERE}.health_check_timeout_ms", f"is {m.health_check_timeout_ms}; it must be from 1 to "
                                                  f"{MAX_CHECK_S * 1000} (milliseconds)")
    changes = bool(m.spares) or 0 < m.min_hosts < len(hosts)
    if m.spec and not changes:
        fail(f"{WHERE}.spec", "is set, but no re-plan can change the hosts (no spares, no fewer hosts): it must be empty")
    elif changes and not m.spec:
        fail(f"{WHERE}.spec", "is empty, but spares or fewer hosts need the spec to solve again")
    elif changes and not plan.backend.traits.replaces_hosts:
        fail(WHERE, f"has spares or fewer hosts, but the {plan.backend.name} backend runs every attempt on the same "
                    "hosts (backend.traits.replaces_hosts is false)")
    if m.spec:
        _spec(m.spec, fail)


def _spares(spares: tuple[str, ...], hosts: tuple[str, ...], fail: Callable[[str, str], None]) -> None:
    seen: set[str] = set()
    for k, name in enumerate(spares):
        where = f"{WHERE}.spares[{k}]"
        if not _HOST.match(name):
            fail(where, f"is {name!r}: host names hold only letters, digits, '.', '-', '_' and ':'")
        elif name in hosts:
            fail(where, f"is {name!r}, a host of the plan too: a spare runs nothing until it takes a host's place")
        elif name in seen:
            fail(where, f"is {name!r}, a spare named twice")
        seen.add(name)


def _spec(text: str, fail: Callable[[str, str], None]) -> None:
    if len(text) > MAX_SPEC:
        fail(f"{WHERE}.spec", f"is {len(text)} characters long (at most {MAX_SPEC})")
        return
    from poprun.planner.tomlspec import parse_toml

    try:
        parse_toml(text, file=SPEC_FILE)
    except DiagnosticError as exc:
        first = exc.diagnostics[0]
        fail(f"{WHERE}.spec", f"is not a spec poprun can solve again ({first.code} at {first.span.describe()}: "
                              f"{first.summary})")
