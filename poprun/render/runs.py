"""
Views of run records: the ``poprun ps`` table, the ``poprun report`` text, notes and tags of ``poprun logs``.

Layer: ``poprun.render``; imports ``poprun.core`` only, never ``poprun.runs``: what it draws
are core records (:class:`~poprun.core.runinfo.RunInfo`, :class:`~poprun.core.outcome.ApplyResult`)
and the plain data of a record's files (``report.json``, ``actual.json``), which
:mod:`poprun.runs` reads and checks. Every function returns text (or bytes) and prints nothing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from poprun.core.rawbytes import shell_join
from poprun.core.runinfo import RunInfo
from poprun.core.secret import mask_text

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from poprun.core.outcome import ApplyResult


def printable(text: str) -> str:
    """Return ``text`` with control characters escaped, so that a record cannot rewrite the terminal."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def render_ps(runs: Iterable[RunInfo], now: float) -> str:
    """
    Return the ``poprun ps`` table: id, state, start, duration, instances, hosts, program.

    While a listed run reports progress (``popdist.progress``), a ``PROGRESS`` column after the
    duration shows each run's ``STEP/TOTAL ETA 35 s`` (docs/progress.md).
    """
    from poprun.core.hostlist import compress

    runs = list(runs)
    progress = any(run.step is not None for run in runs)
    rows = [("RUN", "STATE", "STARTED", "DURATION", *(("PROGRESS",) if progress else ()), "INSTANCES", "HOSTS",
             "PROGRAM")]
    for run in runs:
        state = f"ended {run.status}" if run.state == "ended" else run.state
        state += ", record incomplete" if run.incomplete else ""
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run.started)) if run.started else "-"
        program = mask_text(shell_join(run.argv)) if run.argv else (run.problem or "-")
        rows.append((run.id, state, started, render_duration(run.duration(now)),
                     *((render_progress(run.step, run.total, run.eta_s),) if progress else ()),
                     "-" if run.instances is None else str(run.instances),
                     printable(_hosts(run.hosts, compress)) if run.hosts else "-", printable(program)))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return "".join("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1] + "\n"
                   for row in rows)


def render_ps_json(runs: Iterable[RunInfo], now: float) -> str:
    """Return ``poprun ps --json``: a JSON list of the runs, one object each."""
    import json

    rows = [{"id": r.id, "state": r.state, "status": r.status, "started": r.started, "ended": r.ended,
             "duration": r.duration(now), "instances": r.instances, "hosts": list(r.hosts), "argv": list(r.argv),
             "backend": r.backend, "path": r.path, "problem": r.problem or None,
             "incomplete": r.incomplete or None,
             "progress": None if r.step is None else {"step": r.step, "total": r.total, "eta_s": r.eta_s}} for r in runs]
    return json.dumps(rows, indent=2) + "\n"


def render_step(step: float) -> str:
    """Return a step as people read it: ``120``, ``1.5`` (at most three decimals), ``3.9e+301`` (from 10**15 on)."""
    step = float(step)
    if abs(step) >= 1e15:  # noqa: PLR2004 - no column holds 300 digits
        return f"{step:.4g}"
    return str(int(step)) if step.is_integer() else f"{step:.3f}".rstrip("0").rstrip(".")


def render_progress(step: float | None, total: int | None, eta_s: float | None) -> str:
    """Return ``STEP/TOTAL ETA 35 s`` (``STEP`` without a total, no ETA without one); ``-`` without a step."""
    if step is None:
        return "-"
    text = render_step(step) + (f"/{total}" if total is not None else "")
    return text + (f" ETA {render_eta(eta_s)}" if eta_s is not None else "")


def render_eta(seconds: float) -> str:
    """Return an ETA in whole units: ``35 s``, ``3 min 4 s``, ``1 h 2 min``; ``over 100000 h`` beyond (no 300 digits)."""
    if seconds >= ETA_SHOWN_H * 3600:
        return f"over {ETA_SHOWN_H} h"
    return f"{round(seconds)} s" if seconds < 59.5 else render_duration(round(seconds))  # noqa: PLR2004


ETA_SHOWN_H = 100000  # the longest ETA shown as it is (11 years)


def _hosts(hosts: tuple[str, ...], compress: Callable[[Iterable[str]], str]) -> str:
    """Return ``hosts`` as a host list (``pod[1-4]``), or listed as they are when they are no host names (a record changed)."""
    try:
        return compress(hosts)
    except ValueError:  # HostlistError
        return ",".join(hosts)


def render_duration(seconds: float | None) -> str:
    """Return a duration as ``ps`` and ``report`` show it: ``2.5 s``, ``3 min 4 s``, ``1 h 2 min``; ``-`` when unknown."""
    if seconds is None:
        return "-"
    if seconds < 60:  # noqa: PLR2004
        return f"{seconds:.1f} s"
    minutes, second = divmod(int(seconds), 60)
    hours, minute = divmod(minutes, 60)
    return f"{hours} h {minute} min" if hours else f"{minute} min {second} s"


class Tagger:
    """Tags a run's output like mpirun's --tag-output (``[1,I]<stdout>:``) when asked; passes it through otherwise."""

    def __init__(self, *, tag: bool) -> None:
        self._tag = tag
        self._at_start: dict[tuple[int, str], bool] = {}

    def piece(self, index: int, stream: str, data: bytes) -> bytes:
        """Return ``data``, a piece of instance ``index``'s ``stream``, as ``poprun logs`` writes it."""
        if self._tag and data:
            prefix = b"[1,%d]<%s>:" % (index, stream.encode())
            start = self._at_start.get((index, stream), True)
            body = data[:-1].replace(b"\n", b"\n" + prefix) + data[-1:]
            data = (prefix if start else b"") + body
            self._at_start[(index, stream)] = data.endswith(b"\n")
        return data


def render_truncation(report: dict[str, object] | None, instance: int | None) -> str:
    """Return the lines that say which instances' output the record cut (POPRUN_RUN_LOG_LIMIT), from ``report.json``."""
    cut = report.get("truncated") if report is not None else None
    if not isinstance(cut, dict):
        return ""
    return "".join(f"poprun: instance {printable(key)}'s output was cut at {sizes.get('kept')} bytes "
                   f"(POPRUN_RUN_LOG_LIMIT): {sizes.get('dropped')} bytes are not in the record\n"
                   for key, sizes in sorted(cut.items())
                   if (instance is None or key == str(instance)) and isinstance(sizes, dict))


def render_incomplete(why: str) -> str:
    """Return what a record that stops short of the run's end (``why``: a full disk) means for its reader."""
    return (f"record incomplete ({printable(why)}): it stops where it could no longer be written; what came after "
            "is not in it, but the report keeps how the run ended")


def render_report_header(info: RunInfo, data: dict[str, object] | None, now: float) -> str:
    """Return the head of ``poprun report``: the run's state, when it started and ran, its instances and program."""
    state = f"ended with status {data.get('status')}" if data is not None else info.state
    if info.state == "lost":
        state = "lost: its supervisor ended without writing a report"
    lines = [f"run {info.id}: {state}"]
    if info.started is not None:
        took = render_duration(info.duration(now))
        lines.append(f"started {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(info.started))}, "
                     f"{'running' if info.state == 'running' else 'ran'} {took}")
    if info.incomplete:
        lines.append(render_incomplete(info.incomplete))
    if info.instances is not None:
        hosts = ", ".join(info.hosts) or "-"
        lines.append(f"{info.instances} instance{'' if info.instances == 1 else 's'} on {printable(hosts)} "
                     f"({info.backend} backend): {printable(mask_text(shell_join(info.argv)))}")
    if info.network:  # the interface collectives used on each host (docs/network.md)
        lines.append("network: " + "; ".join(printable(line) for line in info.network))
    return "".join(f"{line}\n" for line in lines)


def render_report(data: dict[str, object], result: ApplyResult) -> str:
    """
    Return the report of a run that ended: the failure report (as poprun printed it), the phases, truncation.

    ``data`` is its checked ``report.json``, ``result`` the :class:`ApplyResult` read back from it
    (:func:`poprun.runs.report.result_of`).
    """
    from poprun.render.outcome import render_outcome

    error_ = data.get("error")
    if isinstance(error_, dict) and not error_.get("message") and error_.get("diagnostics"):
        from poprun.core.outcome import ApplyError
        from poprun.core.record import evolve

        told = "; ".join(f"error[{d['code']}]: {d['summary']}" for d in error_["diagnostics"])
        assert result.error is not None
        result = evolve(result, error=ApplyError(status=result.error.status, message=told, signal=result.error.signal))
    parts = [render_outcome(result)]
    phases = data.get("phases")
    if isinstance(phases, dict) and phases:
        order = ("plan", "partition", "start", "run", "teardown")
        named = sorted(phases, key=lambda p: (order.index(p) if p in order else len(order), p))
        parts.append("phases: " + ", ".join(f"{printable(p)} {phases[p]:.3f} s" for p in named) + "\n")
    launch = data.get("launch_phases")
    if isinstance(launch, dict) and launch:
        parts.append("launch: " + ", ".join(f"{printable(p)} {launch[p]:.3f} s" for p in launch) + "\n")
    slow = data.get("slow_hosts")
    if isinstance(slow, list) and slow:
        parts.append("slow hosts: " + ", ".join(f"{printable(h['host'])} {h['seconds']:.2f} s" for h in slow) + "\n")
    truncated = data.get("truncated")
    if isinstance(truncated, dict):
        parts.extend(f"instance {printable(i)}: output cut at {v['kept']} bytes, {v['dropped']} bytes not kept "
                     "(POPRUN_RUN_LOG_LIMIT)\n" for i, v in sorted(truncated.items()))
    parts.append(render_report_progress(data.get("progress")))
    return "".join(parts)


def render_report_progress(progress: object) -> str:
    """
    Return what report.json's ``progress`` says of each instance: its last step, steps, calls and step times.

    ``progress:`` then a line per instance, ``instance 0 on h1: step 50/50, 50 steps in 51 calls, step time
    min 20.1 / median 20.1 / p90 20.2 / max 20.4 ms``; an entry not as poprun writes it is left out.
    """
    instances = progress.get("instances") if isinstance(progress, dict) else None
    if not isinstance(instances, list) or not instances:
        return ""
    lines = []
    for item in instances:
        if not isinstance(item, dict) or not _numbers(item, ("index", "steps", "calls"), whole=True):
            continue
        step, total, times = item.get("last_step"), item.get("total"), item.get("step_time_ms")
        at = "no step" if not _numbers(item, ("last_step",)) else f"step {render_step(float(step))}" + (  # type: ignore[arg-type]
            f"/{total}" if _numbers(item, ("total",), whole=True) else "")
        line = (f"  instance {item['index']} on {printable(str(item.get('host', '')))}: {at}, "
                f"{item['steps']} step{'' if item['steps'] == 1 else 's'} in {item['calls']} "
                f"call{'' if item['calls'] == 1 else 's'}")
        names = ("min", "median", "p90", "max")
        if isinstance(times, dict) and _numbers(times, names):
            line += ", step time " + " / ".join(f"{name} {times[name]:.1f}" for name in names) + " ms"
        ratio = item.get("straggler_ratio")
        if _numbers(item, ("straggler_ratio",)):
            line += f", straggler ({ratio:.2f}x the run's median)"
        lines.append(line + "\n")
    dropped = progress.get("forged") if isinstance(progress, dict) else None
    tail = (f"  {dropped} datagram{'' if dropped == 1 else 's'} not the run's dropped (PR448)\n"
            if type(dropped) is int and dropped > 0 else "")
    return ("progress:\n" + "".join(lines) + tail) if lines or tail else ""


def _numbers(data: dict[str, object], keys: tuple[str, ...], *, whole: bool = False) -> bool:
    """
    Return whether every one of ``keys`` in ``data`` is a finite number (an int with ``whole``), not a bool.

    Without ``whole`` the number is shown as a float: an int no float holds (400 digits) is none.
    """
    import math

    return all((type(data.get(key)) is int and (whole or abs(data[key]) < 2**1023))  # type: ignore[arg-type]
               or (not whole and type(data.get(key)) is float and math.isfinite(data[key]))  # type: ignore[arg-type]
               for key in keys)


def render_verified(actual: object) -> str:
    """
    Return what ``actual.json`` (``actual``, its data) says of each instance against the plan: one line when all is as planned.

    ``verified: 4 of 4 instances as planned (argv, environment, CPUs)``, else a line per
    instance that differs (the names of variables, never their values) and how many were not
    read back (other hosts, or ended before they could be).
    """
    instances = actual.get("instances") if isinstance(actual, dict) else None
    if not isinstance(instances, dict) or not instances:
        return ""
    lines, same, unread = [], 0, 0
    def number(item: tuple[str, object]) -> int:
        return int(item[0]) if item[0].isascii() and item[0].isdigit() and len(item[0]) < 10 else -1  # noqa: PLR2004

    for index, seen in sorted(instances.items(), key=number):
        if not isinstance(seen, dict) or seen.get("verified") is not True:
            unread += 1
            continue
        wrong = [what for what, key in (("argv", "argv_as_planned"), ("environment", "env_as_planned"),
                                        ("CPUs", "cpus_as_planned")) if seen.get(key) is not True]
        if not wrong:
            same += 1
            continue
        differ = seen.get("env_differs")
        names = f" ({', '.join(printable(str(n)) for n in differ)})" if isinstance(differ, list) and differ else ""
        lines.append(f"  instance {printable(str(index))} on {printable(str(seen.get('host')))}: "
                     f"{', '.join(wrong)} not as planned{names if 'environment' in wrong else ''}\n")
    total = len(instances)
    head = f"verified: {same} of {total} instance{'' if total == 1 else 's'} as planned (argv, environment, CPUs)"
    if unread:
        head += f"; {unread} not read back (on other hosts, or ended before they could be)"
    return head + "\n" + "".join(lines)
