"""
Who hears of a run as it goes: the notifier and the metrics file, decided and explained.

Layer: ``poprun.planner``; imports ``poprun.core``, the plan model and the solver's state. The
solver imports it only when the spec names one of its options, so that a plan without them
never does.

:func:`observe` decides :class:`~poprun.planner.plan.Observe` from the spec and records a
decision for each part under an ``observe.`` key, which ``plan --explain`` shows in its own
section. :func:`path_problem` is the one rule for a metrics path, kept by the solver (a
warning, or PR469) and by the apply step at launch (:mod:`poprun.apply.metrics`).
"""

from __future__ import annotations

import os

from poprun.core.span import SourceSpan
from poprun.planner import plan as p
from poprun.planner import value as conv
from poprun.planner.state import Solver

__all__ = ["ALL", "KINDS", "MAX_COMMAND", "MAX_TIMEOUT_S", "PREFIX", "observe", "parse_kinds", "path_problem"]

PREFIX = "observe."
KINDS = ("run-ended", "attempt-ended", "limit-reached", "straggler", "replan")  # what --notify-on may name
ALL = "all"
MAX_COMMAND = 4096  # the --notify command, in characters
MAX_TIMEOUT_S = 3600  # the longest --notify-timeout
_DEFAULT = p.NO_OBSERVE


def observe(s: Solver) -> p.Observe:
    """
    Return the notifier and metrics file of the spec.

    Diagnostics: PR216 (too long a command), PR238 (an unknown kind), PR239 (a timeout out of
    range), PR468 (notification settings without a notifier, a warning), PR240 (a metrics file
    whose folder is missing or not writable, a warning), PR469 (a metrics path that is not a
    regular file).
    """
    command = _notify(s)
    kinds = _kinds(s, command)
    timeout = _timeout(s, command)
    if not command:
        _alone(s)
    return p.Observe(notify=command, notify_on=kinds, notify_timeout_ms=timeout, metrics_file=_metrics(s))


def _notify(s: Solver) -> str:
    given = s.spec.notify
    if given is None or not given.value.strip():
        s.decide(PREFIX + "notify", "none", given.origin if given else SourceSpan.default(PREFIX + "notify"),
                 "no notifier")
        return ""
    if len(given.value) > MAX_COMMAND or "\0" in given.value:
        why = (f"the notify command is {len(given.value)} characters long (at most {MAX_COMMAND})"
               if len(given.value) > MAX_COMMAND else "the notify command holds a NUL character")
        s.fail("PR216", "command too long" if "\0" not in given.value else "invalid command", detail=why,
               span=given.origin, hint="put the command in a script and give its path")
        return ""
    from poprun.core.secret import printable

    s.decide(PREFIX + "notify", printable(given.value), given.origin,
             "as given: run on this machine with /bin/sh, the event's JSON line on its standard input")
    return given.value


def parse_kinds(text: str) -> tuple[tuple[str, ...], str | None]:
    """
    Return the kinds of a ``--notify-on`` value in :data:`KINDS`' order, and the first word that is none (or None).

    ``all`` is every kind; words are comma-separated, spaces and case aside.
    """
    words = [word.strip().lower() for word in text.split(",")]
    for word in words:
        if word != ALL and word not in KINDS:
            return (), word
    chosen = set(KINDS) if ALL in words else set(words)
    return tuple(k for k in KINDS if k in chosen), None


def _kinds(s: Solver, command: str) -> tuple[str, ...]:
    given = s.spec.notify_on
    if given is None:
        if command:
            s.decide(PREFIX + "notify_on", ",".join(_DEFAULT.notify_on), SourceSpan.default(PREFIX + "notify_on"),
                     "default: one notification when the run ends")
        return _DEFAULT.notify_on
    kinds, wrong = parse_kinds(given.value)
    if wrong is not None:
        from poprun.core.hint import did_you_mean, list_choices

        near = did_you_mean(wrong, (*KINDS, ALL))
        shown = wrong if len(wrong) <= 40 else wrong[:37] + "..."  # noqa: PLR2004 - a long word is cut
        s.fail("PR238", "unknown notification kind",
               detail=f"'{shown}' is not an event --notify runs for" if wrong else f"'{given.value}' has an empty item",
               span=given.origin, hint=(f"did you mean '{near}'? " if near else "")
               + f"give one or more of {list_choices((*KINDS, ALL))}, comma-separated")
        return _DEFAULT.notify_on
    if command:
        s.decide(PREFIX + "notify_on", ",".join(kinds), given.origin, "as given")
    return kinds


def _timeout(s: Solver, command: str) -> int:
    given = s.spec.notify_timeout
    default = _DEFAULT.notify_timeout_ms
    if given is not None and not 0 < given.value <= MAX_TIMEOUT_S * 1000:
        s.fail("PR239", "notify timeout out of range",
               detail=f"a notify timeout of {conv.seconds_text(given.value)} s is not from 0.001 to {MAX_TIMEOUT_S} s",
               span=given.origin, hint=f"give a number of seconds from 0.001 to {MAX_TIMEOUT_S}")
        return default
    if not command:
        return given.value if given is not None else default
    if given is not None:
        s.decide(PREFIX + "notify_timeout", f"{conv.seconds_text(given.value)} s", given.origin,
                 "as given: a notifier still running then is killed, and poprun's exit waits no longer")
        return given.value
    s.decide(PREFIX + "notify_timeout", f"{conv.seconds_text(default)} s", SourceSpan.default(PREFIX + "notify_timeout"),
             "default: a notifier still running then is killed, and poprun's exit waits no longer")
    return default


def _alone(s: Solver) -> None:
    """PR468 (warning): --notify-on or --notify-timeout given without --notify."""
    given = [(flag, getattr(s.spec, name)) for name, flag in (("notify_on", "--notify-on"),
                                                               ("notify_timeout", "--notify-timeout"))
             if getattr(s.spec, name) is not None]
    if not given:
        return
    flags = " and ".join(flag for flag, _ in given)
    s.warn("PR468", "notification settings without a notifier",
           detail=f"{flags} {'has' if len(given) == 1 else 'have'} no effect without --notify: no command is run",
           span=given[0][1].origin, hint="give the command to run with --notify ([observe] notify, 'notify \"CMD\"'), "
                                         f"or leave {flags} out")


def path_problem(path: str) -> tuple[str, str] | None:
    """
    Return what keeps poprun from keeping a metrics file at ``path`` (absolute), or None.

    ``("PR469", why)``: something that is not a regular file is there (a directory, a FIFO, a
    device, a socket, a symbolic link: poprun replaces the file by renaming over it, which would
    replace a link rather than write through it, and never replaces what it did not make).
    ``("PR240", why)``: its folder is missing or this user cannot make files in it.
    """
    import stat

    try:
        found = os.lstat(path)
    except FileNotFoundError:
        found = None
    except OSError as exc:
        return "PR240", f"{path} cannot be looked at: {exc.strerror}"
    if found is not None and not stat.S_ISREG(found.st_mode):
        return "PR469", f"{path} is {_what(found.st_mode)}, not a regular file"
    if path.endswith("/"):
        return "PR469", f"{path} names a directory, not a file"
    folder = os.path.dirname(path) or "/"
    if not os.path.isdir(folder):
        return "PR240", f"the folder {folder} does not exist"
    if not os.access(folder, os.W_OK | os.X_OK):
        return "PR240", f"this user cannot make files in {folder}"
    return None


def _what(mode: int) -> str:
    import stat

    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a regular file"


def _metrics(s: Solver) -> str:
    given = s.spec.metrics_file
    if given is None or not given.value:
        if given is not None or s.spec.notify is not None:
            s.decide(PREFIX + "metrics_file", "none", given.origin if given else SourceSpan.default(PREFIX + "metrics_file"),
                     "no metrics file")
        return ""
    if "\0" in given.value:
        s.fail("PR469", "metrics file is not a regular file", detail="the metrics path holds a NUL character",
               span=given.origin, hint="give the path of a file in a folder that exists")
        return ""
    path = os.path.normpath(os.path.join(s.ctx.cwd, os.path.expanduser(given.value)))
    path += "/" if given.value.endswith("/") else ""
    problem = path_problem(path)
    if problem is not None and problem[0] == "PR469":
        s.fail("PR469", "metrics file is not a regular file", detail=problem[1], span=given.origin,
               hint="give the path of a regular file, or of none yet (poprun makes it): a textfile collector's "
                    "folder and a name ending in .prom")
        return ""
    if problem is not None:
        s.warn("PR240", "metrics file cannot be written", detail=f"{problem[1]}: the run would keep no metrics file",
               span=given.origin, hint="make the folder (writable by this user) before the run, or give another path")
    return s.decide(PREFIX + "metrics_file", path, given.origin,
                    "as given: an OpenMetrics text file, replaced once a second while the run lives and at its end")
