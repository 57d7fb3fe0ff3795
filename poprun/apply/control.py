"""
How the caller of :func:`poprun.apply.apply` stops a run, or pauses it: :class:`Control`, and :class:`Stopped`.

Layer: ``poprun.apply``; imports ``poprun.backends.base`` (types only) and ``poprun.core``; never
another module of ``poprun.apply``: what a stop does to the run is the run's state's
(:class:`poprun.apply.attempts.Run`), which :func:`~poprun.apply.apply` binds to the control.
"""

from __future__ import annotations

import signal
import threading

from poprun.core.outcome import signal_name

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from typing import Protocol

    from poprun.backends.base import Launch, Stream

    class Stoppable(Protocol):
        """What a :class:`Control` stops once apply has begun: the run's state (:class:`poprun.apply.attempts.Run`)."""

        @property
        def launch(self) -> Launch | None:
            """The attempt's launch while it exists."""

        def stop(self, signum: int, why: str, grace_s: float) -> None:
            """Stop the run because of ``signum`` (may raise :class:`Stopped` before anything started)."""

        def output_closed(self, why: str, grace_s: float) -> None:
            """Stop the run because an output stream has no reader any more."""

__all__ = ["GRACE_S", "Control", "Stopped"]

GRACE_S = 5.0  # between SIGTERM and SIGKILL when the launch is stopped


class Stopped(BaseException):  # like KeyboardInterrupt: it unwinds the steps before the launch
    """A stop came before anything was launched (the partition step, the cache, the backend's start)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


class Control:
    """
    How the caller of :func:`apply` stops the launch, or pauses it; one per apply.

    :meth:`stop` takes a signal number (SIGINT, SIGTERM, SIGHUP): called from a signal handler
    before any instance of the attempt has started (the partition step, a backend's preflight
    waiting on a host that does not answer), it raises :class:`Stopped` there, which unwinds
    every step, the backend's start included (a backend undoes what it began); once an instance
    has started (the launch may not have returned yet), it stops the instances as soon as the
    launch exists: SIGTERM, SIGKILL after the grace period; a second stop kills at once.
    Called from another thread before the launch, it takes effect as soon as the launch exists.
    :meth:`output_closed` stops the launch as SIGPIPE would stop a tool, once. ``signals``
    lists every stop, SIGPIPE included.
    """

    def __init__(self, *, grace_s: float = GRACE_S) -> None:
        self.signals: list[int] = []
        self.grace_s = grace_s
        self.woken = threading.Event()  # set by every stop: a wait between attempts ends
        self._stops = 0  # stop signals received: the second kills
        self._run: Stoppable | None = None  # the run's state, once apply() has begun it (bind)

    def bind(self, run: Stoppable) -> None:
        """Let stops reach ``run`` (apply's; before, a stop in the main thread raises :class:`Stopped`)."""
        self._run = run

    @property
    def _launch(self) -> Launch | None:
        """The attempt's launch while it exists (the run's)."""
        return self._run.launch if self._run is not None else None

    def stop(self, signum: int) -> None:
        """Stop the launch because of signal ``signum`` (see the class docstring)."""
        self.signals.append(signum)
        self._stops += 1
        self.woken.set()
        if self._run is None:
            if threading.current_thread() is threading.main_thread():
                raise Stopped(signum)
            return  # apply() stops the launch once it exists
        self._run.stop(signum, f"received {signal_name(signum)}", self.grace())

    def output_closed(self, stream: Stream) -> None:
        """``stream`` has no reader any more: stop the launch, as SIGPIPE stops a tool (from any thread), once."""
        if signal.SIGPIPE in self.signals:
            return
        self.signals.append(signal.SIGPIPE)
        self.woken.set()
        if self._run is not None:
            self._run.output_closed(f"{stream} was closed", self.grace_s)

    def forward(self, sig: int) -> None:
        """Send ``sig`` (SIGTSTP, SIGCONT) to every instance, where the backend can (Ctrl-Z)."""
        launch = self._launch
        if launch is not None:
            launch.forward(sig)

    def grace(self) -> float:
        """Return the grace a stop gives now: :attr:`grace_s`, none once a second stop came."""
        return self.grace_s if self._stops <= 1 else 0
