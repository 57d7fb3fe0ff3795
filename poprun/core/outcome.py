"""
How a launch ended: each failed instance, the root cause, poprun's status.

Layer: ``poprun.core``; imports only the standard library and :mod:`poprun.core` (record, diagnostic, exitstatus).
Backends return an :class:`ApplyResult` from ``Launch.wait``; the apply step completes it
with what happened around the launch; ``poprun.render`` shows it.
"""

from __future__ import annotations

import signal

from poprun.core.diagnostic import Diagnostic
from poprun.core.exitstatus import CANNOT_LAUNCH, FAILURE, OK, SIGNALLED, TIMED_OUT
from poprun.core.record import record


@record
class InstanceFailure:
    """
    One instance that ended badly.

    Exactly one of ``exit_code`` and ``signal`` is set. ``stopped`` is True when poprun had
    already begun stopping the launch (after another failure, or when interrupted) when this
    instance ended, so it is a consequence, never the root cause. ``lost`` is True when its
    host stopped answering: what became of the instance is unknown, and the host is to blame
    (``via``, when set: the relay through which its host was reached stopped answering).
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
    via: str = ""  # the relay that stopped answering, when the instance's host was reached through one
    error: str = ""  # the message its torch ``@record`` wrote to its error file (one printable line), if any

    @property
    def status(self) -> int:
        """Return the shell's view of how it ended: the exit code, or 128+N for signal N."""
        return SIGNALLED + self.signal if self.signal is not None else self.exit_code or OK

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
class ApplyError:
    """
    poprun's own failure, and its exit status: nothing of the plan ran, or the backend failed while it ran.

    ``status`` is 125 (the backend or the partition could not be had, the backend could not
    launch, or it failed while running: a host the mpirun backend lost), 126/127 (the program
    is not executable / not found), or 128+N when signal N stopped poprun before the launch
    (``signal``). ``message`` is one line; ``diagnostics``, when given, say more (one per
    problem, with codes) and are shown instead.
    """

    status: int
    message: str = ""
    diagnostics: tuple[Diagnostic, ...] = ()
    signal: int | None = None


@record
class Attempt:
    """
    One attempt of a run that may restart: how it ended and what poprun did next.

    ``status`` is poprun's status for it, ``root_cause`` the instance to blame (or None),
    ``seconds`` how long it ran, ``master_port`` its MASTER_PORT (0: none), ``next`` in one
    line what followed (``restarted after 1 s``, ``not restarted: status 2 is never retried``).
    With a membership policy, ``hosts`` are those it ran on and ``replan`` why they changed.
    """

    number: int
    status: int
    root_cause: int | None = None
    seconds: float = 0.0
    master_port: int = 0
    next: str = ""
    cause: str = ""  # the root cause in one line: "instance 1 exited with 3 on h1"
    hosts: tuple[str, ...] = ()  # the hosts it ran on (with a membership policy: docs/membership.md)
    replan: str = ""  # why they are not the hosts of the attempt before ("" when they are)


@record
class ApplyResult:
    """
    How a launch ended.

    ``statuses`` holds each instance's status by index (0, an exit code, or 128+N for
    signal N). ``failures`` lists every instance that did not end with 0, in the order they
    were seen to end. ``root_cause`` is the index of the first failure that was not caused by
    poprun stopping the launch, or None. A backend's ``Launch.wait`` fills these three; the
    apply step the rest.
    """

    statuses: tuple[int, ...]
    failures: tuple[InstanceFailure, ...] = ()
    root_cause: int | None = None
    # What the apply step (poprun.apply) adds around a backend's result:
    error: ApplyError | None = None  # poprun's own failure (then statuses is empty): nothing ran, or the backend failed
    signals: tuple[int, ...] = ()  # what stopped poprun, in order (SIGPIPE when an output stream was closed)
    warnings: tuple[Diagnostic, ...] = ()  # what to tell at the very end (releasing the partition)
    notes: tuple[Diagnostic, ...] = ()  # warnings told on stderr while the run went on (PR425): for the report
    run: str | None = None  # the id of the run's record, when one was kept
    attempts: tuple[Attempt, ...] = ()  # every attempt, when the plan allows restarts (the last is this result's)
    limit: str = ""  # the limit that ended the run: "timeout", "stall", "heartbeat" or "straggler" (status 124)
    limit_text: str = ""  # that limit in one line ("the run timed out after 30 s (--timeout)")
    stacks: tuple[tuple[int, str], ...] = ()  # (instance, where it was) collected before a limit stopped it
    gave_up: str = ""  # why the run was not restarted again, when it could have been (the crash-loop guard...)

    @property
    def status(self) -> int:
        """Return poprun's exit status: the root cause's status, 125 when its host was lost, else 0 (design.md 3)."""
        cause = self.failure(self.root_cause)
        if cause is not None and cause.lost:
            return CANNOT_LAUNCH
        return cause.status if cause is not None else OK

    def failure(self, index: int | None) -> InstanceFailure | None:
        """Return the failure of instance ``index``, or None."""
        return next((f for f in self.failures if f.index == index), None)


def exit_status(result: ApplyResult, *, failed_output: bool = False) -> int:
    """
    Return poprun's exit status for ``result`` (design.md section 3).

    poprun's own failure: its status (125, 126, 127, or 128+N when signal N stopped poprun
    before the launch). A limit that ended the run (``--timeout``, ``--stall-timeout``; a hung
    instance, a straggler with no restart left): 124. Stopped by signal N with no instance to
    blame: 128+N (141 when stdout or stderr was closed, as for a tool killed by SIGPIPE). The instances' status otherwise; 1
    when they succeeded but their output could not be written (``failed_output``).
    """
    if result.error is not None:
        return result.error.status
    if result.limit:
        return TIMED_OUT
    if result.root_cause is None and result.signals:
        return SIGNALLED + result.signals[0]
    if result.status == OK and failed_output:
        return FAILURE
    return result.status
