"""
The plan's health check, run on every host before an attempt starts: each host's outcome, its events and diagnostics.

Layer: ``poprun.apply``; imports ``poprun.core``, :mod:`poprun.process.hostscript`,
:mod:`poprun.apply.hostrun`, the ssh fan-out's window (:mod:`poprun.backends.ssh.fanout`) and
:mod:`poprun.planner.plan` (types only); never the planner's solving, and nothing of a
backend but its optional ``run_on_host``. Imported only for a plan with a health check.

The API the apply step calls, before the first start and before each restart::

    checks = check_hosts(backend, plan, [*hosts, *plan.membership.spares], environ=env_source,
                         emit=relay.event, stop=stopping)       # -> HealthChecks
    problems = health_problems(checks)                          # -> tuple[Diagnostic, ...]: PR445, PR446
    lost = checks.lost()                                        # -> {host: why}, for poprun.planner.replan

:func:`check_hosts` runs ``plan.membership.health_check`` on every host given, through the
backend's ``run_on_host`` (the ssh backend's shared connection, ``srun`` inside the allocation,
``/bin/sh`` here), at most :func:`window` hosts at once, each bounded by
``plan.membership.health_check_timeout_ms``. It returns a :class:`HealthChecks`: per host
(in the order given) passed, failed (its status), timed out, unreachable (the backend's one line), or
stopped; the milliseconds it took; the last lines of its output (standard output and error
together). It emits one :class:`~poprun.core.events.HealthChecked` per host as each ends.
Setting ``stop`` (a :class:`threading.Event`: Ctrl-C) ends every check still running within
about two seconds, on every host, and returns at once with those marked stopped. It never
raises for a host.

How a check runs on a host (:func:`host_script`, plain POSIX sh on ``sh -s``'s standard input:
the command is in no process's argv, here or there, only in the environment of the check's own
shell, read by the user that runs it):

- the command runs as ``sh -c`` would run it (``eval`` in a shell of its own), with standard
  input /dev/null and standard error joined to standard output, under coreutils' ``timeout``
  at the deadline (SIGTERM, SIGKILL a second later);
- its output goes through ``tail -c`` on the host: only the last :data:`TAIL_BYTES` are kept
  there and sent back, however much it prints;
- every process of the check carries a random mark in its environment; when the check ends
  (its own exit, its deadline, poprun going away), every process that carries it is killed,
  a daemon that left its session and holds the output open included (found through
  ``/proc/*/environ``);
- the host-side script writes a byte to poprun every second; when it cannot (the connection
  is gone: poprun was stopped or SIGKILLed, whose watchdog ends its ssh connections), it kills
  the check's processes and ends. Known limit: a process that both leaves the session and
  clears its environment is not found (as the watchdog's own limits in
  :mod:`poprun.process.watchdog`).
"""

from __future__ import annotations

import secrets
import shlex
import threading
import time

from poprun.core.diagnostic import Diagnostic, error
from poprun.core.events import HealthChecked
from poprun.core.record import record
from poprun.core.secret import mask_text, printable
from poprun.core.span import SourceSpan
from poprun.core.threads import spawn
from poprun.process.hostscript import CancelledError, Scope, scope

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up)
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping, Sequence

    from poprun.planner.plan import LaunchPlan

TAIL_BYTES = 8192  # of a check's output, kept on its host and sent back
TAIL_LINES = 10  # of those, shown in a diagnostic and an event
LINE_CHARS = 300  # of each such line
STOP_WAIT_S = 5.0  # after a stop, how long poprun waits for the cancelled checks, all together
ANSWER_S = 10.0  # beyond the deadline, how long poprun waits for a host's answer (connecting, sending it back)
PASSED, FAILED, TIMED_OUT, UNREACHABLE, STOPPED = "passed", "failed", "timed out", "unreachable", "stopped"

__all__ = ["HealthCheck", "HealthChecks", "check_hosts", "health_problems", "host_script", "window"]


@record
class HealthCheck:
    """
    How the health check went on ``host``: ``outcome`` is passed, failed, timed out, unreachable or stopped.

    ``status`` is the check's exit status (None unless it passed or failed); ``ms`` how long it
    took, seen from here; ``tail`` its output's last lines (printable-escaped, masked, at most
    :data:`TAIL_LINES`); ``reason`` one line: why the host could not be reached.
    """

    host: str
    outcome: str
    status: int | None = None
    ms: int = 0
    tail: tuple[str, ...] = ()
    reason: str = ""

    @property
    def ok(self) -> bool:
        """Whether the host passed."""
        return self.outcome == PASSED


@record
class HealthChecks:
    """Every host's :class:`HealthCheck`, in the order the hosts were given; ``timeout_ms``: the deadline; ``stopped``: a stop ended them."""

    checks: tuple[HealthCheck, ...] = ()
    timeout_ms: int = 0
    stopped: bool = False

    @property
    def ok(self) -> bool:
        """Whether every host passed (true when there was no check)."""
        return all(c.ok for c in self.checks)

    def of(self, host: str) -> HealthCheck | None:
        """Return ``host``'s check, or None when it was not checked."""
        return next((c for c in self.checks if c.host == host), None)

    def lost(self) -> dict[str, str]:
        """Return the hosts that did not pass (stopped ones aside) and why, in one line each: the ``lost`` of a re-plan."""
        return {c.host: _why(c, self.timeout_ms) for c in self.checks if c.outcome not in (PASSED, STOPPED)}


def window(environ: Mapping[str, str]) -> int:
    """Return how many hosts are checked at once: ``POPRUN_SSH_FANOUT`` when valid, else the ssh fan-out's default."""
    from poprun.backends.ssh.fanout import default_window
    from poprun.backends.ssh.fanout import window as fanout

    try:
        return fanout(environ)
    except ValueError:  # the ssh backend says so at its launch; here, the default
        return default_window()


def check_hosts(backend: object, plan: LaunchPlan, hosts: Sequence[str], *, environ: Mapping[str, str],
                emit: Callable[[HealthChecked], None] | None = None,
                stop: threading.Event | None = None) -> HealthChecks:
    """
    Run the plan's health check on each of ``hosts`` (duplicates once), in parallel; return how each went.

    ``environ`` is the launching environment (what ``run_on_host`` is given); ``emit`` gets one
    :class:`~poprun.core.events.HealthChecked` per host as its check ends (from a worker thread:
    it must return quickly); ``stop``, once set, ends every check still running (see the module).
    Without a health check in the plan, returns an empty :class:`HealthChecks` at once.
    """
    command = plan.membership.health_check
    timeout_ms = plan.membership.health_check_timeout_ms
    if not command:
        return HealthChecks(timeout_ms=timeout_ms)
    order = list(dict.fromkeys(hosts))
    if not order:
        return HealthChecks(timeout_ms=timeout_ms)
    results: dict[str, HealthCheck] = {}
    cancel, lock, done = Scope(), threading.Lock(), threading.Event()
    slots = threading.BoundedSemaphore(max(1, min(window(environ), len(order))))

    def one(host: str) -> None:
        try:
            check = _check(backend, host, command, timeout_ms / 1000, environ=environ, cancel=cancel,
                           mask=plan.mask)
        finally:
            slots.release()
        with lock:
            results[host] = check
            finished = len(results) == len(order)
        if emit is not None and check.outcome != STOPPED:
            emit(HealthChecked(host=host, ok=check.ok, outcome=check.outcome, status=check.status, ms=check.ms,
                               tail=check.tail, reason=check.reason))
        if finished:
            done.set()

    threads = _start(order, one, slots, stop)
    stopped = _await(done, stop, cancel, threads)
    with lock:
        checks = tuple(results.get(h) or HealthCheck(host=h, outcome=STOPPED) for h in order)
    return HealthChecks(checks=checks, timeout_ms=timeout_ms, stopped=stopped)


def _start(order: Sequence[str], one: Callable[[str], None], slots: threading.BoundedSemaphore,
           stop: threading.Event | None) -> list[threading.Thread]:
    """Start a thread per host, at most ``slots`` at once (none more once ``stop`` is set); return them."""
    threads: list[threading.Thread] = []
    for host in order:
        while not slots.acquire(timeout=0.1):
            if stop is not None and stop.is_set():
                return threads
        if stop is not None and stop.is_set():
            slots.release()
            return threads
        thread = spawn(one, args=(host,), name=f"poprun-health-{host}")
        threads.append(thread)
    return threads


def _await(done: threading.Event, stop: threading.Event | None, cancel: Scope,
           threads: Sequence[threading.Thread]) -> bool:
    """Wait for every check, or for ``stop``: then cancel those running and wait for them to end; return whether stopped."""
    while not done.wait(0.1):
        if stop is not None and stop.is_set():
            cancel.cancel()
            deadline = time.monotonic() + STOP_WAIT_S
            for thread in threads:  # each ends within the scope's grace (SIGTERM, then SIGKILL); a plugin's may not
                thread.join(max(0.0, deadline - time.monotonic()))
            return True
        if threads and not any(t.is_alive() for t in threads) and not done.is_set():
            return False  # every started thread ended, but _start stopped starting them (stop): the rest are stopped
    return False


def _check(backend: object, host: str, command: str, timeout_s: float, *, environ: Mapping[str, str],
           cancel: Scope, mask: tuple[str, ...]) -> HealthCheck:
    """Run the check on ``host`` through ``backend`` within ``cancel``; return how it went (never raises for the host)."""
    from poprun.apply.hostrun import run_script

    begin_mark, status_mark = secrets.token_hex(8), secrets.token_hex(8)
    script = host_script(command, timeout_s, begin=begin_mark, end=status_mark, mark=secrets.token_hex(8))
    began = time.monotonic()
    try:
        with scope(cancel):
            answer = run_script(backend, host, script, environ=environ, timeout_s=timeout_s + ANSWER_S)
    except CancelledError:
        answer = None
    except Exception as exc:  # noqa: BLE001 - a plugin's run_on_host that fails otherwise (PR461): this host's reason
        answer = " ".join(str(getattr(exc, "message", "") or exc or type(exc).__name__).split())
    ms = int((time.monotonic() - began) * 1000)
    if answer is None or cancel.cancelled:
        return HealthCheck(host=host, outcome=STOPPED, ms=ms)
    if isinstance(answer, str):
        return HealthCheck(host=host, outcome=UNREACHABLE, ms=ms, reason=printable(mask_text(answer, mask)))
    _, out = answer
    status, tail = _parse(out, begin_mark, status_mark)
    lines = _lines(tail, mask)
    if status is None:  # no answer within the deadline and the time to send it back
        return HealthCheck(host=host, outcome=TIMED_OUT, ms=ms, tail=lines)
    if status in TIMEOUT_STATUSES and ms >= timeout_s * 1000:
        return HealthCheck(host=host, outcome=TIMED_OUT, ms=ms, tail=lines)
    return HealthCheck(host=host, outcome=PASSED if status == 0 else FAILED, status=status, ms=ms, tail=lines)


# coreutils timeout's status when the deadline ended the check: 124, or 137 when the check outlived SIGTERM and
# timeout's SIGKILL a second later took timeout (its group's leader) with it
TIMEOUT_STATUSES = (124, 137)

# The host-side script: $__poprun_hk marks every process of the check (its environment), and
# __poprun_kill kills each that carries it (a few rounds: one may fork meanwhile). The heartbeat
# writes a byte a second; when it cannot (the connection is gone), it kills the check's processes and
# the script. The check runs under timeout (when the host has it) with its output through tail -c;
# once it has ended, the begin mark goes to the connection (fd 3), then the kept tail, which ends
# with the status mark and the check's status. TERM (poprun ending it) kills the check's processes too.
_SCRIPT = """\
__poprun_kill() {
  __poprun_i=0
  while [ $__poprun_i -lt 5 ]; do
    __poprun_f=; for __poprun_p in $(grep -l -s -a -F -e "__poprun_hk=$__poprun_hk" /proc/[0-9]*/environ 2>/dev/null); do
      __poprun_p=${__poprun_p#/proc/}; kill -KILL "${__poprun_p%/environ}" 2>/dev/null && __poprun_f=1; done
    [ -n "$__poprun_f" ] || return 0; __poprun_i=$((__poprun_i + 1))
  done
}
trap '__poprun_kill; exit 143' TERM
__poprun_t=; command -v timeout >/dev/null 2>&1 && __poprun_t="timeout -k 1 $__poprun_s"
exec 3>&1
{ trap '' PIPE; while printf . 2>/dev/null; do __poprun_hk=$__poprun_hk sleep 1; done; __poprun_kill; kill -TERM $$; } </dev/null &
__poprun_b=$!
{ __poprun_hk=$__poprun_hk __poprun_hc=$__poprun_hc $__poprun_t sh -c 'eval "unset __poprun_hc
$__poprun_hc"' </dev/null 2>&1 3>&-
  __poprun_r=$?
  kill -KILL $__poprun_b 2>/dev/null; __poprun_kill
  printf '\\n%s\\n' "$__poprun_m1" >&3
  printf '\\n%s %d\\n' "$__poprun_m2" "$__poprun_r"; } 3>&3 | tail -c @TAIL@ &
wait $!
__poprun_kill"""


def host_script(command: str, timeout_s: float, *, begin: str, end: str, mark: str) -> str:
    """
    Return the POSIX sh script (for ``sh -s``) that runs ``command`` as a health check, bounded by ``timeout_s``.

    ``begin`` and ``end`` are random marks (hexadecimal) poprun finds in its output: after
    ``begin`` comes the kept tail, ending with ``end`` and the status; ``mark`` is put in the
    environment of every process of the check. ``command`` travels single-quoted, as data.
    """
    seconds = f"{max(0.001, timeout_s):.3f}".rstrip("0").rstrip(".")
    head = (f"__poprun_hc={shlex.quote(command)}\n__poprun_hk={mark}\n__poprun_m1=poprun-health-{begin}\n"
            f"__poprun_m2=poprun-health-{end}\n__poprun_s={seconds}\n")
    return head + _SCRIPT.replace("@TAIL@", str(TAIL_BYTES))


def _parse(out: bytes, begin: str, end: str) -> tuple[int | None, bytes]:
    """Return the check's status (None: no answer) and its output's tail, from the host script's output ``out``."""
    start = out.find(f"\npoprun-health-{begin}\n".encode())
    if start < 0:
        return None, b""
    tail = out[start + len(begin) + len("\npoprun-health-\n"):]
    marker = f"\npoprun-health-{end} ".encode()
    at = tail.rfind(marker)
    if at < 0:
        return None, tail
    word = tail[at + len(marker):].split(b"\n", 1)[0]
    return (int(word) if word.isdigit() else None), tail[:at]


def _lines(tail: bytes, mask: tuple[str, ...]) -> tuple[str, ...]:
    """Return the last :data:`TAIL_LINES` non-empty lines of ``tail``, each masked, printable-escaped and cut."""
    text = mask_text(tail.decode(errors="replace").replace("\r\n", "\n"), mask)
    lines = [line for line in text.split("\n") if line.strip()][-TAIL_LINES:]
    return tuple(_cut(printable(line)) for line in lines)


def _cut(line: str) -> str:
    return line if len(line) <= LINE_CHARS else line[:LINE_CHARS - 3] + "..."


def _why(check: HealthCheck, timeout_ms: int) -> str:
    """Return one line: why ``check``'s host did not pass."""
    if check.outcome == UNREACHABLE:
        return f"the health check could not reach it: {check.reason}"
    if check.outcome == TIMED_OUT:
        return f"its health check timed out after {_seconds(timeout_ms)} s"
    return f"its health check failed with status {check.status}"


def _seconds(ms: int) -> str:
    return f"{ms / 1000:.3f}".rstrip("0").rstrip(".")


def health_problems(checks: HealthChecks, *, spares_left: Iterable[str] = ()) -> tuple[Diagnostic, ...]:
    """
    Return a diagnostic per host that did not pass: PR445 (failed, timed out), PR446 (unreachable).

    ``spares_left``: the spares that could still replace a host (named in the hint).

    Diagnostics: PR445 (a host failed its health check), PR446 (the check could not reach a host).
    """
    spares = ", ".join(spares_left)
    hint_spare = f"a spare ({spares}) replaces it" if spares else "give a spare with --spare-host"
    problems = []
    for check in checks.checks:
        if check.outcome in (FAILED, TIMED_OUT):
            ended = (f"timed out after {_seconds(checks.timeout_ms)} s" if check.outcome == TIMED_OUT
                     else f"exited with status {check.status}")
            shown = f"its last lines: {' | '.join(check.tail)}" if check.tail else "it printed nothing"
            problems.append(error(
                "PR445", "host failed its health check",
                detail=f"on {check.host}, the health check {ended}; {shown}",
                span=SourceSpan.environment(f"host {check.host}"),
                hint=f"fix {check.host} (run the check there by hand to see why), {hint_spare}, or allow fewer "
                     "hosts with a smaller --min-hosts"))
        elif check.outcome == UNREACHABLE:
            problems.append(error(
                "PR446", "health check could not reach a host",
                detail=f"the health check could not run on {check.host}: {check.reason}",
                span=SourceSpan.environment(f"host {check.host}"),
                hint=f"check that {check.host} is up and reachable as the backend reaches it, {hint_spare}, or "
                     "allow fewer hosts with a smaller --min-hosts"))
    return tuple(problems)

