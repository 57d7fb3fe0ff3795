"""
Laws of popdist's progress datagrams: any values in, a well-formed datagram of at most 1,400 bytes out; coalescing bounds.

The datagrams are read by the strict parser of ``tests/unit/test_popdist_progress.py`` and,
where poprun's own reader exists (``poprun.core.progress``), by that one too: the two sides of
wire format 1 must agree on everything popdist sends.
"""

from __future__ import annotations

import fractions
import importlib.util
import math
from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from popdist import _progress
from tests.unit.test_popdist_progress import TOKEN, fence, open_channel, strict_parse

HEAD = b"PRP1 " + TOKEN.encode() + b" "


class Raising:
    """An object whose every conversion raises."""

    def __float__(self) -> float:
        raise ValueError("float")

    def __index__(self) -> int:
        raise ValueError("index")

    def __str__(self) -> str:
        raise ValueError("str")


any_text = st.text(st.characters(codec=None, blacklist_categories=()), max_size=200)
values = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(min_value=-(10**400), max_value=10**400),
    st.floats(allow_nan=True, allow_infinity=True), st.decimals(allow_nan=True, allow_infinity=True),
    st.fractions(), any_text, st.binary(max_size=50), st.lists(st.integers(), max_size=5), st.builds(Raising),
    st.sampled_from([Decimal("sNaN"), -0.0, 2**63, -(2**63) - 1, fractions.Fraction(10**400, 3)]),
)
metrics = st.dictionaries(any_text, values, max_size=300)
states = st.tuples(st.integers(min_value=1, max_value=2**40), st.floats(min_value=0, max_value=4e9), values, values,
                   values, metrics)


@given(state=states, index=st.integers(0, 2**31 - 1), attempt=st.integers(0, 2**31 - 1),
       calls=st.integers(1, 2**40))
def test_any_values_make_a_well_formed_datagram_of_at_most_1400_bytes(state, index, attempt, calls):
    """Whatever the step, total, step time and metrics, the datagram parses strictly and counts what it left out."""
    raw = _progress.datagram(HEAD, index, attempt, state, calls)

    got = strict_parse(raw)
    assert len(raw) <= 1400
    assert len(state[5]) == len(got.get("m", {})) + got.get("x", 0)
    assert (index, attempt, min(calls, 2**31 - 1)) == (got["i"], got["a"], got["c"])


@given(named=st.dictionaries(any_text, st.floats(allow_nan=False, allow_infinity=False), max_size=20))
def test_finite_metrics_arrive_as_given_under_keys_cut_to_64(named):
    """Every finite float metric that is kept arrives exactly, under its key's first 64 characters."""
    raw = _progress.datagram(HEAD, 0, 0, (1, 1.0, 1, None, None, named), 1)

    got = strict_parse(raw).get("m", {})
    cut = {}
    for key, value in named.items():
        cut.setdefault(key[:64], value)
    assert all(cut[key] == value for key, value in got.items())


calls = st.lists(st.tuples(st.floats(min_value=0, max_value=0.5), st.sampled_from(["progress", "heartbeat", "last"])),
                 min_size=1, max_size=300)


@given(sequence=calls)
def test_coalescing_sends_at_most_ten_a_second_and_counts_every_call(sequence):
    """Any calls at any pace: regular sends 0.1 s apart, forced ones 1 s apart, and the counts add up to the calls."""
    with pytest.MonkeyPatch.context() as monkeypatch, open_channel(monkeypatch) as (receiver, clock):
        began = clock.now
        for step, (pause, kind) in enumerate(sequence):
            clock.advance(pause)
            if kind == "heartbeat":
                _progress.heartbeat()
            else:
                _progress.progress(step if kind == "progress" else 1000, 1000)
        sender = _progress._SENDER
        assert sender
        sender.flush(clock.now, _progress._EXIT)  # what the exit handler does, before it closes the socket
        fence(receiver.port)
        parsed = receiver.until_fence()
    seconds = clock.now - began
    assert len(sequence) == sum(d["c"] for d in parsed)
    assert len(parsed) <= math.floor(seconds / 0.1) + 1 + math.floor(seconds / 1.0) + 1 + 1
    assert [d["t"] for d in parsed] == sorted(d["t"] for d in parsed)


@pytest.mark.skipif(importlib.util.find_spec("poprun.core.progress") is None, reason="poprun's reader is not here")
@given(state=states, index=st.integers(0, 2**31 - 1), attempt=st.integers(0, 2**31 - 1))
def test_poprun_reads_every_datagram_popdist_sends(state, index, attempt):
    """poprun's parser accepts each datagram and reads the same step, total, count and metrics as the strict parser."""
    from poprun.core import progress as reader

    raw = _progress.datagram(HEAD, index, attempt, state, 3)

    update, strict = reader.parse(raw, TOKEN.encode()), strict_parse(raw)
    assert update is not None
    assert (index, attempt, 3) == (update.index, update.attempt, update.calls)
    assert (strict.get("s"), strict.get("n") if strict["k"] == "p" else None) == (update.step, update.total)
    assert sorted((k, float(v) if isinstance(v, int) else v) for k, v in strict.get("m", {}).items()) == sorted(
        update.metrics)
    assert strict.get("x", 0) == update.left_out

