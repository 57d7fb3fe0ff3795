"""
Laws of ``poprun.core.hostlist``, checked with hypothesis against python-hostlist as an oracle.
"""

from __future__ import annotations

import string

import hostlist  # type: ignore[import-untyped]  # python-hostlist ships no types
from hypothesis import given, settings
from hypothesis import strategies as st

from poprun.core.hostlist import HostlistError, compress, expand, natural_key

NAME_CHARS = string.ascii_letters + string.digits + ".-_:"

prefixes = st.text(alphabet=string.ascii_lowercase, max_size=3)


@st.composite
def range_pieces(draw: st.DrawFn) -> str:
    """
    Draw one range piece: a number or lo-hi, each bound optionally zero-padded.
    """
    lo = draw(st.integers(0, 12))
    lo_text = f"{lo:0{draw(st.integers(1, 3))}d}"
    if draw(st.booleans()):
        return lo_text
    hi = draw(st.integers(lo, lo + 12))
    return f"{lo_text}-{hi:0{draw(st.integers(1, 3))}d}"


brackets = st.lists(range_pieces(), min_size=1, max_size=3).map(lambda p: "[" + ",".join(p) + "]")


@st.composite
def items(draw: st.DrawFn) -> str:
    """
    Draw one item: a name of literal text and up to two bracketed ranges.
    """
    parts = [draw(prefixes)]
    for _ in range(draw(st.integers(0, 2))):
        parts += [draw(brackets), draw(prefixes)]
    name = "".join(parts)
    return name or "h"


host_lists = st.lists(items(), min_size=1, max_size=4).map(",".join)

host_names = st.one_of(
    st.builds(
        lambda prefix, number, width, suffix: f"{prefix}{number:0{width}d}{suffix}",
        st.sampled_from(["pod", "r1n", "a", "b-", ""]),
        st.integers(0, 30),
        st.integers(1, 3),
        st.sampled_from(["", "x", ".ib"]),
    ),
    st.sampled_from(["login", "a", "b"]),
    st.text(alphabet=NAME_CHARS, min_size=1, max_size=8).filter(lambda name: not name.startswith("-")),
)

parser_text = st.one_of(st.text(), st.text(alphabet="pod[]-,0123456789 \t", max_size=20))


@settings(max_examples=300, deadline=None)
@given(host_lists)
def test_expand_agrees_with_python_hostlist(text: str) -> None:
    """
    On valid host lists, expand gives what python-hostlist's expand_hostlist gives.
    """
    assert list(expand(text)) == hostlist.expand_hostlist(text)


@settings(max_examples=300, deadline=None)
@given(st.lists(host_names, min_size=1, max_size=20))
def test_expand_inverts_compress(hosts: list[str]) -> None:
    """
    Compressing and expanding host names gives them back, sorted and deduplicated.
    """
    assert expand(compress(hosts)) == tuple(sorted(set(hosts), key=natural_key))


@settings(max_examples=200, deadline=None)
@given(host_lists)
def test_compress_of_expand_is_a_fixed_point(text: str) -> None:
    """
    The canonical form of a host list is its own canonical form.
    """
    canonical = compress(expand(text))
    assert compress(expand(canonical)) == canonical


@settings(max_examples=400, deadline=None)
@given(parser_text)
def test_expand_raises_only_hostlist_error(text: str) -> None:
    """
    Any text either expands or raises HostlistError pointing inside the text.
    """
    try:
        hosts = expand(text)
    except HostlistError as error:
        assert 0 <= error.position <= len(text)
        assert error.length >= 1
        assert error.message and "\n" not in error.message and not error.message.endswith(".")
        assert error.hint
    else:
        assert isinstance(hosts, tuple) and hosts
        assert all(isinstance(host, str) and host for host in hosts)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10**6), st.integers(0, 10**6), prefixes)
def test_natural_key_orders_numbers_by_value(a: int, b: int, prefix: str) -> None:
    """
    Names that differ only in an unpadded number sort by that number.
    """
    assert (natural_key(f"{prefix}{a}") < natural_key(f"{prefix}{b}")) == (a < b)


def test_natural_key_sorts_pod2_before_pod10() -> None:
    """
    The textbook case: pod2 sorts before pod10.
    """
    assert sorted(["pod10", "pod2"], key=natural_key) == ["pod2", "pod10"]


@settings(max_examples=300, deadline=None)
@given(st.text(), st.text())
def test_natural_key_is_total_and_distinguishes_strings(a: str, b: str) -> None:
    """
    Keys of any two strings compare without raising and are equal only for equal strings.
    """
    assert (natural_key(a) == natural_key(b)) == (a == b)
    assert sorted([a, b], key=natural_key) == sorted([b, a], key=natural_key)
