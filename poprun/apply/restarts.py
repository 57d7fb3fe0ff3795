"""
``--restart-scope instance``: the one launch's failed instances, each started again alone within the run's budget.

Layer: ``poprun.apply``; imports :mod:`~poprun.apply.recovery`, ``poprun.core`` and the
environment contract; the attempts object (:class:`~poprun.apply.attempts.Attempts`), whose
budget, limits and control it reads, only for types.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from popdist import env as names
from poprun.apply.recovery import run_pre_restart
from poprun.core.events import InstanceEnded
from poprun.core.exitstatus import TIMED_OUT
from poprun.core.outcome import ApplyResult, Attempt, InstanceFailure, signal_name
from poprun.core.record import evolve
from poprun.runs.record import RUN_ID

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from poprun.apply.attempts import Attempts

__all__ = ["InstanceRestarts", "cause", "ended_text"]


class InstanceRestarts:
    """
    The apply step's :class:`~poprun.backends.base.Restarter` for ``--restart-scope instance``: the run's one budget.

    A restart granted (:meth:`restart_after`) is *pending* until the backend tells that the
    instance started again (:meth:`started`, through the relay): only then is it counted as made
    and told (``attempt-ended`` with ``restart``, the line on stderr). The apply step gives back
    those still pending when the launch has ended (:meth:`Attempts.give_back`).
    """

    def __init__(self, attempts: Attempts, first: int) -> None:
        self._attempts, self._next = attempts, first
        self.attempts: list[Attempt] = []
        self.pending: dict[int, int] = {}  # instance -> its position in attempts: granted, not started yet
        self.held: dict[int, int] = {}  # instance -> the pid of its run that failed, while pending
        self.refused: dict[int, str] = {}  # the pid of a failed run not restarted -> why
        self.failed: dict[int, str] = {}  # instance -> why its restart was given up (its pre-restart command)
        self._delays: dict[int, float] = {}  # position in attempts -> the wait before that restart
        self._counts: dict[int, int] = {}
        self._lock = threading.Lock()

    def restart_after(self, ended: InstanceEnded, uptime_s: float) -> float | None:
        """Return the wait before failed instance ``ended.index`` starts again, or None (the budget decides)."""
        a = self._attempts
        stopped = a.stopped_by(ApplyResult(statuses=()))
        verdict = a.limits.taken(ended.index)  # it hung, or was a straggler: the watch ended it (its status: 124)
        status = TIMED_OUT if verdict is not None else ended.status
        delay, why = a.budget.decide(status, uptime_s, stopped=stopped)
        if delay is None:  # the run's last attempt is the launch's own result
            with self._lock:
                self.refused[ended.pid] = why
            if verdict is not None:
                a.limits.end_run(verdict)  # the run ends with it: 124, and the report says why
            return None
        host = a.plan.instances[ended.index].host if 0 <= ended.index < len(a.plan.instances) else "?"
        with self._lock:
            attempt = Attempt(number=self._next + len(self.attempts), status=status, root_cause=ended.index,
                              seconds=round(uptime_s, 3), master_port=a.ports[-1] if a.ports else 0, next=why,
                              cause=verdict.cause if verdict is not None else
                              ended_text(ended.index, host, ended.signal, ended.exit_code))
            self.attempts.append(attempt)
            self._counts[ended.index] = self._counts.get(ended.index, 0) + 1
            self.pending[ended.index] = len(self.attempts) - 1
            self.held[ended.index] = ended.pid
            self._delays[len(self.attempts) - 1] = delay
        return delay

    def started(self, index: int) -> None:
        """Instance ``index`` started again: its restart is made; tell it (the backend's thread, before its start)."""
        with self._lock:
            position = self.pending.pop(index, None)
            self.held.pop(index, None)
        if position is None:
            return
        a = self._attempts
        a.budget.begun()
        a.tell_ended(self.attempts[position], self.attempts[position].next, delay=self._delays[position])

    def prepare(self, index: int) -> Mapping[str, str] | None:
        """Run the pre-restart command; return the variables instance ``index`` starts again with, or None."""
        a = self._attempts
        count = self._counts.get(index, 0)
        if a.control.signals or a.limits.ended:  # --signal sent: a restart now would only meet the limit
            return None
        if a.recovery.pre_restart:
            failed = run_pre_restart(a.recovery.pre_restart, a.environ,
                                     {RUN_ID: a.run_id, names.RESTART_COUNT: str(count)},
                                     cancelled=a.control.woken)
            if failed is not None:
                if not a.relay.is_stopping:  # else the launch's end killed the command: the run ended first
                    with self._lock:
                        self.failed[index] = f"not restarted: {failed}"
                return None
        return ({names.RESTART_COUNT: str(count), names.TORCHELASTIC_RESTART_COUNT: str(count)}
                | a.errors.files(count, [index]).get(index, {}))

    def give_back(self, stopped: str, root: InstanceFailure | None, cause: str) -> tuple[list[int], int | None]:
        """
        Give back each restart granted that never started (the launch has ended); return their positions, and the root's.

        Each such attempt says why (``stopped``: what stopped the run; ``cause``: how it ended);
        the second value is the position of the restart of the failure the run ended with, if given back.
        """
        cancelled, own = [], None
        for index, position in sorted(self.pending.items(), key=lambda item: item[1]):
            mine = root is not None and root.pid == self.held.get(index)
            why = self.failed.get(index) or (
                f"not restarted: {stopped}" if stopped else "not restarted: it could not start again" if mine
                else f"not restarted: the run ended first ({cause})" if cause else "not restarted: the run ended first")
            self.attempts[position] = evolve(self.attempts[position], next=why)
            cancelled.append(position)
            own = position if mine else own
        return cancelled, own


def cause(result: ApplyResult) -> str:
    """Return the root cause of ``result`` in one line ("" when none)."""
    if result.error is not None:
        return result.error.message or "; ".join(d.summary for d in result.error.diagnostics)
    failure = result.failure(result.root_cause)
    if failure is None:
        return ""
    return ended_text(failure.index, failure.host, failure.signal, failure.exit_code)


def ended_text(index: int, host: str, sig: int | None, exit_code: int | None) -> str:
    """Return how instance ``index`` ended, in one line: ``instance 1 exited with 3 on h1``."""
    how = f"was killed by {signal_name(sig)}" if sig is not None else f"exited with {exit_code}"
    return f"instance {index} {how} on {host}"
