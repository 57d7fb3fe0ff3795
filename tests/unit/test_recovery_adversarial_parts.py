"""
Recovery attacked in its parts: hostile saved plans, the budget's arithmetic at its bounds, the stall clock.

A saved plan is the user's own file, but one edited by hand (or by a script gone wrong) must not
make poprun do what the planner refuses.
"""

from __future__ import annotations

import copy
import io
import json
import signal
import threading
from contextlib import redirect_stderr, redirect_stdout

import pytest

from poprun.apply.recovery import LimitWatch, RestartBudget
from poprun.cli.main import main
from poprun.core.diagnostic import DiagnosticError
from poprun.core.record import evolve
from poprun.planner import plan as p
from poprun.planner.serde import from_json


@pytest.fixture(scope="module")
def plan_data() -> dict[str, object]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = main(["plan", "--format", "json", "--num-instances", "2", "--num-replicas", "2", "--backend",
                       "offline", "python3", "train.py"])
    assert 0 == status, err.getvalue()
    return json.loads(out.getvalue())


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP])
def test_a_saved_plan_cannot_send_an_uncatchable_signal_before_the_limit(plan_data: dict[str, object],
                                                                         sig: int) -> None:
    """--signal KILL@1 is PR105 when planned; a plan edited to hold it is PR114, not every instance killed early."""
    data = copy.deepcopy(plan_data)
    data["recovery"].update(signal=int(sig), signal_before_ms=1000, timeout_ms=5000)  # type: ignore[attr-defined]

    with pytest.raises(DiagnosticError) as caught:
        from_json(json.dumps(data), file="plan.json")

    assert "PR114" == caught.value.diagnostics[0].code
    assert "$.recovery.signal" in [d.span.key_path for d in caught.value.diagnostics]


def test_the_backoff_of_the_last_of_a_huge_budget_does_not_overflow() -> None:
    """100000 restarts: the wait is min(backoff * 2**(k-1), backoff_max), whole, for every k."""
    budget = RestartBudget(evolve(p.NO_RECOVERY, max_restarts=100_000, backoff_ms=1000, backoff_max_ms=30_000,
                                  min_uptime_ms=0))
    budget.used = 99_998
    delay, why = budget.decide(3, 10.0)
    assert 30.0 == delay
    assert "restart 99999 of 100000 in 30 s" == why
    assert (30.0, "restart 100000 of 100000 in 30 s") == budget.decide(3, 10.0)
    assert budget.decide(3, 10.0)[0] is None


def test_no_uptime_is_quick_when_min_uptime_is_0_even_with_a_crash_loop_of_1() -> None:
    """--min-uptime 0 --crash-loop 1: a failure after 0 s is not quick; the budget ends the run, not the guard."""
    budget = RestartBudget(evolve(p.NO_RECOVERY, max_restarts=3, backoff_ms=0, backoff_max_ms=0, min_uptime_ms=0,
                                  crash_loop=1))
    assert [0.0, 0.0, 0.0] == [budget.decide(139, 0.0)[0] for _ in range(3)]
    delay, why = budget.decide(139, 0.0)
    assert delay is None and "all 3 restarts" in why


def test_the_stall_clock_resumes_only_after_a_pause() -> None:
    """resume() after pause() restarts the clock; without a pause it changes nothing (a hung peer still stalls)."""
    fired = threading.Event()
    watch = LimitWatch(evolve(p.NO_RECOVERY, stall_timeout_ms=3_600_000),
                       on_limit=lambda *_: fired.set(), on_signal=lambda *_: None)
    try:
        before = watch._last_output
        watch.resume()
        assert before == watch._last_output
        watch.pause()
        assert float("inf") == watch._last_output
        watch.resume()
        assert watch._last_output < float("inf")
    finally:
        watch.close()
    assert not fired.is_set()
