"""
What a run's instances say of their progress: the :class:`Board` that keeps it.

Layer: ``poprun.apply``; imports :mod:`poprun.core.progress` and the standard library; never the
relay, the attempts or :func:`~poprun.apply.apply` (they hand it what it needs). Imported only
by a run that listens for progress (docs/progress.md).

The board keeps, for each instance of the current attempt, its latest step, total, metrics and
calls, when poprun last heard from it, and its step times:

- A progress datagram whose step advanced by ``n`` over ``dt`` seconds of the instance's own
  clock (from the datagram that last advanced it) counts ``k = min(W, max(1, int(n)))`` step
  times of ``dt / n`` each; when the instance gave its own step time (``d``), ``k`` times ``d``
  instead (and one ``d`` for its first datagram). A datagram whose step did not advance counts
  none; one whose clock went back counts none (and starts the next interval there), and so
  does one whose clock jumped ahead: ``dt`` more than :data:`CLOCK_JUMP_RATIO` times the time
  poprun's own clock saw between the two datagrams plus :data:`CLOCK_JUMP_S` (the instance's
  clock was set forward, or poprun read the earlier datagram late: that interval is unknown,
  and counting it would fill the window with a step time of hours).
- A step that goes back (a resumed run, a restarted instance) starts the window afresh.
- The window holds the last W step times (``window``, default 20): ``step_time_s`` is their
  median, ``steps_per_s`` their count over their sum; ``eta_s`` is ``(total - step) *
  step_time_s``, never below 0.
- Datagrams of an attempt older than the board's (:meth:`Board.attempt`) or than the
  instance's own latest are dropped; a newer attempt of one instance (``--restart-scope
  instance``) starts that instance afresh. So is an index outside the plan's instances.

The summary each instance leaves in the report (:meth:`Board.summaries`) is over its last
:data:`SUMMARY_STEPS` step times of the attempt, and the exact minimum and maximum of all.
"""

from __future__ import annotations

import threading
import time
from collections import deque

from poprun.core.progress import InstanceProgress, Metric, Update
from poprun.core.record import record

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

WINDOW = 20
SUMMARY_STEPS = 4096
CLOCK_JUMP_RATIO, CLOCK_JUMP_S = 1.5, 5.0  # an interval of the instance's clock beyond poprun's by this is not counted


@record
class StepSummary:
    """
    One instance's steps over its attempt, for the report: ``steps`` step times counted, ``calls``, step time statistics in ms.

    ``min_ms`` and ``max_ms`` are over every step time counted; ``median_ms`` and ``p90_ms``
    over the last :data:`SUMMARY_STEPS` (nearest rank). None where no step time was counted.
    """

    index: int
    host: str
    attempt: int
    steps: int
    calls: int
    last_step: float | None
    total: int | None
    min_ms: float | None = None
    median_ms: float | None = None
    p90_ms: float | None = None
    max_ms: float | None = None
    straggler_ratio: float | None = None


def median(values: Sequence[float]) -> float:
    """Return the median of ``values`` (not empty): the middle one, or the mean of the two middle ones."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def nearest_rank(values: Sequence[float], percent: int) -> float:
    """Return the ``percent`` percentile of ``values`` (not empty) by nearest rank: the smallest value with at least that share at or below it."""
    ordered = sorted(values)
    rank = max(1, -(-percent * len(ordered) // 100))  # ceil(percent% of n), in integers
    return ordered[min(rank, len(ordered)) - 1]


class _Instance:
    """One instance's state in the current attempt (the board's lock held)."""

    __slots__ = ("attempt", "calls", "heard", "heard_since", "max", "metrics", "min", "recent", "since", "step",
                 "steps", "straggler", "total", "window", "worst")

    def __init__(self, attempt: int, window: int) -> None:
        self.attempt = attempt
        self.step: float | None = None
        self.since = 0.0  # the instance's clock when ``step`` was reached
        self.heard_since = 0.0  # poprun's clock when it heard of ``step``
        self.total: int | None = None
        self.calls = 0
        self.heard = 0.0
        self.metrics: tuple[tuple[str, Metric], ...] = ()
        self.window: deque[float] = deque(maxlen=window)
        self.recent: deque[float] = deque(maxlen=SUMMARY_STEPS)
        self.steps = 0
        self.min: float | None = None
        self.max: float | None = None
        self.straggler: float | None = None
        self.worst: float | None = None  # the largest straggler ratio told in the attempt (the report keeps it)

    def progress(self, update: Update, window: int, now: float) -> None:
        step = update.step
        assert step is not None
        previous, since, heard_since = self.step, self.since, self.heard_since
        self.total = update.total
        if update.metrics or update.left_out:
            self.metrics = update.metrics
        if previous is not None and step < previous:
            self.window.clear()  # gone back: a resumed run or a restart; the window starts afresh
            previous = None
        if previous is None:
            self.step, self.since, self.heard_since = step, update.time, now
            if update.step_time is not None:
                self._count((update.step_time,))
            return
        if step == previous:
            return
        advanced, elapsed = step - previous, update.time - since
        self.step, self.since, self.heard_since = step, update.time, now
        if update.step_time is None and not 0 <= elapsed <= (now - heard_since) * CLOCK_JUMP_RATIO + CLOCK_JUMP_S:
            return  # the instance's clock went back, or jumped ahead of poprun's: no interval to count
        each = update.step_time if update.step_time is not None else elapsed / advanced
        self._count((each,) * min(window, max(1, int(advanced))))

    def _count(self, times: tuple[float, ...]) -> None:
        self.window.extend(times)
        self.recent.extend(times)
        self.steps += len(times)
        low, high = min(times), max(times)
        self.min = low if self.min is None else min(self.min, low)
        self.max = high if self.max is None else max(self.max, high)


class Board:
    """
    The progress of a run's instances, fed by the receiver's thread and read by anyone: thread-safe.

    ``hosts``: each instance's host, by index (an index beyond them is dropped; empty: any
    index, host ""); ``window``: W, the step times kept per instance; ``clock``: monotonic seconds.
    """

    def __init__(self, hosts: Sequence[str] = (), *, window: int = WINDOW,
                 clock: Callable[[], float] = time.monotonic, last_attempt: int | None = None) -> None:
        self._hosts = tuple(hosts)
        self._last = last_attempt  # no attempt is numbered above it (the plan's --max-restarts)
        self._window = max(1, window)
        self._clock = clock
        self._lock = threading.Lock()
        self._attempt = 0
        self._instances: dict[int, _Instance] = {}
        self._listeners: list[Callable[[InstanceProgress], None]] = []

    @property
    def window(self) -> int:
        """Return W, the step times kept per instance."""
        return self._window

    def hosts(self, hosts: Sequence[str]) -> None:
        """Take the hosts of a new plan (a re-plan between attempts): each instance's host, by index."""
        with self._lock:
            self._hosts = tuple(hosts)

    def feed(self, update: Update, now: float) -> bool:
        """
        Take one instance's update, heard at monotonic time ``now``; return whether it was kept.

        Dropped (False): an index outside the plan's instances, an attempt older than the
        board's or than the instance's latest, or one above the last the run can have. A newer
        one than the instance's starts it afresh (it was restarted alone: ``--restart-scope instance``).
        """
        with self._lock:
            if (self._hosts and update.index >= len(self._hosts)) or (self._last is not None and update.attempt > self._last):
                return False
            state = self._instances.get(update.index)
            if update.attempt < self._attempt or (state is not None and update.attempt < state.attempt):
                return False
            if state is None or update.attempt > state.attempt:
                state = self._instances[update.index] = _Instance(update.attempt, self._window)
            state.calls += update.calls
            state.heard = now
            if update.step is not None:
                state.progress(update, self._window, now)
            elif update.metrics or update.left_out:
                state.metrics = update.metrics
            progress = self._progress(update.index, state, now)
            listeners = tuple(self._listeners)
        for listener in listeners:
            listener(progress)
        return True

    def snapshot(self) -> tuple[InstanceProgress, ...]:
        """Return the progress of every instance heard from in the current attempt, by index."""
        with self._lock:
            now = self._clock()
            return tuple(self._progress(index, self._instances[index], now) for index in sorted(self._instances))

    def step_times(self, index: int) -> tuple[float, ...]:
        """Return instance ``index``'s last W step times in seconds, oldest first (none: never heard, or no step counted)."""
        with self._lock:
            state = self._instances.get(index)
            return tuple(state.window) if state is not None else ()

    def heard(self, index: int) -> float | None:
        """Return the monotonic time poprun last heard from instance ``index``, None when it never did (this attempt)."""
        with self._lock:
            state = self._instances.get(index)
            return state.heard if state is not None else None

    def listen(self, callback: Callable[[InstanceProgress], None]) -> None:
        """Call ``callback`` with the instance's progress after each update kept (from the receiver's thread: return quickly)."""
        with self._lock:
            self._listeners.append(callback)

    def attempt(self, number: int) -> None:
        """Start attempt ``number``: every instance's state starts afresh; older attempts' datagrams are dropped."""
        with self._lock:
            self._attempt = number
            self._instances.clear()

    def straggler(self, index: int, ratio: float | None) -> None:
        """Mark instance ``index`` a straggler by ``ratio`` (its median step time over the run's), or not (None)."""
        with self._lock:
            state = self._instances.get(index)
            if state is not None:
                state.straggler = ratio
                if ratio is not None and (state.worst is None or ratio > state.worst):
                    state.worst = ratio

    def summaries(self) -> tuple[StepSummary, ...]:
        """Return each instance's summary of the current attempt, for the report, by index."""
        with self._lock:
            return tuple(self._summary(index, self._instances[index]) for index in sorted(self._instances))

    def _host(self, index: int) -> str:
        return self._hosts[index] if index < len(self._hosts) else ""

    def _progress(self, index: int, state: _Instance, now: float) -> InstanceProgress:
        window = state.window
        step_time = median(window) if window else None
        elapsed = sum(window)
        eta = None
        if step_time is not None and state.total is not None and state.step is not None:
            eta = max(0.0, (state.total - state.step) * step_time)
        return InstanceProgress(
            index=index, host=self._host(index), attempt=state.attempt, step=state.step, total=state.total,
            steps_per_s=len(window) / elapsed if window and elapsed > 0 else None, step_time_s=step_time,
            eta_s=eta, heard_s=max(0.0, now - state.heard), calls=state.calls, metrics=state.metrics,
            straggler_ratio=state.straggler)

    def _summary(self, index: int, state: _Instance) -> StepSummary:
        recent = state.recent
        return StepSummary(
            index=index, host=self._host(index), attempt=state.attempt, steps=state.steps, calls=state.calls,
            last_step=state.step, total=state.total,
            min_ms=None if state.min is None else state.min * 1000,
            median_ms=median(recent) * 1000 if recent else None,
            p90_ms=nearest_rank(recent, 90) * 1000 if recent else None,
            max_ms=None if state.max is None else state.max * 1000, straggler_ratio=state.worst)
