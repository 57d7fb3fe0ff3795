"""The progress channel's parser (poprun.core.progress) and the run's Board (poprun.apply.progress)."""

from __future__ import annotations

import json
import threading

import pytest

from poprun.apply.progress import Board, median, nearest_rank
from poprun.core.progress import MAX_DATAGRAM, InstanceProgress, Update, parse

TOKEN = b"0123456789abcdef0123456789abcdef"


def datagram(token: bytes = TOKEN, **fields: object) -> bytes:
    """Return a version-1 datagram as popdist writes it (contract section 2)."""
    data: dict[str, object] = {"i": 0, "a": 0, "k": "p", "s": 1, "n": 10, "t": 100.0, "c": 1}
    data.update(fields)
    data = {key: value for key, value in data.items() if value is not ...}
    return b"PRP1 " + token + b" " + json.dumps(data, separators=(",", ":"), allow_nan=False).encode()


def update(index: int = 0, step: float | None = 1, time: float = 100.0, **fields: object) -> Update:
    """Return an update with the fields a test cares about."""
    values: dict[str, object] = {"attempt": 0, "total": 10, "calls": 1}
    values.update(fields)
    return Update(index=index, step=step, time=time, **values)  # type: ignore[arg-type]


def test_a_progress_datagram_parses_to_its_update() -> None:
    """Every field of the format lands in the update; metrics come sorted."""
    got = parse(datagram(i=3, a=2, s=120, n=200, t=1.5, c=7, d=0.25, m={"loss": 0.5, "lr": None, "a": "x"}, x=2), TOKEN)

    assert got == Update(index=3, attempt=2, step=120.0, total=200, time=1.5, calls=7, step_time=0.25,
                         metrics=(("a", "x"), ("loss", 0.5), ("lr", None)), left_out=2)


def test_a_heartbeat_has_no_step_and_no_total() -> None:
    """A heartbeat's ``s`` and ``n`` mean nothing: it is a heartbeat."""
    got = parse(datagram(k="h", s=..., n=...), TOKEN)

    assert got is not None
    assert got.heartbeat
    assert (got.step, got.total) == (None, None)


@pytest.mark.parametrize("bad", [
    datagram(token=b"0123456789abcdef0123456789abcdee"),  # another run's token
    datagram()[:40],  # truncated
    datagram()[:-1],  # truncated JSON
    b"PRP2 " + datagram()[5:],  # another version
    datagram().replace(b"PRP1 ", b"PRP1  ", 1),
    datagram() + b" " * (MAX_DATAGRAM - len(datagram()) + 1),  # over the size
    b"PRP1 " + TOKEN + b" " + b"[" * 1000 + b"]" * 1000,  # nested
    b"PRP1 " + TOKEN + b" " + b'{"i":0,"a":0,"k":"p","s":' + b"9" * 1300 + b',"t":1}',  # a huge step
    b"PRP1 " + TOKEN + b" " + '{"i":0,"a":0,"k":"p","s":1,"t":1,"m":{"é":1}}'.encode(),  # not ASCII
    b"PRP1 " + TOKEN + b" \xff\xfe",
    b"PRP1 " + TOKEN + b' {"i":0,"a":0,"k":"p","s":NaN,"t":1}',
    b"PRP1 " + TOKEN + b' {"i":0,"a":0,"k":"p","s":Infinity,"t":1}',
    datagram(i=-1), datagram(i=True), datagram(i=2**31), datagram(a=-1), datagram(a=1.0),
    datagram(k="x"), datagram(s=...), datagram(s="1"), datagram(n=1.5), datagram(n=-1), datagram(t=...),
    datagram(t="now"), datagram(c=0), datagram(d=-0.5), datagram(d="x"), datagram(m=[1]), datagram(x=-1),
    b"", b"PRP1 ", b"PRP1 " + TOKEN, b"PRP1 " + TOKEN + b" ", b"PRP1 " + TOKEN + b" []", b"PRP1 " + TOKEN + b" 1",
])
def test_a_datagram_that_is_not_the_format_is_none(bad: bytes) -> None:
    """Forged, truncated, oversized, non-ASCII, out-of-range or mistyped: None, never an exception."""
    assert parse(bad, TOKEN) is None


def test_a_metric_that_breaks_the_rules_is_left_out_and_counted() -> None:
    """A long key, a long text, a list: left out (counted), the step kept."""
    got = parse(datagram(m={"k" * 65: 1, "ok": True, "text": "t" * 65, "list": [1], "obj": {}}), TOKEN)

    assert got is not None
    assert (got.step, got.metrics, got.left_out) == (1.0, (("ok", 1.0),), 4)


def test_a_token_of_another_length_accepts_nothing() -> None:
    """The run's token is 32 bytes; an empty one (a bug) must not turn the check off."""
    assert parse(datagram(), b"") is None
    assert parse(datagram(token=b""), b"") is None


def test_median_and_nearest_rank() -> None:
    """The two statistics the report shows."""
    assert (median([3.0]), median([4.0, 1.0]), median([5.0, 1.0, 3.0])) == (3.0, 2.5, 3.0)
    assert (nearest_rank([1.0], 90), nearest_rank([float(n) for n in range(1, 11)], 90)) == (1.0, 9.0)
    assert nearest_rank([float(n) for n in range(1, 101)], 90) == 90.0


def test_steps_advanced_by_n_count_n_step_times_of_dt_over_n() -> None:
    """0 -> 4 over 2 s: four step times of 0.5 s; the ETA is what is left at the median."""
    board = Board(("h1",), clock=lambda: 50.0)
    board.feed(update(step=0, time=10.0), now=40.0)
    board.feed(update(step=4, time=12.0), now=45.0)

    assert board.step_times(0) == (0.5, 0.5, 0.5, 0.5)
    assert board.snapshot() == (InstanceProgress(
        index=0, host="h1", attempt=0, step=4.0, total=10, steps_per_s=2.0, step_time_s=0.5, eta_s=3.0,
        heard_s=5.0, calls=2, metrics=(), straggler_ratio=None),)
    assert board.heard(0) == 45.0
    assert board.heard(1) is None


def test_the_instances_own_step_time_wins() -> None:
    """``d`` counts as the step time, k times; the first datagram with ``d`` counts once."""
    board = Board()
    board.feed(update(step=1, time=10.0, step_time=0.1), now=1.0)
    board.feed(update(step=3, time=99.0, step_time=0.2), now=2.0)

    assert board.step_times(0) == (0.1, 0.2, 0.2)


def test_a_step_that_goes_back_starts_the_window_afresh() -> None:
    """A resumed run reports a lower step: the old step times are not its."""
    board = Board()
    for step, at in ((0, 0.0), (1, 1.0), (2, 2.0), (1, 3.0), (2, 3.5)):
        board.feed(update(step=step, time=at), now=at)

    assert board.step_times(0) == (0.5,)


def test_a_clock_that_goes_back_counts_no_interval() -> None:
    """The instance's clock was set back: that interval is unknown, the next one counts from there."""
    board = Board()
    for step, at in ((0, 10.0), (1, 5.0), (2, 6.0)):
        board.feed(update(step=step, time=at), now=at)

    assert board.step_times(0) == (1.0,)


def test_the_window_keeps_the_last_w_step_times() -> None:
    """W bounds the window; a big jump counts W step times, not millions."""
    board = Board(window=3)
    board.feed(update(step=0, time=0.0), now=0.0)
    board.feed(update(step=10**9, time=1.0), now=1.0)

    assert board.step_times(0) == (1e-9, 1e-9, 1e-9)


def test_older_attempts_and_indices_beyond_the_plan_are_dropped() -> None:
    """After attempt 1 starts, attempt 0's datagrams are stale; instance 5 of 2 does not exist."""
    board = Board(("h1", "h2"))
    board.attempt(1)

    assert not board.feed(update(attempt=0), now=1.0)
    assert not board.feed(update(index=5, attempt=1), now=1.0)
    assert board.feed(update(index=1, attempt=1), now=1.0)
    assert [p.index for p in board.snapshot()] == [1]


def test_a_newer_attempt_of_one_instance_starts_it_afresh() -> None:
    """--restart-scope instance: the restarted instance counts anew, older datagrams of it are dropped."""
    board = Board()
    board.feed(update(step=0, time=0.0), now=0.0)
    board.feed(update(step=5, time=5.0), now=1.0)
    board.feed(update(step=0, time=9.0, attempt=1, calls=3), now=2.0)

    assert not board.feed(update(step=6, time=6.0), now=3.0)
    (only,) = board.snapshot()
    assert (only.attempt, only.step, only.calls, board.step_times(0)) == (1, 0.0, 3, ())


def test_heartbeats_are_heard_but_move_no_step() -> None:
    """A heartbeat counts its calls and when it came; the step stays None until progress comes."""
    board = Board(clock=lambda: 10.0)
    board.feed(update(step=None, total=None, calls=4), now=7.0)

    (only,) = board.snapshot()
    assert (only.step, only.calls, only.heard_s, only.eta_s) == (None, 4, 3.0, None)


def test_listeners_hear_each_kept_update() -> None:
    """listen's callbacks get the instance's progress after each update kept, never for a dropped one."""
    board = Board(("h1",))
    heard: list[InstanceProgress] = []
    board.listen(heard.append)
    board.feed(update(step=2), now=1.0)
    board.feed(update(index=3), now=1.0)

    assert [(p.index, p.host, p.step) for p in heard] == [(0, "h1", 2.0)]


def test_the_straggler_mark_shows_in_snapshot_and_summary() -> None:
    """The straggler rule marks an instance; a new attempt clears it."""
    board = Board(("h1",))
    board.feed(update(), now=1.0)
    board.straggler(0, 2.5)
    board.straggler(7, 9.0)  # never heard: nothing to mark

    assert [p.straggler_ratio for p in board.snapshot()] == [2.5]
    assert [s.straggler_ratio for s in board.summaries()] == [2.5]
    board.attempt(1)
    assert board.snapshot() == ()


def test_the_summary_has_the_attempts_statistics_in_ms() -> None:
    """min, median, p90 and max of the step times counted; steps and calls."""
    board = Board(("h1",), window=2)
    for step, at in ((0, 0.0), (1, 0.1), (2, 0.3), (3, 0.6), (4, 1.0)):
        board.feed(update(step=step, time=at), now=at)

    (summary,) = board.summaries()
    assert (summary.steps, summary.calls, summary.last_step, summary.total) == (4, 5, 4.0, 10)
    assert [round(v, 6) for v in (summary.min_ms, summary.median_ms, summary.p90_ms, summary.max_ms)] == [  # type: ignore[arg-type]
        100.0, 250.0, 400.0, 400.0]


def test_feeding_from_threads_loses_no_call() -> None:
    """Eight threads feeding at once: every call counted (the board is thread-safe)."""
    board = Board()

    def feed(index: int) -> None:
        for n in range(500):
            board.feed(update(index=index, step=n, time=float(n)), now=float(n))

    threads = [threading.Thread(target=feed, args=(index % 4,)) for index in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert [p.calls for p in board.snapshot()] == [1000] * 4


def test_the_summary_keeps_the_largest_straggler_ratio_after_the_instance_recovered() -> None:
    """ps shows whether an instance is a straggler now; the report keeps the largest ratio it was told by."""
    board = Board(("h1",))
    board.feed(update(), now=1.0)
    board.straggler(0, 2.5)
    board.straggler(0, 4.0)
    board.straggler(0, None)  # recovered

    assert [p.straggler_ratio for p in board.snapshot()] == [None]
    assert [s.straggler_ratio for s in board.summaries()] == [4.0]


def test_a_clock_that_jumps_ahead_of_poprun_counts_no_interval() -> None:
    """The instance's clock was set forward an hour between two steps poprun heard 1 s apart: no step time of an hour."""
    board = Board(window=3)
    for step, at, now in ((0, 10.0, 10.0), (1, 11.0, 11.0), (4, 3611.0, 12.0), (5, 3612.0, 13.0)):
        board.feed(update(step=step, time=at), now=now)

    assert board.step_times(0) == (1.0, 1.0)
    assert board.summaries()[0].max_ms == 1000.0


def test_intervals_poprun_read_in_a_burst_are_unknown_and_later_ones_count() -> None:
    """poprun read 10 s of datagrams at once (it was stopped): those intervals are unknown; the step still moves."""
    board = Board()
    for step, at, now in ((0, 0.0, 30.0), (1, 10.0, 30.1), (2, 20.0, 30.2), (3, 30.0, 40.2), (4, 40.0, 50.2)):
        board.feed(update(step=step, time=at), now=now)

    assert board.step_times(0) == (10.0, 10.0)
    assert board.snapshot()[0].step == 4


def test_an_attempt_above_the_last_the_run_can_have_is_dropped() -> None:
    """A datagram claiming attempt 2**31-1 (only a holder of the token can send one) never hides the instance's own."""
    board = Board(("h1",), last_attempt=1)

    assert not board.feed(update(step=1, attempt=2**31 - 1), now=1.0)
    assert board.feed(update(step=2, attempt=0), now=2.0)
    assert board.feed(update(step=3, attempt=1), now=3.0)  # restarted alone: its attempt 1 is its own
    assert [(p.attempt, p.step) for p in board.snapshot()] == [(1, 3)]
