"""Laws of the straggler rule: blind to the instances' order and to the unit of time; a straggler is above k, and a minority."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from poprun.apply.progress import Board
from poprun.apply.watch import Watch, ratios
from poprun.core.events import Straggler
from poprun.core.progress import Update

step_time = st.floats(min_value=1e-4, max_value=100.0, allow_nan=False, allow_infinity=False)
windows = st.integers(min_value=2, max_value=12)
runs = st.lists(st.lists(step_time, min_size=0, max_size=16), min_size=0, max_size=8)
factors = st.floats(min_value=1.05, max_value=10.0)


def as_run(times: list[list[float]]) -> dict[int, list[float]]:
    return dict(enumerate(times))


@given(runs, windows, st.randoms(use_true_random=False))
def test_the_rule_does_not_depend_on_the_instances_order(times, window, rand):
    """Instances given under other indices get the same ratios, under their new indices."""
    order = list(range(len(times)))
    rand.shuffle(order)
    moved = {order[i]: t for i, t in enumerate(times)}

    middle, found = ratios(as_run(times), window=window)
    moved_middle, moved_found = ratios(moved, window=window)

    assert middle == moved_middle
    assert {order[i]: r for i, r in found.items()} == moved_found


@given(runs, windows, st.sampled_from([0.5, 2.0, 4.0, 1024.0, 1 / 1024]))
def test_the_rule_does_not_depend_on_the_unit_of_time(times, window, scale):
    """Every step time scaled alike (a power of two: exact in binary) leaves every ratio as it was."""
    middle, found = ratios(as_run(times), window=window)
    scaled_middle, scaled = ratios({i: [t * scale for t in ts] for i, ts in enumerate(times)}, window=window)

    assert found == scaled
    assert (middle is None) == (scaled_middle is None)


@given(runs, windows, factors)
def test_stragglers_are_at_most_half_of_the_counted_instances(times, window, factor):
    """Above k > 1 means above the median of medians: at most half of the counted instances are there."""
    _, found = ratios(as_run(times), window=window)
    slow = [i for i, r in found.items() if r > factor]

    assert len(slow) * 2 <= len(found)


@given(st.lists(st.lists(step_time, min_size=4, max_size=4), min_size=1, max_size=5), st.floats(1.0, 50.0), factors)
def test_every_straggler_event_has_a_ratio_above_k(others, slow, factor):
    """Fed to a real board through the watch (one instance ``slow`` times the others' first), each straggler told has ratio > k."""
    instances = [*others, [t * slow for t in others[0]]]
    now = [0.0]
    board = Board(tuple(f"h{i}" for i in range(len(instances))), window=4, clock=lambda: now[0])
    told: list[object] = []
    watch = Watch(board, tuple(f"h{i}" for i in range(len(instances))), heartbeat_s=0, window=4, factor=factor,
                  restart=False, emit=told.append, end=lambda _v: None, clock=lambda: now[0], thread=False)
    watch.attempt(0)
    for step in range(4):
        now[0] += 2.0
        for index, times in enumerate(instances):
            board.feed(Update(index=index, attempt=0, step=step, total=None, time=now[0], step_time=times[step]), now[0])
    for event in told:
        assert isinstance(event, Straggler)
        assert event.ratio > round(factor, 3) - 1e-9
        assert event.step_time_ms >= event.run_median_ms
