"""
The backend protocol and the values a launch returns.

Layer: ``poprun.backends``; imports ``poprun.planner.plan``; never the spec.

A :class:`Backend` starts every instance of a plan and returns a :class:`Launch` at once;
:meth:`Launch.wait` returns an :class:`ApplyResult`. Instance output reaches the user through
an :class:`OutputSink` that the caller owns, so that backends never print. A sink that is also
an :class:`EventSink` hears when each instance starts and ends (for logs and progress); a
backend must not require one.
"""

from __future__ import annotations

from collections.abc import Mapping

from poprun.core.diagnostic import Diagnostic
from poprun.core.events import Event, InstanceEnded, InstanceStarted
from poprun.core.outcome import CANNOT_LAUNCH, ApplyResult, InstanceFailure, signal_name
from poprun.planner.plan import Instance, LaunchPlan

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from typing import ClassVar, Literal, Protocol

    Stream = Literal["stdout", "stderr"]
    """poprun's own output streams, as an instance's output is forwarded to them."""
else:
    Protocol = object  # the protocols below are for type checkers; at run time, plain classes
    Stream = str

NOT_EXECUTABLE = 126
NOT_FOUND = 127

__all__ = ["CANNOT_LAUNCH", "NOT_EXECUTABLE", "NOT_FOUND", "ApplyResult", "Backend", "Event", "EventSink",
           "InstanceEnded", "InstanceFailure", "InstanceStarted", "Launch", "LaunchError", "OutputSink", "Stream",
           "environment", "signal_name"]


def environment(instance: Instance, env_source: Mapping[str, str]) -> dict[str, str]:
    """Return the environment of ``instance``: ``env_source`` minus ``unset`` plus ``set``."""
    env = {k: v for k, v in env_source.items() if k not in instance.env.unset}
    env.update(instance.env.set)
    return env


class LaunchError(Exception):
    """
    Nothing of the plan runs: the program is missing, a host is wrong, a directory is gone.

    ``status`` is poprun's exit status: 127 program not found, 126 not executable, 125 any
    other reason poprun could not launch (design.md section 3). The message is one line;
    ``diagnostics``, when there are several problems with codes (the ssh preflight), say more.
    """

    def __init__(self, message: str, *, status: int = CANNOT_LAUNCH, diagnostics: tuple[Diagnostic, ...] = ()) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.diagnostics = diagnostics  # when given, what to show instead of the message (one per problem)


class OutputSink(Protocol):
    """Where forwarded instance output goes (the terminal, in the CLI)."""

    def write(self, stream: Stream, data: bytes) -> None:
        """
        Write ``data`` (one or more whole lines, each ending in a newline) to ``stream``.

        Backends call this from one thread at a time, so a sink need not lock.
        """


class EventSink(OutputSink, Protocol):
    """An output sink that also hears of instances starting and ending, from the same thread as ``write``."""

    def event(self, event: Event) -> None:
        """Take note of ``event``; must return quickly (it is called between writes of output)."""


class Launch(Protocol):
    """A running plan. Safe to :meth:`terminate` from a signal handler or another thread."""

    def wait(self) -> ApplyResult:
        """
        Block until every instance has ended and its output is forwarded; return the result.

        When an instance fails, the backend stops the others (SIGTERM, then SIGKILL after its
        grace period) before returning. Once it returns, no process of the launch is left.
        """

    def terminate(self, grace_s: float) -> None:
        """
        Stop every instance still running: SIGTERM now, SIGKILL after ``grace_s`` seconds.

        Returns at once; :meth:`wait` returns when they have ended. ``grace_s`` 0 kills at once;
        a second call with a grace only keeps the first deadline. After the end it does nothing.
        """


class Backend(Protocol):
    """
    Something that runs a plan: ``local``, ``offline`` (later ``ssh``, ``mpirun``, ``slurm``).

    A backend executes the plan's argv, cwd and environment exactly; it decides nothing.
    """

    name: ClassVar[str]

    def launch(self, plan: LaunchPlan, *, env_source: Mapping[str, str], sink: OutputSink) -> Launch:
        """
        Start every instance of ``plan``; return without waiting for them.

        ``env_source`` is the launching environment: forwarded variables are read from it.

        Raises:
            LaunchError: when no instance could be started (nothing is left running).
        """
