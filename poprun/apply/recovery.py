"""
Recovery at apply time: whether a failed run starts again, when, and the time limits that end it.

Layer: ``poprun.apply``; imports ``poprun.core`` and ``poprun.planner.plan``. The plan's
:class:`~poprun.planner.plan.Recovery` says what the user declared; :class:`RestartBudget` decides
each restart from it, for the whole run: one budget whatever host or instance failed (torchrun's
counts per node, and nodes that rejoin quickly get past it: pytorch#108158, #147064).

A failure is restarted unless, in this order: the run was stopped (a signal, a closed output, a
time limit), its status is one never retried (``--never-retry``, default 2, 126, 127: a usage
error or a program that cannot run does not get better by running again), the budget is used up
(``--max-restarts``), or the crash-loop guard trips: ``--crash-loop`` failures in a row, each
sooner than ``--min-uptime`` after its start. The wait before restart k is
``min(backoff * 2**(k-1), backoff_max)``; then the ``--pre-restart`` command runs here (a health
check): its failure ends the run. A restart granted is made only once it starts
(:meth:`RestartBudget.begun`); one that never does (a stop meanwhile, its check failed, the run
ended first) is given back (:meth:`RestartBudget.cancelled`), and neither told nor counted as made.

:class:`LimitWatch` is the one thread that keeps the time limits of a run: ``--timeout`` for the
whole run, restarts included; ``--stall-timeout``, when no instance has written output for that
long (each attempt starts its clock afresh); ``--signal SIG@S`` S seconds before the timeout.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from collections.abc import Callable, Mapping

from poprun.core.outcome import signal_name
from poprun.core.threads import spawn
from poprun.planner.plan import Recovery

PRE_RESTART_TIMEOUT_S = 600.0  # the pre-restart command's longest run: a health check that hangs ends the run
# The pre-restart command's first shell: it moves itself into the cgroup $1 (where it may; else it stays in the
# watchdog's process group only), then runs the command $2 exactly as `/bin/sh -c COMMAND` would.
_ENTER = '{ echo "$$" >"$1/cgroup.procs"; } 2>/dev/null; exec /bin/sh -c "$2"'
_MARK = "POPRUN_PRE_RESTART_MARK"  # in the command's environment, a value of its own: what it started, found by it


def seconds(ms: int) -> str:
    """Return ``ms`` milliseconds as the user wrote seconds: ``1 s``, ``0.5 s``, ``2.25 s``."""
    text = f"{ms / 1000:.3f}".rstrip("0").rstrip(".")
    return f"{text} s"


class RestartBudget:
    """The run's restarts: one budget for the whole run (see the module docstring); thread-safe."""

    def __init__(self, recovery: Recovery) -> None:
        self.recovery = recovery
        self.used = 0  # restarts granted so far, every instance together (those waiting to start included)
        self.waiting = 0  # ... of which have not started yet: each one starts (begun) or is cancelled
        self.quick = 0  # failures in a row sooner than min_uptime after their start
        self._lock = threading.Lock()

    def begun(self) -> None:
        """Tell that a restart granted by :meth:`decide` has started: it is made."""
        with self._lock:
            self.waiting = max(0, self.waiting - 1)

    def cancelled(self) -> None:
        """Tell that a restart granted by :meth:`decide` will never start (a stop, the run ended first): it is given back."""
        with self._lock:
            if self.waiting:
                self.waiting -= 1
                self.used -= 1

    @property
    def enabled(self) -> bool:
        """Whether the plan allows any restart."""
        return self.recovery.max_restarts > 0

    def decide(self, status: int, uptime_s: float, *, stopped: str = "") -> tuple[float | None, str]:
        """
        Return (the wait in seconds before the restart, or None: no restart; why, in one line).

        ``status`` is the failure's (0: it succeeded), ``uptime_s`` how long it ran; ``stopped``
        says what stopped the run, if anything did (then it is not restarted).
        """
        r = self.recovery
        with self._lock:
            if status == 0:
                return None, "succeeded"
            if stopped:
                return None, f"not restarted: {stopped}"
            if status in r.never_retry:
                return None, f"not restarted: status {status} is never retried (--never-retry)"
            if self.used >= r.max_restarts:
                if r.max_restarts == 0:
                    return None, "not restarted: no restart allowed (--max-restarts 0)"
                if self.waiting:
                    return None, (f"not restarted: all {r.max_restarts} restarts of the run are taken: "
                                  f"{self.used - self.waiting} made, {self.waiting} waiting to start (--max-restarts)")
                return None, f"not restarted: all {r.max_restarts} restarts of the run are used (--max-restarts)"
            self.quick = self.quick + 1 if uptime_s * 1000 < r.min_uptime_ms else 0
            if self.quick >= r.crash_loop:
                return None, (f"not restarted: crash loop: {self.quick} failures in a row, each within "
                              f"{seconds(r.min_uptime_ms)} of its start (--crash-loop {r.crash_loop}, "
                              f"--min-uptime {seconds(r.min_uptime_ms)[:-2]})")
            self.used += 1
            self.waiting += 1
            delay_ms = min(r.backoff_ms * 2 ** (self.used - 1), r.backoff_max_ms)
            return delay_ms / 1000, f"restart {self.used} of {r.max_restarts} in {seconds(delay_ms)}"


def run_pre_restart(command: str, environ: Mapping[str, str], variables: Mapping[str, str],
                    *, cancelled: threading.Event) -> str | None:
    """
    Run the pre-restart ``command`` here (``/bin/sh -c``) with ``variables`` added; return why it failed, or None.

    Its output goes where poprun's own does (the terminal's stderr and stdout are inherited, as
    for a hook). It runs in a process group of its own, led by a watchdog as a launch's is
    (:mod:`poprun.process.watchdog`: should poprun die meanwhile, even by SIGKILL,
    nothing of the command is left), and, where cgroup v2 can be written, in the watchdog's
    cgroup from before its first instruction (so a helper that leaves the group, ``setsid``
    or a double fork, is held too), from either scope's thread; it is killed when
    ``cancelled`` is set (poprun stopped meanwhile), after :data:`PRE_RESTART_TIMEOUT_S`, and
    once it ends (what it left in the background goes with it). Where no cgroup holds it, what
    left the group (``setsid``) is found among the processes re-parented to poprun (a
    subreaper) by a variable only the command was given, and killed when it ends.
    """
    from poprun.process.watchdog import Watchdog, WatchdogError, kill_adopted_carrying

    mark = f"{_MARK}={os.urandom(8).hex()}"  # what the command starts carries it, where no cgroup holds it
    env = dict(environ) | dict(variables) | dict([mark.split("=", 1)])
    try:
        watchdog = Watchdog(env=environ)
    except WatchdogError as exc:
        return f"the pre-restart command could not start ({exc.strerror})"
    # The command's shell moves itself into the watchdog's cgroup before it runs the command, so that whatever it
    # starts begins there (a setsid helper, a double fork): poprun itself never moves, which it could not do from a
    # restart's thread (--restart-scope instance) while another thread starts an instance
    argv = ["/bin/sh", "-c", command] if watchdog.cgroup is None else \
        ["/bin/sh", "-c", _ENTER, "poprun-pre-restart", watchdog.cgroup.path, command]
    try:
        proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL,  # noqa: S603
                                process_group=watchdog.group)
        watchdog.await_ready()
    except (OSError, WatchdogError) as exc:
        watchdog.close()
        return f"the pre-restart command could not start ({exc.strerror})"
    except BaseException:  # a stop (Ctrl-C) as it starts: nothing of it is left
        watchdog.close()
        raise
    try:
        return _wait_pre_restart(proc, cancelled)
    finally:
        watchdog.close()  # the group and the cgroup: what the command left behind too
        kill_adopted_carrying(mark.encode(), watchdog.group)  # and what was re-parented here (no cgroup: setsid)


def _wait_pre_restart(proc: subprocess.Popen[bytes], cancelled: threading.Event) -> str | None:
    """Wait for the pre-restart command ``proc``; return why it failed, or None."""
    deadline = time.monotonic() + PRE_RESTART_TIMEOUT_S
    try:
        while True:
            try:
                status = proc.wait(timeout=0.05)
                break
            except subprocess.TimeoutExpired:
                if cancelled.is_set():
                    return "the pre-restart command was stopped"
                if time.monotonic() > deadline:
                    return f"the pre-restart command did not end within {PRE_RESTART_TIMEOUT_S:.0f} s"
    finally:
        if proc.returncode is None:
            with contextlib.suppress(OSError):
                proc.kill()
            proc.wait()
    if status < 0:
        return f"the pre-restart command was killed by {signal_name(-status)}"
    return None if status == 0 else f"the pre-restart command failed with status {status}"


class LimitWatch:
    """
    The time limits of one run (see the module docstring), kept by one daemon thread.

    ``on_limit(kind, after_ms)`` is called from that thread, once, when ``timeout`` or ``stall``
    is reached; ``on_signal(sig)`` when ``--signal``'s moment comes. :meth:`output` tells that an
    instance wrote output (any thread); :meth:`attempt` that an attempt starts (the stall clock
    starts afresh); :meth:`close` ends the thread.
    """

    def __init__(self, recovery: Recovery, *, on_limit: Callable[[str, int], None],
                 on_signal: Callable[[int], None]) -> None:
        self._r = recovery
        self._on_limit, self._on_signal = on_limit, on_signal
        self._start = time.monotonic()
        self._last_output = self._start
        self._signalled = recovery.signal == 0
        self.fired = ""  # the limit reached: "timeout" or "stall"
        self._wake = threading.Event()
        self._closed = False
        self._thread = spawn(self._run, name="poprun-limits")

    def output(self) -> None:
        """Tell that an instance wrote output now."""
        self._last_output = time.monotonic()

    def attempt(self) -> None:
        """Tell that an attempt starts: the stall clock starts afresh."""
        self._last_output = time.monotonic()

    def pause(self) -> None:
        """Stop the stall clock until the next attempt starts (a back-off between attempts is no stall)."""
        self._last_output = float("inf")

    def resume(self) -> None:
        """Start the stall clock again after :meth:`pause` (an instance started again alone); else nothing."""
        if self._last_output == float("inf"):
            self._last_output = time.monotonic()

    def close(self) -> None:
        """End the thread (idempotent)."""
        self._closed = True
        self._wake.set()

    def _next(self, now: float) -> float:
        """Return the seconds until the next thing to check."""
        r, waits = self._r, [1.0]
        if r.timeout_ms:
            waits.append(self._start + r.timeout_ms / 1000 - now)
            if not self._signalled:
                waits.append(self._start + (r.timeout_ms - r.signal_before_ms) / 1000 - now)
        if r.stall_timeout_ms:
            waits.append(self._last_output + r.stall_timeout_ms / 1000 - now)
        return max(0.0, min(waits))

    def _run(self) -> None:
        r = self._r
        while not self._closed:
            self._wake.wait(self._next(time.monotonic()))
            if self._closed:
                return
            now = time.monotonic()
            if not self._signalled and r.timeout_ms and now - self._start >= (r.timeout_ms - r.signal_before_ms) / 1000:
                self._signalled = True
                self._on_signal(r.signal)
            if r.timeout_ms and now - self._start >= r.timeout_ms / 1000:
                self._fire("timeout", int((now - self._start) * 1000))
                return
            if r.stall_timeout_ms and now - self._last_output >= r.stall_timeout_ms / 1000:
                self._fire("stall", int((now - self._last_output) * 1000))
                return

    def _fire(self, kind: str, after_ms: int) -> None:
        self.fired = kind
        self._on_limit(kind, after_ms)
