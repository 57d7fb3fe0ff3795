"""
Instance health at apply time: the heartbeat limit (a hung instance) and the straggler rule (docs/progress.md).

Layer: ``poprun.apply``; imports :mod:`poprun.core.events`, :mod:`poprun.core.progress` (types),
:mod:`poprun.core.record`, ``poprun.planner.plan`` (types), ``poprun.planner.setting`` (lazily) and the standard library; never the relay, the attempts, the limits or
:func:`~poprun.apply.apply`, which hand it what it needs: the run's
:class:`~poprun.apply.progress.Board` (read through its ``listen``, ``heard``, ``step_times`` and
``straggler``), ``emit`` (tells an event) and ``end`` (ends the attempt at a :class:`Verdict`).
Imported only by a run that listens for progress.

**Heartbeats** (``--heartbeat-timeout S``): each instance's clock starts at its first report
(progress or heartbeat) in its current run (the attempt, or its restart alone); an instance that
then stays silent for S is hung, once per attempt: :class:`Watch` calls ``end`` from its own
thread, which reads the stacks and stops the attempt. An instance that never reported is not
watched; one that ended is never hung. The clocks are monotonic and stop while poprun itself
does not run (Ctrl-Z stops poprun with its instances; ``kill -STOP``; a virtual machine paused):
a tick of the watch's thread that comes more than :data:`GAP_S` late adds its lateness to every
instance's silence budget, so a suspended run is not a hung one. Between attempts nothing is watched.

**Stragglers** (:func:`ratios`): among the instances with at least W/2 step times in their
window (the last W), when there are 2 or more, an instance whose median step time exceeds k x
the median of those instances' medians is a straggler. Checked at each update the board hears
(its ``listen``), at most once a second per instance; a ``straggler`` event is told when an
instance becomes one, and again only after it stayed at or below k for W steps. While it is
one, the board shows its ratio. With ``--straggler-policy restart`` a straggler ends the
attempt as its failure (``end``, from the watch's thread).
"""

from __future__ import annotations

import threading
import time

from poprun.core.events import Straggler
from poprun.core.record import record
from poprun.core.threads import spawn

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from poprun.core.events import Event
    from poprun.core.progress import InstanceProgress
    from poprun.planner.plan import LaunchPlan

__all__ = ["CHECK_S", "GAP_S", "Verdict", "Watch", "ratios", "replaced", "run_median", "watch_of"]

CHECK_S = 1.0  # an instance's straggler check at most this often
GAP_S = 1.0  # a tick this late means poprun did not run meanwhile: the silence is not the instances'
TICK_S = 0.25  # the longest between two heartbeat checks


@record
class Verdict:
    """
    Why an attempt ends at instance ``index`` on ``host``: ``limit`` ``heartbeat`` (hung) or ``straggler``.

    ``after_ms``: how long it was silent (heartbeat) or since its attempt began (straggler);
    ``text``: one line for the report, ``cause``: the attempt's cause ("instance 2 hung on h3 ...").
    """

    limit: str
    index: int
    host: str
    after_ms: int
    text: str
    cause: str
    attempt: int = 0  # the instance's own POPRUN_RESTART_COUNT when it was judged (what its reports said)


def run_median(values: Sequence[float]) -> float:
    """Return the median of ``values`` (not empty): the middle one, or the mean of the two middle ones."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def ratios(step_times: Mapping[int, Sequence[float]], *, window: int) -> tuple[float | None, dict[int, float]]:
    """
    Return the run's median step time and each counted instance's ratio to it (the straggler rule's numbers).

    ``step_times``: each instance's step times, oldest first; the last ``window`` (W) count.
    Counted: instances with at least W/2 of them. Fewer than 2 counted, or a run median of 0:
    (None, {}). An instance is a straggler when its ratio is above k.
    """
    medians = {index: run_median(times[-window:]) for index, times in step_times.items()
               if len(times[-window:]) * 2 >= window}
    if len(medians) < 2:  # noqa: PLR2004 - a straggler is slower than others: at least one other
        return None, {}
    middle = run_median(tuple(medians.values()))
    if middle <= 0:
        return None, {}
    return middle, {index: median / middle for index, median in medians.items()}


class _Instance:
    """What the watch keeps of one instance of the current attempt."""

    __slots__ = ("attempt", "below", "checked", "ended", "flagged", "heard", "median", "since", "started")

    def __init__(self, started: float) -> None:
        self.started = started  # when its current run began (reports before it are an earlier run's)
        self.heard: float | None = None  # the board's time it was last heard (raw)
        self.since: float | None = None  # its silence starts here (heard, moved on by poprun's own pauses)
        self.ended = False
        self.checked = float("-inf")  # its last straggler check
        self.median: float | None = None  # its median step time at that check (None: too few steps)
        self.flagged = False  # a straggler now
        self.below: float | None = None  # the step at which a straggler went back to k or below
        self.attempt = 0  # its POPRUN_RESTART_COUNT, as its reports say


class Watch:
    """
    The heartbeat limit and the straggler rule of one run (see the module docstring); thread-safe.

    ``board``: the run's progress board; ``hosts``: each instance's host by index (:meth:`hosts`
    changes them with a re-plan); ``heartbeat_s``: S (0: no limit); ``window``, ``factor``: W and
    k; ``restart``: whether a straggler ends its attempt; ``emit`` tells an event; ``end`` ends the
    attempt at a verdict (from the watch's thread; it may take seconds: stacks are read).
    ``clock``: monotonic seconds; ``thread``: False to drive :meth:`tick` by hand (tests); ``alone``:
    a verdict ends its instance alone (``--restart-scope instance``), and the others are watched on.
    """

    def __init__(self, board: object, hosts: Sequence[str], *, heartbeat_s: float, window: int, factor: float,
                 restart: bool, emit: Callable[[Event], None], end: Callable[[Verdict], None],
                 clock: Callable[[], float] = time.monotonic, thread: bool = True, alone: bool = False) -> None:
        self._board = board
        self._hosts = tuple(hosts)
        self.heartbeat_s, self.window, self.factor, self.restart = heartbeat_s, window, factor, restart
        self._emit, self._end, self._clock = emit, end, clock
        self._lock = threading.Lock()
        self._instances: dict[int, _Instance] = {}
        self._attempt = 0
        self._active = False  # an attempt runs: watch it
        self._ended = False  # this attempt was ended by a verdict (one per attempt)
        self._alone = alone  # --restart-scope instance: a verdict ends its instance alone, the others are watched on
        self._judged: set[int] = set()  # ... the instances ended so, until they start again
        self._pending: Verdict | None = None  # a straggler's verdict for the thread to act on
        self._middle: tuple[float, float | None, int] = (float("-inf"), None, 0)  # (when, run median, counted)
        self._medians: dict[int, float] = {}  # each counted instance's median at its last check
        self._last_tick = clock()
        self._wake = threading.Event()
        self._closed = False
        self.verdicts: list[Verdict] = []  # every verdict acted on, in order
        board.listen(self._heard)  # type: ignore[attr-defined]
        self._thread: threading.Thread | None = None
        if thread and (heartbeat_s > 0 or restart):
            self._thread = spawn(self._run, name="poprun-watch")

    # -- what apply tells ---------------------------------------------------------------
    def hosts(self, hosts: Sequence[str]) -> None:
        """Take the hosts of a re-planned attempt: each instance's host, by index."""
        with self._lock:
            self._hosts = tuple(hosts)

    def attempt(self, number: int) -> None:
        """Attempt ``number`` begins: every clock starts afresh; nothing is watched until an instance reports."""
        now = self._clock()
        with self._lock:
            self._attempt, self._active, self._ended, self._pending = number, True, False, None
            self._instances = {i: _Instance(now) for i in range(len(self._hosts))}
            self._judged.clear()
            self._medians.clear()
            self._middle = (float("-inf"), None, 0)
            self._last_tick = now

    def attempt_ended(self) -> None:
        """Stop watching: the attempt's launch ended (nothing is watched until the next attempt begins)."""
        with self._lock:
            self._active = False
            self._pending = None

    def started(self, index: int) -> None:
        """Instance ``index`` started (again, alone: ``--restart-scope instance``): its clock waits for its first report."""
        now = self._clock()
        with self._lock:
            self._instances[index] = _Instance(now)
            self._judged.discard(index)
            self._medians.pop(index, None)

    def ended(self, index: int) -> None:
        """Instance ``index`` ended: it is never hung, and no longer counts in the run's median."""
        with self._lock:
            state = self._instances.get(index)
            if state is not None:
                state.ended = True
                state.median = None
            self._medians.pop(index, None)

    def close(self) -> None:
        """End the watch's thread (idempotent)."""
        self._closed = True
        self._wake.set()

    # -- heartbeats ------------------------------------------------------------------------
    def tick(self, now: float) -> Verdict | None:
        """
        Check every instance's silence at monotonic time ``now``; return the verdict to act on, or None.

        A straggler's verdict waiting (``--straggler-policy restart``) comes first. Called by the
        watch's thread; tests call it with a clock of their own.
        """
        heard = self._board.heard  # type: ignore[attr-defined]
        with self._lock:
            late = now - self._last_tick - TICK_S
            self._last_tick = now
            if not self._active or self._ended:
                return None
            if late > GAP_S:  # poprun did not run: neither did its clock of the instances' silence
                for state in self._instances.values():
                    state.since = None if state.since is None else state.since + late
            if self._pending is not None:
                verdict, self._pending = self._pending, None
                return self._judge_ends(verdict)
            for index, state in self._instances.items():
                if state.ended or index in self._judged:
                    continue
                raw = heard(index)
                if raw is not None and raw >= state.started and raw != state.heard:
                    # heard again; never before a pause's credit (the receiver may stamp a datagram it read after a
                    # pause with a time taken before it)
                    state.heard, state.since = raw, raw if state.since is None else max(raw, state.since)
                if state.since is None or self.heartbeat_s <= 0 or now - state.since < self.heartbeat_s:
                    continue
                return self._judge_ends(self._hung(index, now - state.since))
        return None

    def _judge_ends(self, verdict: Verdict) -> Verdict:
        """Note that ``verdict`` ends its attempt (or, alone, its instance); return it (the lock held)."""
        if self._alone:
            self._judged.add(verdict.index)
        else:
            self._ended = True
        return verdict

    def _hung(self, index: int, silent_s: float) -> Verdict:
        host = self._host(index)
        limit = _seconds(self.heartbeat_s)
        return Verdict(limit="heartbeat", index=index, host=host, after_ms=int(silent_s * 1000),
                       attempt=self._instances[index].attempt,
                       text=f"instance {index} on {host} sent no progress or heartbeat for {limit} (--heartbeat-timeout)",
                       cause=f"instance {index} hung on {host}: silent for {limit} (--heartbeat-timeout)")

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(min(TICK_S, self.heartbeat_s / 4) if self.heartbeat_s > 0 else TICK_S)
            self._wake.clear()
            if self._closed:
                return
            verdict = self.tick(self._clock())
            if verdict is not None:
                self.verdicts.append(verdict)
                self._end(verdict)  # seconds, while stacks are read: poprun ran, that is no pause of its own
                with self._lock:
                    self._last_tick = self._clock()

    # -- stragglers ------------------------------------------------------------------------
    def _heard(self, progress: InstanceProgress) -> None:
        """Check the straggler rule for an instance the board heard from (the receiver's thread), at most once a second."""
        now = self._clock()
        index = progress.index
        told: Straggler | None = None
        with self._lock:
            state = self._instances.get(index)
            if state is not None:
                state.attempt = progress.attempt
            if not self._active or state is None or state.ended or progress.step is None \
                    or now - state.checked < CHECK_S:
                return
            state.checked = now
            times = self._board.step_times(index)[-self.window:]  # type: ignore[attr-defined]
            state.median = run_median(times) if len(times) * 2 >= self.window else None
            if state.median is None:
                self._medians.pop(index, None)
            else:
                self._medians[index] = state.median
            middle = self._run_median(now)
            if state.median is None or middle is None:
                return
            ratio = state.median / middle
            told = self._judge(index, state, ratio, progress, middle)
        self._board.straggler(index, round(ratio, 3) if state.flagged else None)  # type: ignore[attr-defined]
        if told is not None:
            self._emit(told)
            if self.restart:
                self._wake.set()

    def _run_median(self, now: float) -> float | None:
        """Return the median of the counted instances' medians (None: fewer than 2), recomputed at most once a second."""
        when, middle, counted = self._middle
        if now - when >= CHECK_S or counted != len(self._medians):
            medians = tuple(self._medians.values())
            middle = run_median(medians) if len(medians) >= 2 else None  # noqa: PLR2004 - one other at least
            middle = middle if middle is None or middle > 0 else None
            self._middle = (now, middle, len(medians))
        return middle

    def _judge(self, index: int, state: _Instance, ratio: float, progress: InstanceProgress,
               middle: float) -> Straggler | None:
        """Apply the rule to one instance's ``ratio`` (the lock held); return the event to tell, if it became a straggler."""
        step = progress.step
        assert step is not None
        if ratio > self.factor:
            state.below = None
            if state.flagged:
                return None
            state.flagged = True
            host = self._host(index)
            assert state.median is not None
            if self.restart and self._pending is None and not self._ended and index not in self._judged:
                self._pending = Verdict(
                    limit="straggler", index=index, host=host, after_ms=int((self._clock() - state.started) * 1000),
                    attempt=progress.attempt,
                    text=f"instance {index} on {host} is a straggler: its median step time {_ms(state.median)} is "
                         f"{ratio:.2f} x the run's {_ms(middle)} (--straggler-policy restart)",
                    cause=f"instance {index} was a straggler on {host}: {ratio:.2f} x the run's median step time "
                          "(--straggler-policy restart)")
            return Straggler(index=index, host=host, attempt=progress.attempt, ratio=round(ratio, 3),
                             step_time_ms=round(state.median * 1000), run_median_ms=round(middle * 1000))
        if state.flagged:
            if state.below is None:
                state.below = step
            elif step - state.below >= self.window:
                state.flagged, state.below = False, None  # recovered for a whole window: told again if it lags again
        return None

    def _host(self, index: int) -> str:
        return self._hosts[index] if 0 <= index < len(self._hosts) else ""


def watch_of(board: object, plan: LaunchPlan, *, emit: Callable[[Event], None],
             end: Callable[[Verdict], None], alone: bool = False) -> Watch:
    """Return the watch of ``plan``'s run on ``board``: its heartbeat limit, and the straggler rule with the plan's W and k."""
    from poprun.planner.setting import straggler_rule

    window, factor = straggler_rule({s.name: s.value for s in plan.backend.settings})
    return Watch(board, [i.host for i in plan.instances], heartbeat_s=plan.recovery.heartbeat_timeout_ms / 1000,
                 window=window, factor=factor, restart=plan.recovery.straggler_policy == "restart", emit=emit, end=end,
                 alone=alone)


def replaced(verdict: Verdict, plan: LaunchPlan, unusable: set[str]) -> str:
    """
    Return why ``verdict``'s host is left out of the next attempt of ``plan``, or "" when it stays.

    It is left out only where a spare can take its place (a membership policy with a spare not
    used and not ``unusable``): a hang or a straggler does not shrink the run by itself.
    """
    used = set(plan.topology.hosts) | unusable
    if verdict.host not in plan.topology.hosts or all(spare in used for spare in plan.membership.spares):
        return ""
    if verdict.limit == "heartbeat":
        return f"its instance {verdict.index} hung (--heartbeat-timeout)"
    return f"its instance {verdict.index} was a straggler (--straggler-policy restart)"


def _seconds(value: float) -> str:
    text = f"{value:.3f}".rstrip("0").rstrip(".")
    return f"{text} s"


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds >= 0.01 else f"{seconds * 1000:.2f} ms"  # noqa: PLR2004
