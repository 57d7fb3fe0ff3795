"""
How a launch ended, as poprun tells it on stderr: the failure report.

Layer: ``poprun.render``; imports ``poprun.core`` only. :func:`render_outcome` is everything
poprun writes about an applied plan once it has ended (:class:`~poprun.core.outcome.ApplyResult`
from :func:`poprun.apply.apply`); :func:`render_failures` is its failure report.
"""

from __future__ import annotations

import signal

from poprun.core.diagnostic import Diagnostic
from poprun.core.outcome import ApplyResult, InstanceFailure, signal_name


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'' if count == 1 else 's'}"


def render_outcome(result: ApplyResult) -> str:
    """
    Return what poprun says on stderr about how the apply ended ("" for a quiet success).

    When poprun itself failed (``error``): why (its diagnostics, else ``poprun: MESSAGE``). Then the warnings of the
    end (releasing the partition). Then, when poprun was stopped with no instance to blame,
    ``poprun: stopped by SIGNAL`` (nothing for SIGPIPE: the reader left); else the failure report.
    """
    parts: list[str] = []
    cause = result.error
    if cause is not None:
        parts.append(_diagnostics(cause.diagnostics) if cause.diagnostics else f"poprun: {cause.message}\n")
    if result.warnings:
        parts.append(_diagnostics(result.warnings))
    if result.attempts and (len(result.attempts) > 1 or result.gave_up):
        parts.append(render_attempts(result))
    if result.limit:
        parts.append(render_limit(result))
    if cause is None:
        if result.root_cause is None and result.signals and not result.limit:
            if result.signals[0] != signal.SIGPIPE:
                parts.append(f"poprun: stopped by {signal_name(result.signals[0])}\n")
        else:
            parts.append(render_failures(result))
    return "".join(parts)


def render_attempts(result: ApplyResult) -> str:
    """Return every attempt of a run that could restart: how each ended and what followed."""
    lines = [f"poprun: {_plural(len(result.attempts), 'attempt')}" + (f" (run {result.run})" if result.run else "")
             + ":"]
    for attempt in result.attempts:
        port = f"MASTER_PORT {attempt.master_port}, " if attempt.master_port else ""
        how = attempt.cause or ("succeeded" if attempt.status == 0 else f"status {attempt.status}")
        lines.append(f"  attempt {attempt.number} ({port}{attempt.seconds:.1f} s): {how}"
                     + (f"; {attempt.next}" if attempt.next and attempt.next != "succeeded" else ""))
        if attempt.hosts:  # a membership policy: where each attempt ran, and why that changed
            lines.append(f"    on {','.join(attempt.hosts)}" + (f": {attempt.replan}" if attempt.replan else ""))
    return "\n".join(lines) + "\n"


def render_limit(result: ApplyResult) -> str:
    """Return the time limit that ended the run, and where each instance was then (their stacks)."""
    if result.root_cause is not None:  # the limit came while no instance ran (waiting to restart): none was stopped
        return f"poprun: {result.limit_text}; nothing was started again" + (f" (run {result.run})" if result.run
                                                                             else "") + "\n"
    lines = [f"poprun: {result.limit_text}; every instance was stopped" + (f" (run {result.run})" if result.run else "")]
    if result.stacks:
        lines.append("Where each instance was when the run was stopped:")
        for index, text in result.stacks:
            lines.append(f"  instance {index}:" if index >= 0 else "  poprun:")  # -1: why none could be read
            lines.extend(f"    | {line}" for line in text.splitlines())
    else:
        lines.append("No instance's stack could be read (install py-spy, or run Python instances with "
                     "PYTHONFAULTHANDLER=1).")
    if result.limit == "heartbeat":  # a long step is a hang by this rule: say how a program that is not hung avoids it
        lines.append("An instance that computes longer than --heartbeat-timeout between two reports is hung by "
                     "this rule: call popdist.heartbeat() inside long steps (a checkpoint, an evaluation), or give a "
                     "longer --heartbeat-timeout.")
    return "\n".join(lines) + "\n"


def _diagnostics(diagnostics: tuple[Diagnostic, ...]) -> str:
    from poprun.render.diagnostics import render_diagnostics  # json: not on the path of a launch that succeeds

    return render_diagnostics(diagnostics, {})


def describe(failure: InstanceFailure) -> str:
    """Return how an instance ended: ``exited with status 3``, ``killed by SIGKILL (...)``."""
    if failure.lost and failure.via:
        return f"lost: host {failure.via}, the relay it was reached through, stopped answering"
    if failure.lost:
        return f"lost: host {failure.host} stopped answering"
    if failure.signal is None:
        text = f"exited with status {failure.exit_code}"
    else:
        text = f"killed by {failure.signal_name}"
        if failure.signal == signal.SIGKILL and not failure.stopped:
            text += " (possibly out of memory)"
    return text + (" (stopped by poprun)" if failure.stopped else "")


def render_failures(result: ApplyResult) -> str:
    """
    Return the failure report, or "" when nothing failed.

    Every failed instance, root cause first, with its host, PID, how it ended, the message of its
    torch error file (``@record``) and the tail of its output; then the root cause again, on the last line.
    """
    if not result.failures:
        return ""
    cause = result.failure(result.root_cause)
    ordered = sorted(result.failures, key=lambda f: f is not cause)  # stable: the rest in the order seen
    lines = [f"poprun: {_plural(len(ordered), 'instance')} failed" + (f" (run {result.run})" if result.run else "")]
    for failure in ordered:
        pid = f" (PID {failure.pid})" if failure.pid is not None else ""
        lines.append(f"  instance {failure.index} on {failure.host}{pid}: {describe(failure)}")
        if failure.error:
            lines.append(f"    error file: {failure.error}")
        lines.extend(f"    | {line}" for line in failure.tail)
    if cause is not None and cause.lost and cause.via:
        lines.append(f"Root cause: error[PR411]: host {cause.via} stopped answering (the relay through which "
                     f"instance {cause.index} on {cause.host} was reached); every other instance was stopped")
    elif cause is not None and cause.lost:
        lines.append(f"Root cause: error[PR411]: host {cause.host} stopped answering (instance {cause.index} ran "
                     "there); every other instance was stopped")
    elif cause is not None:
        lines.append(f"Root cause: instance {cause.index} on {cause.host} {describe(cause)}")
    return "\n".join(lines) + "\n"
