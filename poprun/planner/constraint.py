"""
The division rules of a launch, declared as data.

Layer: ``poprun.planner``; imports ``poprun.core`` only. Solving checks them, ``--explain`` prints
them, and the infeasibility report searches them for the nearest values that satisfy all.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from poprun.core.record import positional_record

# The values a rule may bind. "hosts" is the number of hosts.
NOUNS = {"replicas": "replicas", "instances": "instances", "hosts": "hosts", "ilds": "ILDs",
         "ipus_per_replica": "IPUs per replica"}
Values = Mapping[str, int]
# Far beyond any Pod system (a Pod1024 has 1024 IPUs); larger numbers only make planning slow.
LIMITS = {"replicas": 1_000_000, "instances": 100_000, "ilds": 100_000, "ipus_per_replica": 1024}
_SEARCH = 10_000  # how far the nearest feasible values are searched for, each way


@positional_record
class Constraint:
    """
    One rule: its name, the values it binds, and its messages.

    ``holds`` decides; ``explain`` says why it holds; ``detail`` says why it does not.
    ``applies`` limits the rule to some launches (e.g. those with an offline target).
    """

    name: str
    code: str
    summary: str
    binds: tuple[str, ...]
    holds: Callable[[Values], bool]
    explain: Callable[[Values], str]
    detail: Callable[[Values], str]
    applies: Callable[[Values], bool] = lambda _: True


def _n(count: int, noun: str) -> str:
    """Return ``1 host`` / ``2 hosts``; ``noun`` is the plural."""
    return f"{count} {noun[:-1] if count == 1 and noun.endswith('s') else noun}"


def _ipus(v: Values) -> int:
    return v["replicas"] * v["ipus_per_replica"]


CONSTRAINTS: tuple[Constraint, ...] = (
    Constraint(
        "replicas_over_instances", "PR300", "replicas do not divide across instances",
        ("replicas", "instances"),
        holds=lambda v: v["replicas"] % v["instances"] == 0,
        explain=lambda v: f"{_n(v['replicas'], 'replicas')} / {_n(v['instances'], 'instances')} = "
        f"{v['replicas'] // v['instances']} per instance",
        detail=lambda v: f"{v['replicas']} replicas cannot be split evenly across {v['instances']} instances",
    ),
    Constraint(
        "instances_over_hosts", "PR301", "instances do not divide across hosts",
        ("instances", "hosts"),
        holds=lambda v: v["instances"] % v["hosts"] == 0,
        explain=lambda v: f"{_n(v['instances'], 'instances')} / {_n(v['hosts'], 'hosts')} = "
        f"{v['instances'] // v['hosts']} per host",
        detail=lambda v: f"{v['instances']} instances cannot be split evenly across {v['hosts']} hosts",
    ),
    Constraint(
        "target_size", "PR305", "more IPUs than the target has",
        ("replicas", "ipus_per_replica"),
        holds=lambda v: _ipus(v) <= v["target_ipus"],
        explain=lambda v: f"{_ipus(v)} IPUs, at most {v['target_ipus']} on the offline target",
        detail=lambda v: f"{_n(v['replicas'], 'replicas')} x {_n(v['ipus_per_replica'], 'IPUs')} = {_ipus(v)} IPUs, "
        f"but the offline target has {v['target_ipus']}",
        applies=lambda v: v["target_ipus"] > 0,
    ),
    Constraint(
        "instances_over_ilds", "PR302", "instances do not divide across IPU-Link domains",
        ("instances", "ilds"),
        holds=lambda v: v["instances"] % v["ilds"] == 0,
        explain=lambda v: f"{_n(v['instances'], 'instances')} / {_n(v['ilds'], 'ILDs')} = "
        f"{v['instances'] // v['ilds']} per ILD",
        detail=lambda v: f"{v['instances']} instances cannot be split evenly across {v['ilds']} ILDs",
    ),
    Constraint(
        "ild_capacity", "PR303", "IPU-Link domain over capacity",
        ("replicas", "ipus_per_replica", "ilds"),
        holds=lambda v: -(-_ipus(v) // v["ilds"]) <= v["ild_size"],
        explain=lambda v: f"{_n(_ipus(v), 'IPUs')} over {_n(v['ilds'], 'ILDs')} = {-(-_ipus(v) // v['ilds'])} per ILD, "
        f"at most {v['ild_size']}",
        detail=lambda v: f"{_n(_ipus(v), 'IPUs')} in {_n(v['ilds'], 'ILDs')} need {-(-_ipus(v) // v['ilds'])} IPUs per ILD, "
        f"but an ILD of the target has {v['ild_size']}",
    ),
)


def violated(values: Values) -> tuple[Constraint, ...]:
    """Return the rules that ``values`` break."""
    return tuple(c for c in CONSTRAINTS if c.applies(values) and not c.holds(values))


def feasible(values: Values) -> bool:
    """Return whether ``values`` satisfy every rule."""
    return not violated(values)


def alternatives(values: Values, rule: Constraint, *, free: tuple[str, ...],
                 adjust: Callable[[dict[str, int]], dict[str, int]] = dict) -> dict[str, tuple[int, ...]]:
    """
    Return, for each value ``rule`` binds that the user may change, the nearest feasible ones.

    At most one value below and one above the current one, searching outward; every
    suggestion satisfies all rules with the other values unchanged, after ``adjust``
    re-derives the values the user left open (the ILDs).
    """
    found: dict[str, tuple[int, ...]] = {}
    for name in rule.binds:
        if name not in free:
            continue
        current = values[name]
        reach = min(_SEARCH, current * 4 + 64)
        below = next((c for c in range(current - 1, max(current - reach, 0), -1)
                      if feasible(adjust({**values, name: c}))), None)
        above = next((c for c in range(current + 1, current + reach) if feasible(adjust({**values, name: c}))),
                     None)
        picks = tuple(c for c in (below, above) if c is not None)
        if picks:
            found[name] = picks
    return found
