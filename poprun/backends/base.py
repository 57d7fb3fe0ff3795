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

import signal
from collections.abc import Mapping

from poprun.core.diagnostic import Diagnostic
from poprun.core.record import record
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
CANNOT_LAUNCH = 125


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


@record
class InstanceStarted:
    """Instance ``index`` runs as process ``pid`` (on its host)."""

    index: int
    pid: int


@record
class InstanceEnded:
    """
    Instance ``index`` (process ``pid``) ended: ``exit_code``, or killed by ``signal``.

    ``stopped`` as in :class:`InstanceFailure`: poprun was already stopping the launch;
    ``lost``: its host stopped answering (its status is then the ssh client's).
    """

    index: int
    pid: int
    exit_code: int | None = None
    signal: int | None = None
    stopped: bool = False
    lost: bool = False

    @property
    def status(self) -> int:
        """Return the exit code, or 128+N for signal N."""
        return 128 + self.signal if self.signal is not None else self.exit_code or 0


Event = InstanceStarted | InstanceEnded


class EventSink(OutputSink, Protocol):
    """An output sink that also hears of instances starting and ending, from the same thread as ``write``."""

    def event(self, event: Event) -> None:
        """Take note of ``event``; must return quickly (it is called between writes of output)."""


@record
class InstanceFailure:
    """
    One instance that ended badly.

    Exactly one of ``exit_code`` and ``signal`` is set. ``stopped`` is True when poprun had
    already begun stopping the launch (after another failure, or when interrupted) when this
    instance ended, so it is a consequence, never the root cause. ``lost`` is True when its
    host stopped answering: what became of the instance is unknown, and the host is to blame.
    ``tail`` holds the last lines of its output (stdout and stderr as they arrived), kept even
    when not shown.
    """

    index: int
    host: str
    exit_code: int | None = None
    signal: int | None = None
    stopped: bool = False
    tail: tuple[str, ...] = ()
    pid: int | None = None  # None when the backend does not know it (a remote or simulated instance)
    lost: bool = False

    @property
    def status(self) -> int:
        """Return the shell's view of how it ended: the exit code, or 128+N for signal N."""
        return 128 + self.signal if self.signal is not None else self.exit_code or 0

    @property
    def signal_name(self) -> str | None:
        """Return the name of the signal that killed it (``SIGKILL``), or None."""
        return None if self.signal is None else signal_name(self.signal)


def signal_name(number: int) -> str:
    """Return ``SIGTERM`` for 15, or ``signal 99`` for a number with no name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


@record
class ApplyResult:
    """
    How a launch ended.

    ``statuses`` holds each instance's status by index (0, an exit code, or 128+N for
    signal N). ``failures`` lists every instance that did not end with 0, in the order they
    were seen to end. ``root_cause`` is the index of the first failure that was not caused by
    poprun stopping the launch, or None.
    """

    statuses: tuple[int, ...]
    failures: tuple[InstanceFailure, ...] = ()
    root_cause: int | None = None

    @property
    def status(self) -> int:
        """Return poprun's exit status: the root cause's status, 125 when its host was lost, else 0 (design.md 3)."""
        cause = self.failure(self.root_cause)
        if cause is not None and cause.lost:
            return CANNOT_LAUNCH
        return cause.status if cause is not None else 0

    def failure(self, index: int | None) -> InstanceFailure | None:
        """Return the failure of instance ``index``, or None."""
        return next((f for f in self.failures if f.index == index), None)


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
