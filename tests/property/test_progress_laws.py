"""Laws of the progress channel: the parser never raises nor trusts a stranger; the board's statistics are exact."""

from __future__ import annotations

import json
import statistics

from hypothesis import given
from hypothesis import strategies as st

from poprun.apply.progress import CLOCK_JUMP_RATIO, CLOCK_JUMP_S, Board
from poprun.core.progress import MAX_DATAGRAM, Update, parse

TOKEN = b"0123456789abcdef0123456789abcdef"
tokens = st.text("0123456789abcdef", min_size=32, max_size=32).map(str.encode)
finite = st.floats(allow_nan=False, allow_infinity=False, min_value=-1e12, max_value=1e12)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | finite | st.text(max_size=70),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=70), inner, max_size=4), max_leaves=12)
bodies = st.fixed_dictionaries({}, optional={
    "i": st.integers(-2, 2**32) | json_values, "a": st.integers(-2, 5) | json_values,
    "k": st.sampled_from(["p", "h", "x"]) | json_values, "s": st.integers(-5, 10**20) | finite | json_values,
    "n": st.none() | st.integers(-1, 10**6) | json_values, "t": finite | json_values,
    "c": st.integers(-1, 10) | json_values, "d": finite | json_values, "x": st.integers(-1, 5) | json_values,
    "m": st.dictionaries(st.text(max_size=70), json_values, max_size=6) | json_values,
})


def encode(token: bytes, body: dict[str, object]) -> bytes:
    """Return ``body`` as a datagram with ``token`` (the sender's JSON: compact, ASCII)."""
    return b"PRP1 " + token + b" " + json.dumps(body, separators=(",", ":")).encode()


@given(st.binary(max_size=2 * MAX_DATAGRAM), st.binary(max_size=40))
def test_parse_never_raises_on_any_bytes(datagram: bytes, token: bytes) -> None:
    """Whatever arrives, parse answers an update or None."""
    assert parse(datagram, token) is None or isinstance(parse(datagram, token), Update)


@given(tokens, tokens, bodies)
def test_parse_never_accepts_without_the_exact_token(sent: bytes, expected: bytes, body: dict[str, object]) -> None:
    """A well-formed datagram bearing another token than the run's is dropped; with the run's, only a well-formed one is kept."""
    datagram = encode(sent, body)
    got = parse(datagram, expected)

    if sent != expected:
        assert got is None
    elif got is not None:
        assert len(datagram) <= MAX_DATAGRAM
        assert got.index >= 0
        assert got.attempt >= 0
        assert got.calls >= 1
        assert (got.step is None) == (body.get("k") == "h")


@given(tokens, st.binary(min_size=1, max_size=MAX_DATAGRAM))
def test_parse_keeps_the_token_check_against_any_tail(token: bytes, tail: bytes) -> None:
    """Any tail after another token is None, even one that would parse."""
    other = bytes(reversed(token)) if bytes(reversed(token)) != token else token.replace(token[:1], b"g")
    assert parse(b"PRP1 " + other + b" " + tail, token) is None


def reference(updates: list[tuple[float, float, float | None]], window: int) -> list[float]:
    """
    Return the window of step times the board's rules give for one instance's (step, time, d) updates.

    Written apart from the board, from its docstring's rules, as plainly as they read.
    """
    times: list[float] = []
    step: float | None = None
    since = heard = 0.0
    for now, (new, at, own) in enumerate(updates):  # poprun hears update number n at n seconds
        if step is not None and new < step:
            times, step = [], None
        if step is None:
            step, since, heard = new, at, now
            times += [own] if own is not None else []
        elif new != step:
            advanced, elapsed, seen = new - step, at - since, now - heard
            step, since, heard = new, at, now
            if own is not None:
                times += [own] * min(window, max(1, int(advanced)))
            elif 0 <= elapsed <= seen * CLOCK_JUMP_RATIO + CLOCK_JUMP_S:
                times += [elapsed / advanced] * min(window, max(1, int(advanced)))
    return times[-window:]


steps = st.integers(0, 50) | st.floats(0, 50, allow_nan=False)
moments = st.floats(0, 1000, allow_nan=False)
owns = st.none() | st.floats(0, 10, allow_nan=False)


@given(st.lists(st.tuples(steps, moments, owns), min_size=1, max_size=40), st.integers(1, 25))
def test_the_boards_window_and_median_equal_the_reference(updates: list[tuple[float, float, float | None]], window: int) -> None:
    """Any sequence of updates: the board's window, median, rate and ETA are the reference's, exactly."""
    board = Board(window=window, clock=lambda: 2000.0)
    for number, (step, at, own) in enumerate(updates):
        board.feed(Update(index=0, attempt=0, step=step, total=100, time=at, step_time=own), now=float(number))
    expected = reference(updates, window)

    (got,) = board.snapshot()
    assert list(board.step_times(0)) == expected
    assert got.step_time_s == (statistics.median(expected) if expected else None)
    if expected and sum(expected) > 0:
        assert got.steps_per_s == len(expected) / sum(expected)
    if expected:
        assert got.eta_s == max(0.0, (100 - updates[-1][0]) * statistics.median(expected))
