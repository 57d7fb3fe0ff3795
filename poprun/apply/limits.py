"""
A run's time limits at apply time: the limit reached, the stacks read before the stop, and the teardown gate.

Layer: ``poprun.apply``; imports :mod:`poprun.apply.recovery`, :mod:`poprun.apply.stacks` (lazily),
:mod:`poprun.apply.watch` (types: the verdicts of the instance watch), ``poprun.planner.plan``,
``poprun.backends.base`` (types) and ``poprun.core``; never the relay, the attempts or
:func:`~poprun.apply.apply` (they hand it what it needs).

At ``--timeout`` or ``--stall-timeout`` (:class:`~poprun.apply.recovery.LimitWatch`, whose
thread calls :meth:`Limits.reached`) the run is told stopping, the stacks of every instance are
read (py-spy, else faulthandler's SIGABRT, :mod:`poprun.apply.stacks`), and only then is every
instance stopped. Meanwhile the backend must not tear the launch down after the failure that a
SIGABRT makes: it awaits the :class:`Gate` it was given (``launch(..., gate=)``) first, from its
own thread; the sink's calls never wait.

The instance watch's verdicts (a hung instance under ``--heartbeat-timeout``, a straggler under
``--straggler-policy restart``; :mod:`poprun.apply.watch`) come here too
(:meth:`Limits.instance_limit`): they end the attempt, not the run, unless no restart follows
(:meth:`Limits.end_run`); with ``--restart-scope instance``, only their instance.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping

from poprun.apply.recovery import LimitWatch, seconds
from poprun.core.events import Event, LimitReached, StacksCollected
from poprun.planner.plan import LaunchPlan

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from poprun.apply.watch import Verdict
    from poprun.backends.base import Backend, Launch

STACKS_TIMEOUT_S = 10.0
DUMP_WAIT_S = 1.0  # the time faulthandler's dumps are given before the teardown


class Gate:
    """
    The teardown gate of a run: what a backend awaits (``launch(..., gate=)``) before tearing down after a failure.

    Open (:meth:`wait` returns at once) unless a time limit is being handled: then closed until
    the stacks are read and faulthandler's dumps written (:meth:`close_until`), or until a stop
    (:meth:`release`, for good).
    """

    def __init__(self) -> None:
        self._until = 0.0  # (monotonic) until then a teardown waits
        self._released = threading.Event()  # set by a stop: never closed again

    def close_until(self, until: float) -> None:
        """Keep a teardown waiting until ``until`` (monotonic)."""
        self._until = until

    def release(self) -> None:
        """Open the gate for good (a stop is not held off by the reading of stacks)."""
        self._released.set()

    def wait(self) -> None:
        """Return once the gate is open: at once, at :meth:`close_until`'s time, or at a :meth:`release`."""
        while not self._released.is_set() and (left := self._until - time.monotonic()) > 0:
            self._released.wait(min(left, 0.05))


class Limits:
    """
    The time limits of one run (``--timeout``, ``--stall-timeout``, ``--signal``) and what was found at one.

    ``limit`` is the limit reached ("" before: "timeout", "stall"), ``limit_text`` says it in
    words, ``limit_waiting`` that it came while the run waited to restart (no instance ran, none
    was stopped by it), ``signalled`` the signal ``--signal`` sent (0 before), ``stacks`` where
    each instance was (-1: why they could not be read).
    """

    def __init__(self, plan: LaunchPlan, *, emit: Callable[[Event], None], stopping: Callable[[str], None],
                 gate: Gate, launch: Callable[[], Launch | None], grace_s: float,
                 forward: Callable[[int], None], woken: threading.Event) -> None:
        """
        Keep ``plan``'s limits; nothing is watched before :meth:`start`.

        ``emit`` tells events, ``stopping`` that every instance is being stopped; ``launch``
        returns the attempt's launch (None between attempts), stopped with ``grace_s`` once the
        stacks are read; ``forward`` sends ``--signal``'s signal; ``woken`` ends a wait between attempts.
        """
        self.plan, self.recovery = plan, plan.recovery
        self._emit, self._stopping, self._gate, self._launch = emit, stopping, gate, launch
        self._grace_s, self._forward, self._woken = grace_s, forward, woken
        self.limit = ""
        self.limit_text = ""
        self.limit_waiting = False
        self.signalled = 0
        self.stacks: dict[int, str] = {}
        self.captured: dict[int, bytearray] | None = None  # instance -> stderr since a limit was reached
        self.watch: LimitWatch | None = None
        self._waiting = False  # between attempts: the back-off and the pre-restart command
        self._lock = threading.Lock()
        self._reader: Callable[..., dict[int, str]] | None = None
        self._end_one: Callable[[int, int], str] | None = None
        self.verdict: Verdict | None = None  # the instance that ended this attempt (hung, a straggler), if one did
        self.alone: dict[int, Verdict] = {}  # --restart-scope instance: each instance ended alone, until restarted

    def start(self, read_stacks: Callable[..., dict[int, str]],
              end_one: Callable[[int, int], str] | None = None) -> LimitWatch | None:
        """
        Start watching the limits, if the plan has any; return the watch.

        ``read_stacks(only)`` reads every instance's stack (``only``: those indices); ``end_one(index)``
        ends one instance alone (``--restart-scope instance``; its restart count), returning "" or why not.
        """
        r = self.recovery
        self._reader, self._end_one = read_stacks, end_one
        if r.timeout_ms or r.stall_timeout_ms:
            self.watch = LimitWatch(r, on_limit=self.reached, on_signal=self.signal)
        return self.watch

    def close(self) -> None:
        """Stop watching."""
        if self.watch is not None:
            self.watch.close()

    def waiting(self, *, now: bool) -> None:
        """Tell whether the run waits to restart now (a limit then stops no instance)."""
        with self._lock:
            self._waiting = now

    @property
    def ended(self) -> bool:
        """Whether the run must not go on: a limit was reached, or ``--signal`` sent (the limit is near)."""
        return bool(self.limit or self.signalled)

    def signal(self, sig: int) -> None:
        """``--signal``'s moment: send ``sig`` to every instance, where the backend can."""
        self.signalled = sig
        self._emit(LimitReached(limit="signal", after_ms=self.recovery.timeout_ms - self.recovery.signal_before_ms,
                                signal=sig))
        self._forward(sig)
        self._woken.set()  # a wait to restart ends: an attempt now would only meet the limit

    def instance_limit(self, verdict: Verdict, *, alone: bool = False) -> None:
        """
        End the attempt at ``verdict``: an instance hung (its stacks and the others' are read first) or a straggler.

        From the instance watch's thread (:class:`~poprun.apply.watch.Watch`). The attempts
        decide after the launch ends whether this restarts the run or ends it (:meth:`end_run`).
        ``alone`` (``--restart-scope instance``): only that instance ends (its stack read first),
        as its own failure, which the budget restarts or not; the others go on.
        """
        if alone:
            self._end_alone(verdict)
            return
        with self._lock:
            if self.limit or self.verdict is not None or self._waiting:
                return
            self.verdict = verdict
        self._emit(LimitReached(limit=verdict.limit, after_ms=verdict.after_ms, instance=verdict.index,
                                host=verdict.host))
        self._stopping(verdict.text)
        launch = self._launch()
        if launch is None:
            return
        if verdict.limit == "heartbeat":
            self.captured = {}
            self._read_stacks_then_stop(launch)
        else:
            launch.terminate(self._grace_s)

    def _end_alone(self, verdict: Verdict) -> None:
        """End the instance of ``verdict`` alone: tell it, read its stack (if hung), kill it where it runs."""
        with self._lock:
            if self.limit or self._waiting or verdict.index in self.alone:
                return
            self.alone[verdict.index] = verdict
        self._emit(LimitReached(limit=verdict.limit, after_ms=verdict.after_ms, instance=verdict.index,
                                host=verdict.host))
        if verdict.limit == "heartbeat":
            self._gate.close_until(time.monotonic() + STACKS_TIMEOUT_S + 5)  # the backend's teardown, if it ends
            try:
                self._collect_stacks(only=(verdict.index,))
            finally:
                self._gate.close_until(time.monotonic() + DUMP_WAIT_S)
            self._gate.wait()
        if self._end_one is not None:
            self._end_one(verdict.index, verdict.attempt)  # faulthandler's SIGABRT may have ended it: nothing left

    def taken(self, index: int) -> Verdict | None:
        """Return (and forget) the verdict that ended instance ``index`` alone, or None: its end was not the watch's."""
        with self._lock:
            verdict = self.alone.pop(index, None)
            if verdict is not None and not self.limit:
                self.stacks = {i: text for i, text in self.stacks.items() if i != index}
            return verdict

    def end_run(self, verdict: Verdict) -> None:
        """Make ``verdict`` the run's limit (no restart follows it): the run ends with 124, the report says why."""
        with self._lock:
            self.limit, self.limit_text = verdict.limit, verdict.text

    def next_attempt(self) -> None:
        """Forget the verdict and stacks of the attempt before (they were its own): an attempt begins after a restart."""
        with self._lock:
            self.verdict = None
            if not self.limit:
                self.stacks, self.captured = {}, None

    def reached(self, kind: str, after_ms: int) -> None:
        """End the run at a time limit: tell it, collect where each instance was, then stop every instance."""
        with self._lock:
            self.limit = kind
            self.limit_waiting = self._waiting
            # the limit as declared (the event has the time measured, a few ms past it)
            self.limit_text = (f"the run timed out after {seconds(self.recovery.timeout_ms)} (--timeout)"
                               if kind == "timeout" else
                               f"no instance wrote output for {seconds(self.recovery.stall_timeout_ms)} (--stall-timeout)")
            if self._waiting:
                self.limit_text += ", while waiting to restart"
        self._emit(LimitReached(limit=kind, after_ms=after_ms))
        self._stopping(self.limit_text)
        self.captured = {}
        launch = self._launch()
        if launch is not None:
            self._read_stacks_then_stop(launch)
        self._woken.set()  # a wait between attempts ends

    def _read_stacks_then_stop(self, launch: Launch) -> None:
        """Read every instance's stack, the teardown gate closed meanwhile; then stop ``launch``."""
        # No teardown (the backend's at a failure, this step's) until the stacks are read and each process
        # sent SIGABRT for faulthandler has had time to write its dump: a SIGTERM that arrives before such
        # a process runs its handler ends it first (the kernel delivers the pending SIGABRT, then the fatal
        # SIGTERM before the handler's first instruction), and its stack is lost.
        self._gate.close_until(time.monotonic() + STACKS_TIMEOUT_S + 5)
        try:
            self._collect_stacks()
        finally:
            from poprun.apply.stacks import FAULTHANDLER

            dumped = any(FAULTHANDLER in text for text in self.stacks.values())
            self._gate.close_until(time.monotonic() + (DUMP_WAIT_S if dumped else 0))
        self._gate.wait()
        launch.terminate(self._grace_s)

    def _collect_stacks(self, only: tuple[int, ...] | None = None) -> None:
        """Read where each instance is (``only``: those; :mod:`poprun.apply.stacks`), bounded in time; nothing when it fails."""
        from poprun.apply.stacks import FAULTHANDLER

        assert self._reader is not None
        try:
            self.stacks = self._reader(only) if only is not None else self._reader()
        except Exception as exc:  # noqa: BLE001 - a report without stacks, never a run that does not stop
            self.stacks = {-1: f"the stacks could not be read: {exc}"}
        if self.stacks:
            texts = [text for i, text in self.stacks.items() if i >= 0]
            ways = (("py-spy", "Python v"), ("faulthandler", FAULTHANDLER))  # py-spy's dump names the interpreter
            how = ",".join(name for name, mark in ways if any(mark in text for text in texts))
            self._emit(StacksCollected(instances=tuple(i for i in sorted(self.stacks) if i >= 0), how=how))

    def stacks_with_faulthandler(self) -> dict[int, str]:
        """Return the stacks, those that faulthandler wrote to an instance's stderr taken from there."""
        stacks = dict(self.stacks)
        if not stacks:
            return stacks
        from poprun.apply.stacks import FAULTHANDLER

        captured = self.captured or {}
        for index, text in stacks.items():
            if FAULTHANDLER in text and index in captured:
                dump = faulthandler_dump(bytes(captured[index]).decode(errors="replace"))
                if dump:
                    stacks[index] = dump
        return stacks


def read_stacks(backend: Backend, plan: LaunchPlan, run_id: str, environ: Mapping[str, str],
                only: tuple[int, ...] | None = None) -> dict[int, str]:
    """Return where each instance of ``plan`` (``only``: those) is, read through ``backend`` (:func:`poprun.apply.stacks.collect_stacks`)."""
    from poprun.apply.stacks import collect_stacks

    hosts = {i.index: i.host for i in plan.instances if only is None or i.index in only}
    return dict(collect_stacks(backend, hosts, run_id, environ=environ, timeout_s=STACKS_TIMEOUT_S,
                               skip_pid=os.getpid()))


def end_instance(backend: Backend, plan: LaunchPlan, run_id: str, environ: Mapping[str, str], *, index: int,
                 count: int) -> str:
    """Kill instance ``index`` (restart ``count``) of ``plan`` alone where it runs; return "" or why it could not be."""
    from poprun.apply.stacks import end_instance as end

    if not 0 <= index < len(plan.instances):
        return f"instance {index} is not in the plan"
    return end(backend, plan.instances[index].host, run_id, index, count, environ=environ,
               timeout_s=STACKS_TIMEOUT_S, skip_pid=os.getpid())


def faulthandler_dump(text: str) -> str:
    """Return faulthandler's dump (``Fatal Python error`` ... the last ``File`` line) within ``text``, or ""."""
    start = text.find("Fatal Python error")
    if start < 0:
        return ""
    lines = text[start:].splitlines()
    keep = [line for line in lines if line.startswith(("Fatal Python", "Thread 0x", "Current thread 0x", "  File",
                                                       "Extension modules", "<no Python frame>")) or not line]
    return "\n".join(keep).strip()
