"""
Laws of the rank order: the natural order is a total order that sorts digit runs by value; a topology order is a
permutation of the hosts that keeps every group consecutive; the given order is the identity.
"""

from __future__ import annotations

import re
import string

from hypothesis import given, settings
from hypothesis import strategies as st

from poprun.core.record import evolve
from poprun.planner.context import Context
from poprun.planner.flags import parse_flags
from poprun.planner.rankorder import natural, natural_key, order, parse_topology
from poprun.planner.solve import solve

NAME = st.text(alphabet=string.ascii_lowercase[:4] + string.digits + ".-", min_size=1, max_size=12)
CTX = Context(environ={"PATH": "/usr/bin"}, cwd="/work", local_names=("localhost",))


@given(st.lists(NAME, max_size=12))
def test_natural_order_is_total_and_does_not_depend_on_the_input_order(names: list[str]) -> None:
    """Distinct names get distinct keys; any order of the same names sorts the same."""
    assert len({natural_key(n) for n in names}) == len(set(names))
    assert natural(names) == natural(reversed(names)) == natural(sorted(names))


@given(NAME, NAME, NAME)
def test_natural_order_is_transitive(a: str, b: str, c: str) -> None:
    ka, kb, kc = natural_key(a), natural_key(b), natural_key(c)
    if ka <= kb <= kc:
        assert ka <= kc


@given(st.text(alphabet=string.ascii_lowercase, min_size=1, max_size=4), st.integers(0, 10**6), st.integers(0, 10**6),
       st.text(alphabet=string.ascii_lowercase + ".", max_size=4))
def test_numbers_sort_by_value(prefix: str, x: int, y: int, suffix: str) -> None:
    """prefix<x>suffix before prefix<y>suffix exactly when x < y (unpadded numbers)."""
    if x != y:
        assert (natural_key(f"{prefix}{x}{suffix}") < natural_key(f"{prefix}{y}{suffix}")) == (x < y)


@st.composite
def trees(draw: st.DrawFn) -> tuple[str, tuple[str, ...]]:
    """Draw a topology.conf of leaves under spines (some leaves roots themselves) and the hosts to order."""
    hosts = [f"n{i}" for i in draw(st.lists(st.integers(0, 60), min_size=1, max_size=20, unique=True))]
    leaves = draw(st.integers(1, len(hosts)))
    owner = [draw(st.integers(0, leaves - 1)) for _ in hosts]
    lines = [f"SwitchName=leaf{k} Nodes={','.join(h for h, o in zip(hosts, owner, strict=True) if o == k) or 'x' + str(k)}"
             for k in range(leaves)]
    spines = draw(st.integers(0, leaves))
    under = [draw(st.integers(0, spines)) if spines else 0 for _ in range(leaves)]  # == spines: a root leaf
    for s in range(spines):
        children = [f"leaf{k}" for k in range(leaves) if under[k] == s]
        if children:
            lines.append(f"SwitchName=spine{s} Switches={','.join(children)}")
    order_given = tuple(draw(st.permutations(hosts)))
    return "\n".join(draw(st.permutations(lines))) + "\n", order_given


@settings(max_examples=200)
@given(trees())
def test_topology_order_is_a_permutation_that_keeps_every_group_consecutive(case: tuple[str, tuple[str, ...]]) -> None:
    text, hosts = case
    groups, missing = order(hosts, parse_topology(text, file="t"))
    ordered = [h for g in groups for h in g.hosts]

    assert () == missing
    assert sorted(hosts) == sorted(ordered)
    seen: list[str] = []
    for g in groups:  # a group's hosts all come before the next group's: each group one run
        assert g.name not in seen
        seen.append(g.name)
        assert list(g.hosts) == list(natural(g.hosts))
    parents = [g.parents[0] if g.parents else g.name for g in groups]
    runs = [p for i, p in enumerate(parents) if i == 0 or parents[i - 1] != p]
    assert len(runs) == len(set(runs)), "leaves under one parent switch are consecutive"


@settings(max_examples=50, deadline=None)
@given(st.lists(st.sampled_from([f"node{i}" for i in (1, 2, 7, 8, 10, 66, 100)]), min_size=1, max_size=7, unique=True),
       st.sampled_from([1, 2]))
def test_given_order_is_the_identity_and_natural_sorts(hosts: list[str], per_host: int) -> None:
    n = len(hosts) * per_host
    argv = ["-H", ",".join(hosts), "--num-instances", str(n), "--num-replicas", str(n)]
    default = solve(parse_flags([*argv, "python3", "t.py"]).spec, CTX).plan
    given_ = solve(parse_flags([*argv, "--rank-order", "given", "python3", "t.py"]).spec, CTX).plan
    natural_ = solve(parse_flags([*argv, "--rank-order", "natural", "python3", "t.py"]).spec, CTX).plan

    assert tuple(hosts) == default.topology.hosts
    assert evolve(default, explanation=()) == evolve(given_, explanation=())
    assert [i.host for i in natural_.instances] == [h for h in natural(hosts) for _ in range(per_host)]
    assert [int(re.sub(r"\D", "", i.host)) for i in natural_.instances] == sorted(
        int(re.sub(r"\D", "", h)) for h in hosts for _ in range(per_host))
