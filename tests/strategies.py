"""
Hypothesis strategies shared by the property tests: valid specs and their parts.

A generated :class:`Spec` is what a front end could give: choices in their canonical
case, subnets normalised, hosts unique, ``instance_args`` sorted by unique index, no ``-x``
left inside mpirun arguments. Every origin is :data:`DUMMY_SPAN`, since origins never
take part in equality.
"""

from __future__ import annotations

import ipaddress
from typing import Any, TypeVar

from hypothesis import strategies as st

from poprun.core.span import SourceSpan
from poprun.planner import option
from poprun.planner.spec import EnvVarSpec, InstanceArgsSpec, Sourced, Spec

T = TypeVar("T")

__all__ = ["DUMMY_SPAN", "env_vars", "host_names", "instance_args", "sourced", "specs", "subnets", "texts"]

DUMMY_SPAN = SourceSpan(file="<strategy>", key_path="$")

# Text as users write it: spaces, quotes, backslashes, '=' and '#', unicode; no lone surrogates.
texts = st.text(st.characters(exclude_categories=["Cs"]), max_size=12) | st.sampled_from(
    ["", " ", "a b", "it's", 'say "hi"', "back\\slash", "x=1", "#hash", "naïve", "日本語", "--epochs"])
host_names = st.sampled_from([f"pod{n}" for n in range(1, 10)] + ["pod10", "login", "pod01"])
env_names = st.from_regex(r"[A-Z_][A-Z0-9_]{0,6}", fullmatch=True) | st.sampled_from(
    ["PYTHONPATH", "OMP_NUM_THREADS", "a", "x_1"])
mpi_words = texts.filter(lambda word: word != "-x")
positive = st.integers(1, 2**31)
subnets = st.builds(lambda address, prefix: str(ipaddress.ip_network(f"{address}/{prefix}", strict=False)),
                    st.ip_addresses(v=4), st.integers(0, 32)) | st.builds(
    lambda address, prefix: str(ipaddress.ip_network(f"{address}/{prefix}", strict=False)),
    st.ip_addresses(v=6), st.integers(0, 128))


def sourced(values: st.SearchStrategy[T]) -> st.SearchStrategy[Sourced[T]]:
    """Return values wrapped in :class:`Sourced` with the dummy span."""
    return values.map(lambda value: Sourced(value, DUMMY_SPAN))


env_vars = st.builds(EnvVarSpec, name=env_names, value=st.none() | texts)


@st.composite
def instance_args(draw: st.DrawFn) -> tuple[Sourced[InstanceArgsSpec], ...]:
    """Draw per-instance arguments with unique indices, sorted by index."""
    indices = sorted(draw(st.sets(st.integers(0, 15), max_size=3)))
    return tuple(
        Sourced(InstanceArgsSpec(index=index, env=tuple(draw(st.lists(env_vars, max_size=3))),
                                 mpi_args=tuple(draw(st.lists(mpi_words, max_size=3)))), DUMMY_SPAN)
        for index in indices)


def _field_values(kind: str, choices: tuple[str, ...]) -> st.SearchStrategy[Any]:
    """Return the values a front end gives for an option of ``kind``."""
    return {
        "int": positive, "nonneg": st.integers(0, 64), "count": st.integers(0, 3), "port": st.integers(1, 65535),
        "bool": st.booleans(), "str": texts, "path": texts, "subnet": subnets,
        "choice": st.sampled_from(choices) if choices else texts,
        "backend": st.sampled_from(choices) | st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,15}", fullmatch=True).filter(
            lambda name: name.lower() not in choices),
        "hosts": st.lists(host_names, unique=True, max_size=6).map(tuple),
        "args": st.lists(mpi_words, max_size=4).map(tuple),
        "names": st.lists(env_names, unique=True, min_size=1,
                          max_size=3).map(tuple),
        "seconds": st.integers(0, 8_640_000_000),
        "statuses": st.sets(st.integers(0, 255), max_size=4).map(lambda s: tuple(sorted(s))),
        "signal": st.tuples(st.sampled_from([1, 2, 10, 12, 15, 34]), st.integers(1, 8_640_000_000)),
    }[kind]


@st.composite
def specs(draw: st.DrawFn) -> Spec:
    """Draw a valid spec: each field set or not, env and instance arguments included."""
    values: dict[str, Any] = {}
    for field, opt in option.BY_FIELD.items():
        if draw(st.booleans()):
            values[field] = Sourced(draw(_field_values(opt.kind, opt.choices)), DUMMY_SPAN)
    if draw(st.booleans()):
        values["program"] = Sourced(tuple(draw(st.lists(texts, max_size=5))), DUMMY_SPAN)
    if draw(st.booleans()):
        values["working_dir"] = Sourced(draw(texts), DUMMY_SPAN)
    env = tuple(draw(st.lists(sourced(env_vars), max_size=4)))
    return Spec(**values, env=env, instance_args=draw(instance_args()))


