"""
Unit tests for ``poprun.core.hostlist``: expanding, compressing and sorting host lists.
"""

from __future__ import annotations

import time

import pytest

from poprun.core.hostlist import MAX_HOSTS, HostlistError, compress, expand, natural_key

EXPANSIONS = [
    ("pod1", ("pod1",)),
    ("pod[1-4]", ("pod1", "pod2", "pod3", "pod4")),
    ("pod[1-3,7]", ("pod1", "pod2", "pod3", "pod7")),
    ("pod[7,1-2]", ("pod7", "pod1", "pod2")),
    ("pod[9-11]", ("pod9", "pod10", "pod11")),
    ("pod[01-03]", ("pod01", "pod02", "pod03")),
    ("pod[001-003]", ("pod001", "pod002", "pod003")),
    ("pod[08-10]", ("pod08", "pod09", "pod10")),
    ("pod[0-2]", ("pod0", "pod1", "pod2")),
    ("pod[007]", ("pod007",)),
    ("r[1-2]n[1-2]", ("r1n1", "r1n2", "r2n1", "r2n2")),
    ("a[1-2][3-4]", ("a13", "a14", "a23", "a24")),
    ("pod[1-2].ib", ("pod1.ib", "pod2.ib")),
    ("[1-3]", ("1", "2", "3")),
    ("a,b,c[1-2]", ("a", "b", "c1", "c2")),
    (" a , b ", ("a", "b")),
    ("b,a", ("b", "a")),
    ("a,b,a", ("a", "b")),
    ("pod[1-3],pod[2-4]", ("pod1", "pod2", "pod3", "pod4")),
    ("10.0.0.[1-2]", ("10.0.0.1", "10.0.0.2")),
    ("host_a-1:4", ("host_a-1:4",)),
]


@pytest.mark.parametrize(("text", "hosts"), EXPANSIONS, ids=[t for t, _ in EXPANSIONS])
def test_expand_gives_hosts_in_written_order(text: str, hosts: tuple[str, ...]) -> None:
    """
    Each host list form expands to its hosts, in order and without duplicates.
    """
    assert expand(text) == hosts


def test_expand_keeps_zero_padding() -> None:
    """
    A zero-padded lower bound sets the width of every number in the range.
    """
    assert expand("pod[01-16]") == tuple(f"pod{n:02d}" for n in range(1, 17))


def test_expand_varies_leftmost_range_slowest() -> None:
    """
    Several ranges in one name give their cartesian product, leftmost range slowest.
    """
    assert expand("r[1-2]n[1-3]") == ("r1n1", "r1n2", "r1n3", "r2n1", "r2n2", "r2n3")


ERRORS = [
    ("pod[1-4", "unclosed host range", 3),
    ("a,pod[1-4", "unclosed host range", 5),
    ("pod]", "unexpected ']'", 3),
    ("pod[1-2]]", "unexpected ']'", 8),
    ("pod[]", "empty host range", 3),
    ("pod[a-b]", "invalid host range piece 'a-b'", 4),
    ("pod[1-2,x]", "invalid host range piece 'x'", 8),
    ("pod[1-]", "invalid host range piece '1-'", 4),
    ("pod[ 1-2]", "invalid host range piece ' 1-2'", 4),
    ("pod[1,]", "empty piece in host range", 6),
    ("pod[5-1]", "reversed host range '5-1'", 4),
    ("pod[1-[2]]", "nested brackets in host range", 6),
    ("a,,b", "empty item in host list", 2),
    ("a,", "empty item in host list", 2),
    (",a", "empty item in host list", 0),
    ("a, ,b", "empty item in host list", 2),
    ("", "empty host list", 0),
    ("   ", "empty host list", 0),
    ("pod 1", "invalid character ' ' in host name", 3),
    ("pod/1", "invalid character '/' in host name", 3),
    ("a,pod\u00e9", "invalid character '\u00e9' in host name", 5),
    ("n[1-999999999]", f"host list expands to more than {MAX_HOSTS} hosts", 0),
    ("a,n[1-50000],m[1-50001]", f"host list expands to more than {MAX_HOSTS} hosts", 13),
    ("a[1-1000]b[1-1000]c[1-1000]", f"host list expands to more than {MAX_HOSTS} hosts", 0),
    ("n[1-" + "9" * 65 + "]", "number in host range is too long", 2),
]


@pytest.mark.parametrize(
    ("text", "message", "position"), ERRORS, ids=[t[:30] for t, _, _ in ERRORS]
)
def test_expand_reports_error_with_position(text: str, message: str, position: int) -> None:
    """
    Each malformed host list raises HostlistError naming the problem and its column.
    """
    with pytest.raises(HostlistError) as caught:
        expand(text)
    assert (caught.value.message, caught.value.position) == (message, position)
    assert str(caught.value) == message
    assert caught.value.hint
    assert caught.value.length >= 1


def test_expand_error_is_a_value_error() -> None:
    """
    HostlistError is a ValueError, so callers that catch ValueError still work.
    """
    with pytest.raises(ValueError, match="unclosed host range"):
        expand("pod[1-4")


def test_expand_reversed_range_hint_shows_the_fix() -> None:
    """
    A reversed range's hint spells out the range the right way round.
    """
    with pytest.raises(HostlistError) as caught:
        expand("pod[5-1]")
    assert caught.value.hint == "write pod[1-5]"
    assert caught.value.length == 3


def test_expand_empty_brackets_underline_both_brackets() -> None:
    """
    Empty brackets are underlined as a whole.
    """
    with pytest.raises(HostlistError) as caught:
        expand("pod[]")
    assert caught.value.length == 2


def test_expand_accepts_exactly_the_limit() -> None:
    """
    A list of exactly ``limit`` hosts expands; one more is an error.
    """
    assert len(expand("n[1-5]", limit=5)) == 5
    with pytest.raises(HostlistError, match="more than 4 hosts"):
        expand("n[1-5]", limit=4)


def test_expand_rejects_huge_lists_without_expanding() -> None:
    """
    A list far past the limit fails at once instead of building it.
    """
    start = time.perf_counter()
    for text in ("n[1-999999999999]", "a[1-1000]b[1-1000]c[1-1000]", "x" + "[1-9]" * 500):
        with pytest.raises(HostlistError, match="more than"):
            expand(text)
    assert time.perf_counter() - start < 0.5


def test_expand_counts_duplicates_towards_the_limit() -> None:
    """
    The limit is checked before duplicates are removed, so it is an upper bound.
    """
    with pytest.raises(HostlistError, match="more than 3 hosts"):
        expand("a,a,a,a", limit=3)


COMPRESSIONS = [
    ([], ""),
    (["pod1"], "pod1"),
    (["pod1", "pod2", "pod3", "pod7"], "pod[1-3,7]"),
    (["pod3", "pod1", "pod2", "pod1"], "pod[1-3]"),
    (["pod9", "pod10"], "pod[9-10]"),
    (["pod09", "pod10"], "pod[09-10]"),
    (["pod01", "pod02", "pod10"], "pod[01-02,10]"),
    (["pod9", "pod09"], "pod[09,9]"),
    (["pod1", "pod2", "login"], "login,pod[1-2]"),
    (["r1n1", "r1n2", "r2n1", "r2n2"], "r1n[1-2],r2n[1-2]"),
    (["pod1.ib", "pod2.ib"], "pod[1-2].ib"),
    (["a", "b"], "a,b"),
]


@pytest.mark.parametrize(
    ("hosts", "text"), COMPRESSIONS, ids=[",".join(h) or "nothing" for h, _ in COMPRESSIONS]
)
def test_compress_gives_canonical_host_list(hosts: list[str], text: str) -> None:
    """
    Host names compress to a sorted, deduplicated list of ranges on their last number.
    """
    assert compress(hosts) == text


def test_compress_writes_single_host_without_brackets() -> None:
    """
    A lone numbered host is written plainly, not as a one-number range.
    """
    assert compress(expand("pod[1]")) == "pod1"


@pytest.mark.parametrize(
    "text", ["pod[01-16]", "pod[8-12],pod[08-09]", "r[1-2]n[1-2]", "a,b,c[1-2]"]
)
def test_compress_undoes_expand(text: str) -> None:
    """
    Expanding a compressed list gives back the sorted hosts.
    """
    hosts = expand(text)
    assert expand(compress(hosts)) == tuple(sorted(hosts, key=natural_key))


@pytest.mark.parametrize(("host", "position"), [("", 0), ("pod 1", 3), ("pod[1]", 3)])
def test_compress_rejects_invalid_host_names(host: str, position: int) -> None:
    """
    A name that is not a valid host name raises HostlistError at the bad character.
    """
    with pytest.raises(HostlistError) as caught:
        compress(["ok", host])
    assert caught.value.position == position


def test_compress_rejects_a_single_string() -> None:
    """
    Passing one string instead of a list of names is a TypeError, not a list of letters.
    """
    with pytest.raises(TypeError, match="not a str"):
        compress("pod1")


def test_natural_key_orders_numbers_by_value() -> None:
    """
    Numbers inside names sort by value, so pod2 comes before pod10.
    """
    hosts = ["pod10", "pod2", "pod1", "login", "pod02", "pod1a"]
    assert sorted(hosts, key=natural_key) == ["login", "pod1", "pod1a", "pod02", "pod2", "pod10"]


def test_natural_key_compares_digits_with_text() -> None:
    """
    A number and text at the same place compare without a TypeError.
    """
    assert sorted(["a-", "a1", "a"], key=natural_key) == ["a", "a1", "a-"]
