"""
A run's ``report.json``: how it ended, as data.

Layer: ``poprun.runs``; imports ``poprun.core``. Written last by the apply step
(:func:`report_data`); ``poprun report`` and ``poprun ps`` read it back (:func:`result_of`).
"""

from __future__ import annotations

import time

from poprun.core.outcome import ApplyError, ApplyResult, Attempt, InstanceFailure

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from typing import Any

    from poprun.runs.record import RunRecord

VERSION = 1


def report_data(record: RunRecord, result: ApplyResult, status: int) -> dict[str, Any]:
    """
    Return the report of a run that ended with ``result`` and poprun's exit ``status``.

    ``{"v": 1, "run": ID, "status": N, "started": UNIX_SECONDS, "ended": UNIX_SECONDS, "statuses": [...], "root_cause": I|null,
    "failures": [{index, host, pid, exit_code, signal, stopped, lost, via, tail, error}], "signals": [...],
    "error": {status, message, diagnostics: [{code, summary}]}|null, "phases": {name: seconds},
    "truncated": {index: {"kept": B, "dropped": B}}, "attempts": [{number, status, root_cause, seconds,
    master_port, next, cause, hosts, replan}], "gave_up": TEXT, "limit": ""|"timeout"|"stall", "limit_text": TEXT,
    "stacks": {index: TEXT}, "launch_phases": {name: seconds}, "slow_hosts": [{host, seconds, attempts}],
    "warnings": [{code, summary, detail, hint}]}`` (``attempts`` to ``stacks`` added with restarts and time
    limits, ``launch_phases`` and ``slow_hosts`` with the launch's own phases, ``warnings`` (PR425, told as the
    run went on, and the end's) later: older reports lack them; an attempt's ``hosts`` and ``replan``, why they
    changed, with a membership policy only). ``progress`` when the run listened for progress (docs/progress.md):
    ``{"instances": [{index, host, attempt, steps, calls, last_step, total, step_time_ms: {min, median, p90, max},
    straggler_ratio}], "received": N, "dropped": N, "forged": N, "filtered": B}``.
    """
    error = result.error
    return {
        "v": VERSION, "run": record.id, "status": status, "started": round(record.started, 6),
        "ended": round(time.time(), 6),
        "statuses": list(result.statuses), "root_cause": result.root_cause,
        "failures": [{"index": f.index, "host": f.host, "pid": f.pid, "exit_code": f.exit_code, "signal": f.signal,
                      "stopped": f.stopped, "lost": f.lost, "via": f.via, "tail": list(f.tail), "error": f.error}
                     for f in result.failures],
        "signals": list(result.signals),
        "error": None if error is None else {
            "status": error.status, "message": error.message, "signal": error.signal,
            "diagnostics": [{"code": d.code, "summary": d.summary} for d in error.diagnostics]},
        "phases": dict(record.phases),
        "launch_phases": dict(record.launch_phases),
        "slow_hosts": [{"host": host, "seconds": seconds, "attempts": attempts}
                       for host, (seconds, attempts) in record.slow_hosts.items()],
        "truncated": {str(i): {"kept": kept, "dropped": dropped}
                      for i, (kept, dropped) in sorted(record.truncation().items())},
        "attempts": [{"number": a.number, "status": a.status, "root_cause": a.root_cause, "seconds": a.seconds,
                      "master_port": a.master_port, "next": a.next, "cause": a.cause,
                      **({"hosts": list(a.hosts), "replan": a.replan} if a.hosts else {})} for a in result.attempts],
        "gave_up": result.gave_up, "limit": result.limit, "limit_text": result.limit_text,
        "stacks": {str(i): text for i, text in result.stacks},
        "warnings": [{"code": d.code, "summary": d.summary, "detail": d.detail, "hint": d.hint}
                     for d in (*result.notes, *result.warnings)],
        **({"progress": record.progress} if record.progress is not None else {}),
    }


def _one_line(value: object) -> str:
    """Return a report's error message as one printable line of at most 500 characters ("" when not a string)."""
    if not isinstance(value, str):
        return ""
    line = " ".join("".join(c if c.isprintable() else " " for c in value[:2000]).split())
    return line if len(line) <= 500 else line[:500] + " ..."  # noqa: PLR2004 - as apply's error file reader


_MAX_HOSTS = 4096  # host names read of an attempt in a report
_MAX_NAME = 255  # characters of a host name (as DNS allows)


def _names(value: object) -> tuple[str, ...]:
    """Return a report's host names (the printable strings of a list; () for anything else)."""
    if not isinstance(value, list):
        return ()
    return tuple(name for name in value[:_MAX_HOSTS] if isinstance(name, str) and name.isprintable()
                 and 0 < len(name) <= _MAX_NAME)


def result_of(data: dict[str, Any]) -> ApplyResult:
    """Return the :class:`ApplyResult` a report holds (its diagnostics by code and summary only)."""
    failures = tuple(InstanceFailure(index=f["index"], host=f["host"], pid=f.get("pid"), exit_code=f.get("exit_code"),
                                     signal=f.get("signal"), stopped=bool(f.get("stopped")), lost=bool(f.get("lost")),
                                     via=f["via"] if isinstance(f.get("via"), str) else "",
                                     error=_one_line(f.get("error")),
                                     tail=tuple(f.get("tail") or ()))
                 for f in data.get("failures") or ())
    error = data.get("error")
    attempts = tuple(Attempt(number=a["number"], status=a["status"], root_cause=a.get("root_cause"),
                             seconds=a.get("seconds", 0.0), master_port=a.get("master_port", 0), next=a.get("next", ""),
                             cause=a.get("cause", ""), hosts=_names(a.get("hosts")), replan=_one_line(a.get("replan")))
                     for a in data.get("attempts") or ())
    return ApplyResult(statuses=tuple(data.get("statuses") or ()), failures=failures, root_cause=data.get("root_cause"),
                       signals=tuple(data.get("signals") or ()), run=data.get("run"), attempts=attempts,
                       gave_up=data.get("gave_up") or "", limit=data.get("limit") or "",
                       limit_text=data.get("limit_text") or "",
                       stacks=tuple((int(i), text) for i, text in sorted((data.get("stacks") or {}).items(),
                                                                         key=lambda item: int(item[0]))),
                       error=None if not error else ApplyError(status=error["status"], message=error.get("message", ""),
                                                               signal=error.get("signal")))
