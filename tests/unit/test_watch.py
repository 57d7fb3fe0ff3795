"""The instance watch: the straggler rule's numbers, and the heartbeat clock on a clock of the test's own."""

from __future__ import annotations

import pytest

from poprun.apply.progress import Board
from poprun.apply.watch import GAP_S, TICK_S, Verdict, Watch, ratios, replaced, run_median
from poprun.core.events import Straggler
from poprun.core.progress import Update

HOSTS = ("h1", "h2", "h3", "h4")


class Clock:
    """Monotonic seconds the test moves on."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def watched(*, heartbeat_s: float = 5.0, window: int = 20, factor: float = 1.5, restart: bool = False,
            hosts: tuple[str, ...] = HOSTS) -> tuple[Watch, Board, Clock, list[object]]:
    """Return a watch on a real board, both on the test's clock, attempt 0 begun; and the events it told."""
    clock = Clock()
    board = Board(hosts, window=window, clock=clock)
    told: list[object] = []
    watch = Watch(board, hosts, heartbeat_s=heartbeat_s, window=window, factor=factor, restart=restart,
                  emit=told.append, end=lambda _verdict: None, clock=clock, thread=False)
    watch.attempt(0)
    return watch, board, clock, told


def progress(board: Board, clock: Clock, index: int, step: float, *, step_time: float | None = None,
             attempt: int = 0) -> None:
    board.feed(Update(index=index, attempt=attempt, step=step, total=200, time=clock.now, step_time=step_time),
               clock.now)


def heartbeat(board: Board, clock: Clock, index: int) -> None:
    board.feed(Update(index=index, attempt=0, step=None, total=None, time=clock.now), clock.now)


def ticks(watch: Watch, clock: Clock, until: float) -> Verdict | None:
    """Tick the watch every TICK_S up to ``until`` (the clock ends there); return the first verdict."""
    while clock.now < until:
        clock.now = min(until, clock.now + TICK_S)
        verdict = watch.tick(clock.now)
        if verdict is not None:
            return verdict
    return None


# -- the rule's numbers -------------------------------------------------------------------
def test_the_rule_gives_each_instance_its_median_over_the_median_of_medians():
    """Three instances at 100 ms a step and one at 400 ms: the run's median is 100 ms, the slow one's ratio 4."""
    times = {0: [0.1] * 20, 1: [0.1] * 20, 2: [0.1] * 20, 3: [0.4] * 20}

    middle, found = ratios(times, window=20)

    assert 0.1 == middle
    assert {0: 1.0, 1: 1.0, 2: 1.0, 3: 4.0} == found


def test_the_rule_takes_the_last_w_steps_and_an_even_count_of_medians_averages_the_middle_two():
    """Only the last W step times count; with 4 instances the run's median is the mean of the middle two medians."""
    times = {0: [9.0] * 30 + [0.1] * 10, 1: [0.2] * 10, 2: [0.3] * 10, 3: [0.5] * 10}

    middle, found = ratios(times, window=10)

    assert 0.25 == pytest.approx(middle)
    assert {0: 0.4, 1: 0.8, 2: 1.2, 3: 2.0} == pytest.approx(found)


def test_an_instance_with_fewer_than_half_a_window_of_steps_is_not_counted():
    """W = 20: 9 step times are too few (10 are enough); with one instance counted there is no rule at all."""
    assert (None, {}) == ratios({0: [0.1] * 20, 1: [1.0] * 9}, window=20)
    assert (0.55, {0: 0.1 / 0.55, 1: 1.0 / 0.55}) == ratios({0: [0.1] * 20, 1: [1.0] * 10}, window=20)


def test_a_run_median_of_zero_makes_no_straggler():
    """Step times of 0 (an instance that gives step_time=0) have no ratio: nobody is a straggler."""
    assert (None, {}) == ratios({0: [0.0] * 4, 1: [0.0] * 4, 2: [1.0] * 4}, window=4)


def test_the_median_of_one_value_is_itself():
    """run_median of a single value, an odd and an even count."""
    assert (3.0, 2.0, 2.5) == (run_median([3.0]), run_median([3.0, 1.0, 2.0]), run_median([4.0, 1.0, 2.0, 3.0]))


# -- stragglers on the board ----------------------------------------------------------------
def feed_steps(board: Board, clock: Clock, times: dict[int, float], steps: int, start: int = 0) -> None:
    """Feed each instance ``steps`` steps with its own step time, one second of the clock apart."""
    for step in range(start, start + steps):
        clock.now += 1.0
        for index, each in times.items():
            progress(board, clock, index, step, step_time=each)


def test_a_slow_instance_becomes_a_straggler_once_and_the_board_shows_its_ratio():
    """The instance at 4 x the others' step time is told once (event with its numbers); the board carries its ratio."""
    _watch, board, clock, told = watched(window=20)

    feed_steps(board, clock, {0: 0.1, 1: 0.1, 2: 0.1, 3: 0.4}, 30)

    assert [Straggler(index=3, host="h4", attempt=0, ratio=4.0, step_time_ms=400, run_median_ms=100)] == told
    assert [None, None, None, 4.0] == [p.straggler_ratio for p in board.snapshot()]


def test_a_straggler_is_told_again_only_after_a_whole_window_at_or_below_k():
    """Recovered for fewer than W steps and slow again: no new event; recovered for W steps: told again when slow."""
    _watch, board, clock, told = watched(window=4, factor=1.5)
    feed_steps(board, clock, {0: 0.1, 1: 0.1, 2: 0.4}, 6)
    assert 1 == len(told)

    feed_steps(board, clock, {0: 0.1, 1: 0.1, 2: 0.1}, 3, start=6)  # below k, but not for a whole window
    feed_steps(board, clock, {0: 0.1, 1: 0.1, 2: 0.4}, 4, start=9)
    assert 1 == len(told)

    feed_steps(board, clock, {0: 0.1, 1: 0.1, 2: 0.1}, 10, start=13)  # a whole window and more below k
    assert [None, None, None] == [p.straggler_ratio for p in board.snapshot()]
    feed_steps(board, clock, {0: 0.1, 1: 0.1, 2: 0.4}, 6, start=23)
    assert [2, 2] == [e.index for e in told]


def test_an_instance_is_checked_at_most_once_a_second():
    """Updates 0.1 s apart: the slow instance's ratio is looked at once a second, not at each update."""
    _watch, board, clock, told = watched(window=4)
    for step in range(4):
        clock.now += 1.0
        for index in range(3):
            progress(board, clock, index, step, step_time=0.1)
    for step in range(4, 14):  # 10 updates within 0.5 s of its last check: instance 2 turns slow
        clock.now += 0.05
        progress(board, clock, 2, step, step_time=1.0)

    assert [] == told  # its window turned slow within a second of its last check: not yet looked at
    clock.now += 1.0
    progress(board, clock, 2, 14, step_time=1.0)
    assert [2] == [e.index for e in told]


def test_an_instance_sending_only_heartbeats_is_no_straggler_and_not_counted():
    """Heartbeats carry no step: the rule sees only the two instances that step, alike."""
    _watch, board, clock, told = watched(window=4)
    for step in range(10):
        clock.now += 1.0
        progress(board, clock, 0, step, step_time=0.1)
        progress(board, clock, 1, step, step_time=0.1)
        heartbeat(board, clock, 2)

    assert [] == told


def test_with_the_restart_policy_a_straggler_is_the_verdict_of_the_next_tick():
    """--straggler-policy restart: the straggler's verdict ends the attempt (once), naming it, its host and ratio."""
    watch, board, clock, _told = watched(heartbeat_s=0, window=4, restart=True)
    feed_steps(board, clock, {0: 0.1, 1: 0.1, 2: 0.4}, 5)

    verdict = watch.tick(clock.now)

    assert ("straggler", 2, "h3") == (verdict.limit, verdict.index, verdict.host)
    assert ("instance 2 on h3 is a straggler: its median step time 400 ms is 4.00 x the run's 100 ms "
            "(--straggler-policy restart)") == verdict.text
    assert watch.tick(clock.now + 1) is None


# -- heartbeats ---------------------------------------------------------------------------
def test_an_instance_silent_for_s_after_its_first_report_is_hung():
    """Reported at t, silent since: not hung before t+S, hung at t+S, with its host and how long it was silent."""
    watch, board, clock, _ = watched(heartbeat_s=5.0)
    progress(board, clock, 0, 1)
    heard = clock.now
    for index in (1, 2, 3):
        progress(board, clock, index, 1)

    assert ticks(watch, clock, heard + 4.9) is None
    for index in (1, 2, 3):  # the others keep talking
        heartbeat(board, clock, index)
    verdict = ticks(watch, clock, heard + 5.5)

    assert 5000 <= verdict.after_ms < 5000 + TICK_S * 1000
    assert Verdict(limit="heartbeat", index=0, host="h1", after_ms=verdict.after_ms,
                   text="instance 0 on h1 sent no progress or heartbeat for 5 s (--heartbeat-timeout)",
                   cause="instance 0 hung on h1: silent for 5 s (--heartbeat-timeout)") == verdict


def test_an_instance_that_never_reported_is_never_hung():
    """Only instances that reported are watched: silence from the start is --stall-timeout's business."""
    watch, _board, clock, _ = watched(heartbeat_s=1.0)

    assert ticks(watch, clock, clock.now + 60) is None


def test_heartbeats_alone_keep_an_instance_alive():
    """An instance that never reports a step but sends a heartbeat every 2 s under a limit of 5 s is not hung."""
    watch, board, clock, _ = watched(heartbeat_s=5.0)
    end = clock.now + 60
    while clock.now < end:
        heartbeat(board, clock, 0)
        assert ticks(watch, clock, clock.now + 2.0) is None


def test_an_instance_that_reported_once_and_ended_is_not_hung():
    """A program that reports once and exits normally: once ended, it is never hung."""
    watch, board, clock, _ = watched(heartbeat_s=2.0)
    progress(board, clock, 1, 200)
    watch.ended(1)

    assert ticks(watch, clock, clock.now + 30) is None


def test_poprun_suspended_longer_than_s_is_no_hang():
    """A tick that comes long after the last one (poprun stopped: Ctrl-Z) moves every silence on by the gap."""
    watch, board, clock, _ = watched(heartbeat_s=5.0)
    progress(board, clock, 0, 1)
    assert ticks(watch, clock, clock.now + 3.0) is None

    clock.now += 600.0  # poprun and its instances were stopped for 10 minutes
    assert watch.tick(clock.now) is None
    progress(board, clock, 0, 2)  # continued: it reports again
    assert ticks(watch, clock, clock.now + 4.0) is None
    assert ticks(watch, clock, clock.now + 2.0).index == 0  # and silent again for S: hung


def test_a_late_tick_under_the_gap_counts_as_silence():
    """A tick less than GAP_S late is not a pause: the silence goes on counting."""
    watch, board, clock, _ = watched(heartbeat_s=2.0)
    progress(board, clock, 0, 1)
    clock.now += TICK_S + GAP_S * 0.9
    assert watch.tick(clock.now) is None

    assert ticks(watch, clock, clock.now + 2.0 - (TICK_S + GAP_S * 0.9) + TICK_S).index == 0


def test_one_verdict_per_attempt_and_a_new_attempt_starts_every_clock_afresh():
    """After a hang nothing more is told for the attempt; the next attempt watches only what reports in it."""
    watch, board, clock, _ = watched(heartbeat_s=1.0)
    progress(board, clock, 0, 1)
    progress(board, clock, 1, 1)
    assert ticks(watch, clock, clock.now + 1.5).index == 0
    assert ticks(watch, clock, clock.now + 5) is None

    watch.attempt_ended()
    watch.attempt(1)
    board.attempt(1)
    assert ticks(watch, clock, clock.now + 5) is None
    progress(board, clock, 3, 1, attempt=1)
    assert ticks(watch, clock, clock.now + 1.5).index == 3


def test_a_report_from_before_an_instance_started_again_does_not_start_its_clock():
    """An instance restarted alone: what the board heard from its run before does not count for the new one."""
    watch, board, clock, _ = watched(heartbeat_s=1.0)
    progress(board, clock, 2, 5)
    clock.now += 0.5
    watch.ended(2)
    watch.started(2)

    assert ticks(watch, clock, clock.now + 10) is None


def test_a_hung_host_is_replaced_only_where_a_spare_is_left():
    """The verdict's host leaves the next attempt when an unused spare exists; else it stays."""
    from poprun.planner.context import Context
    from poprun.planner.flags import parse_flags
    from poprun.planner.solve import solve

    ctx = Context(environ={"PATH": "/usr/bin"}, cwd="/work", local_names=("localhost",))
    plan = solve(parse_flags(["--host", "h1,h2", "--num-replicas", "2", "--spare-host", "h3", "--backend", "ssh",
                              "python3", "train.py"]).spec, ctx).plan
    verdict = Verdict(limit="heartbeat", index=1, host="h2", after_ms=5000, text="", cause="")

    assert "its instance 1 hung (--heartbeat-timeout)" == replaced(verdict, plan, set())
    assert "" == replaced(verdict, plan, {"h3"})


def test_a_datagram_stamped_before_a_pause_does_not_take_the_pause_back():
    """Read after a pause but stamped with a time before it (the receiver's batch clock): the pause still counts."""
    watch, board, clock, _ = watched(heartbeat_s=5.0)
    progress(board, clock, 0, 1)
    assert ticks(watch, clock, clock.now + 3.0) is None
    before = clock.now

    clock.now += 600.0
    assert watch.tick(clock.now) is None
    board.feed(Update(index=0, attempt=0, step=2, total=200, time=clock.now), before)  # stamped before the pause

    assert ticks(watch, clock, clock.now + 1.0) is None


def test_an_instance_whose_wall_clock_jumps_is_neither_hung_nor_a_straggler():
    """The instance's time.time() jumps an hour ahead, then back: poprun's clock is monotonic, medians shrug off one step."""
    watch, board, clock, told = watched(heartbeat_s=5.0, window=10)
    wall = 1_700_000_000.0
    jumped = 0.0  # instance 2's clock only
    for step in range(40):
        clock.now += 0.5
        wall += 0.1
        jumped += 3600.0 if step == 20 else -3600.0 if step == 21 else 0.0
        for index in range(3):
            board.feed(Update(index=index, attempt=0, step=step, total=40, time=wall + (jumped if index == 2 else 0)),
                       clock.now)
        assert watch.tick(clock.now) is None

    assert [] == told


def test_the_watch_s_own_thread_ends_the_attempt_once_at_a_hang():
    """On the real clock: an instance heard once and silent for S is ended by the thread, once; close() ends it."""
    import threading
    import time

    board = Board(HOSTS)
    ended: list[Verdict] = []
    called = threading.Event()

    def end(verdict: Verdict) -> None:
        ended.append(verdict)
        called.set()

    watch = Watch(board, HOSTS, heartbeat_s=0.5, window=20, factor=1.5, restart=False, emit=lambda _e: None, end=end)
    try:
        watch.attempt(0)
        board.feed(Update(index=3, attempt=0, step=1, total=None, time=0.0), time.monotonic())

        assert called.wait(30)
        time.sleep(1.0)  # more than S again: still one verdict for the attempt
        assert [(3, "h4")] == [(v.index, v.host) for v in ended]
    finally:
        watch.close()


def test_after_a_pause_every_instance_gets_its_credit_even_when_a_verdict_waits_at_that_tick():
    """--restart-scope instance: a straggler's verdict taken at the late tick does not cost the others the pause."""
    clock = Clock()
    board = Board(HOSTS[:3], window=4, clock=clock)
    watch = Watch(board, HOSTS[:3], heartbeat_s=5.0, window=4, factor=1.5, restart=True, emit=lambda _e: None,
                  end=lambda _v: None, clock=clock, thread=False, alone=True)
    watch.attempt(0)
    feed_steps(board, clock, {0: 0.1, 1: 0.1}, 5)
    assert ticks(watch, clock, clock.now + 0.5) is None
    feed_steps(board, clock, {0: 0.1, 1: 0.1, 2: 0.4}, 5)  # instance 2 turns up slow: a verdict waits
    heard = clock.now

    clock.now += 600.0  # poprun paused before its thread took the verdict
    assert watch.tick(clock.now).index == 2
    assert ticks(watch, clock, clock.now + 4.0) is None  # instances 0 and 1: silent 4 s since, not 604 s
    assert heard + 600 + 4.0 <= clock.now
