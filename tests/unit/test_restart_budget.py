"""The run's restart budget counts a restart as made only once it begins: one cancelled goes back."""

from __future__ import annotations

from poprun.apply.recovery import RestartBudget
from poprun.core.record import evolve
from poprun.planner import plan as p

POLICY = evolve(p.NO_RECOVERY, max_restarts=2, backoff_ms=1000, backoff_max_ms=30_000, min_uptime_ms=0,
                crash_loop=3)


def test_a_cancelled_restart_goes_back_to_the_budget() -> None:
    """Restart 1 granted, then cancelled (a stop, its check failed): the next failure is granted restart 1 again."""
    budget = RestartBudget(POLICY)
    assert (1.0, "restart 1 of 2 in 1 s") == budget.decide(3, 10.0)

    budget.cancelled()

    assert (0, 0) == (budget.used, budget.waiting)
    assert (1.0, "restart 1 of 2 in 1 s") == budget.decide(3, 10.0)


def test_a_spent_budget_with_restarts_still_to_begin_says_so() -> None:
    """Both restarts granted, one begun, one waiting: a third failure is refused as 'taken', not 'used'."""
    budget = RestartBudget(POLICY)
    budget.decide(3, 10.0)
    budget.begun()
    budget.decide(3, 10.0)

    expected = "not restarted: all 2 restarts of the run are taken: 1 made, 1 waiting to start (--max-restarts)"
    assert (None, expected) == budget.decide(4, 10.0)

    budget.begun()
    assert (None, "not restarted: all 2 restarts of the run are used (--max-restarts)") == budget.decide(4, 10.0)


def test_telling_more_than_was_granted_changes_nothing() -> None:
    """begun() or cancelled() with no restart waiting (told twice): the counts stay as they are."""
    budget = RestartBudget(POLICY)
    budget.decide(3, 10.0)
    budget.begun()

    budget.begun()
    budget.cancelled()

    assert (1, 0) == (budget.used, budget.waiting)
