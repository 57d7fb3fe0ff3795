"""
The health check of a membership policy, on every host before a start (docs/membership.md).

Layer: ``poprun.apply``; imports :mod:`poprun.apply.hostrun` (a script on a host, through the
backend's ``run_on_host``: the ssh backend's own connection, srun inside an allocation, here for
local) and ``poprun.core``. Standard library otherwise.

:func:`check_hosts` runs ``plan.membership.health_check`` on each host it is given, in
parallel, each within ``plan.membership.health_check_timeout_ms``, and returns
:class:`HealthChecks`: per host whether it passed, failed (its status), timed out or could not
be reached, how long it took and the last lines of its output; each result is told as a
``health-check`` event. The apply step (:mod:`poprun.apply.members`) leaves the hosts that did
not pass out of the next attempt.

On the host, the check is what ``sh -c CMD`` would run, with its standard input empty and its
standard output and error together, in a session of its own. The command travels inside the
script, on the standard input of ``sh -s`` (never in an argv, which ``ps`` shows): the script
writes it to a file of a private temporary directory and runs ``sh FILE``. Its output goes
through ``tail -c`` (only the last :data:`KEPT` bytes are ever held, there or here). Every
process the check starts carries a random token in its environment; when the check ends, or at
its deadline, or when the script is stopped (the connection cut: SIGHUP), each process carrying
it is killed (daemons it started included, unless they cleared their environment) and the
directory is removed. Only that directory is ever removed: the one ``mktemp -d`` made.
"""

from __future__ import annotations

import os
import threading
import time

from poprun.core.diagnostic import Diagnostic, error
from poprun.core.events import HealthChecked
from poprun.core.record import record
from poprun.core.secret import printable
from poprun.core.span import SourceSpan
from poprun.process.hostscript import cancelled_by

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Mapping

    from poprun.core.events import Event
    from poprun.planner.plan import LaunchPlan

__all__ = ["KEPT", "HealthChecks", "HostHealth", "check_hosts", "host_script"]

KEPT = 4096  # bytes of a check's output kept (its last ones)
TAIL_LINES = 10  # lines of it shown and told
_MARGIN_S = 10.0  # beyond the check's deadline, for the script's own clean-up and the connection
_AT_ONCE = 16  # hosts checked at a time
_STOPPED = "not checked: poprun was stopped"
_CLEAN_UP_S = 5.0  # the longest a stop waits for the commands under way to end
_SCRIPT = r"""umask 077
tok=@TOKEN@
d=$(mktemp -d "${TMPDIR:-/tmp}/poprun-health.XXXXXX") || { echo "@MARK@ none cannot make a temporary directory"; exit 0; }
stray() {
  for f in $(grep -lsz "^POPRUN_HEALTH_TOKEN=$tok\$" /proc/[0-9]*/environ 2>/dev/null); do
    p=${f#/proc/}; p=${p%/environ}
    [ "$p" = "$$" ] || kill -9 "$p" 2>/dev/null
  done
}
trap 'stray; rm -rf "$d"; exit 129' HUP
trap 'stray; rm -rf "$d"; exit 141' PIPE
trap 'stray; rm -rf "$d"; exit 143' TERM INT
cat >"$d/check" <<'@END@'
@COMMAND@
@END@
{ POPRUN_HEALTH_TOKEN=$tok setsid -w sh "$d/check" </dev/null 2>&1; echo $? >"$d/status"; } | tail -c @KEPT@ >"$d/out" &
i=0
while [ ! -s "$d/status" ] && [ "$i" -lt @TICKS@ ]; do
  sleep 0.05; i=$((i + 1))
  [ $((i % 10)) -ne 0 ] || printf '\n'  # a closed connection ends the script here (SIGPIPE), and its trap cleans up
done
if [ -s "$d/status" ]; then how=$(cat "$d/status"); else how=timeout; fi
stray
wait
echo "@MARK@ $how"
cat "$d/out" 2>/dev/null
rm -rf "$d"
"""


@record
class HostHealth:
    """
    How the health check went on ``host``.

    ``ok``: it exited with 0 in time. Else ``status`` is its exit status, ``timed_out`` says
    it ran past the deadline (killed), or ``reason`` why it could not run there at all (the
    host could not be reached: ``status`` is None). ``tail``: the last lines of its output.
    """

    host: str
    ok: bool
    ms: int
    status: int | None = None
    timed_out: bool = False
    reason: str = ""
    tail: tuple[str, ...] = ()

    @property
    def why(self) -> str:
        """Return, in one line, why the host did not pass ("" when it did)."""
        if self.ok:
            return ""
        if self.reason:
            return f"its health check could not run ({self.reason})"
        if self.timed_out:
            return f"its health check timed out after {self.ms / 1000:g} s"
        return f"its health check failed (status {self.status})"


@record
class HealthChecks:
    """The health check's result on each host checked, in the order given."""

    hosts: tuple[HostHealth, ...]

    def failed(self) -> dict[str, str]:
        """Return the hosts that did not pass, with why (one line each), in order."""
        return {h.host: h.why for h in self.hosts if not h.ok}

    def diagnostics(self) -> dict[str, Diagnostic]:
        """Return PR445 (the check failed or timed out) or PR446 (it could not run) for each host that did not pass."""
        return {h.host: diagnostic(h) for h in self.hosts if not h.ok}


def diagnostic(health: HostHealth) -> Diagnostic:
    """Return the coded diagnostic of a host that did not pass its health check."""
    span = SourceSpan.environment(f"host {health.host}")
    if health.reason:
        return error("PR446", f"health check could not run on '{health.host}'", detail=printable(health.reason),
                     span=span, hint=f"check that {health.host} is up and reachable; a spare (--spare-host) takes "
                                     "its place, or a smaller --min-hosts lets the run go on without it")
    how = f"timed out after {health.ms / 1000:g} s" if health.timed_out else f"exited with {health.status}"
    lines = " | ".join(printable(line) for line in health.tail[-TAIL_LINES:] if line.strip())
    return error("PR445", f"host '{health.host}' failed its health check",
                 detail=f"the check {how} on {health.host}" + (f"; its last lines: {lines}" if lines else
                                                               " and printed nothing"),
                 span=span, hint=f"mend {health.host} (or the check), give a spare with --spare-host, "
                                 "or a smaller --min-hosts so that the run goes on without it")


def host_script(command: str, timeout_s: float, token: str) -> str:
    """
    Return the POSIX sh script that runs the check ``command`` on a host (see the module docstring).

    Its first line of output that holds the mark and ``token`` says how the check ended: its
    exit status, ``timeout`` or ``none`` (with why); the check's last output follows.
    """
    end = "POPRUN_HEALTH_END_" + token
    while end in command:  # the here-document's end never appears in the command
        end += "_"
    return (_SCRIPT.replace("@COMMAND@", command.rstrip("\n")).replace("@END@", end)
            .replace("@TOKEN@", token).replace("@MARK@", _mark(token)).replace("@KEPT@", str(KEPT))
            .replace("@TICKS@", str(max(1, round(timeout_s / 0.05)))))


def _mark(token: str) -> str:
    return f"POPRUN-HEALTH-{token}"


def check_hosts(backend: object, plan: LaunchPlan, hosts: Iterable[str], *, environ: Mapping[str, str],
                emit: Callable[[Event], None], stop: Callable[[], bool] = lambda: False) -> HealthChecks:
    """
    Run the plan's health check on each of ``hosts`` through ``backend``; return each host's result.

    Up to :data:`_AT_ONCE` hosts at a time, each within the plan's deadline (and a margin for the
    connection). ``stop()`` is asked while they run: once it says so, the hosts not answered yet
    are reported as not checked (a stop: the caller ends the run), and their scripts end at their
    own deadline, cleaning up. Each result is told to ``emit`` (a ``health-check`` event).
    """
    policy = plan.membership
    timeout_s = policy.health_check_timeout_ms / 1000
    names = list(dict.fromkeys(hosts))
    results: dict[str, HostHealth] = {}
    lock = threading.Lock()
    pending = list(names)

    cancel = threading.Event()

    def work() -> None:
        with cancelled_by(cancel):  # a stop ends the commands under way (their scripts clean up on the hosts)
            while not cancel.is_set():
                with lock:
                    if not pending:
                        return
                    host = pending.pop(0)
                found = _check(backend, host, policy.health_check, timeout_s, environ)
                if cancel.is_set():
                    found = HostHealth(host=host, ok=False, ms=found.ms, reason=_STOPPED)
                with lock:
                    results[host] = found

    threads = _start([threading.Thread(target=work, name="poprun-health", daemon=True)
                      for _ in range(min(_AT_ONCE, len(names)))])
    told: set[str] = set()
    while any(t.is_alive() for t in threads) and not stop():
        _tell(names, results, told, emit, lock)
        for thread in threads:
            thread.join(0.05)
    if any(t.is_alive() for t in threads):  # stopped: end the commands under way, and let them clean up
        cancel.set()
        deadline = time.monotonic() + _CLEAN_UP_S
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
    _tell(names, results, told, emit, lock, last=True)
    with lock:
        return HealthChecks(hosts=tuple(results.get(h) or HostHealth(host=h, ok=False, ms=0, reason=_STOPPED)
                                           for h in names))


def _start(threads: list[threading.Thread]) -> list[threading.Thread]:
    """Start ``threads`` with the stop signals blocked in them: they reach the main thread, whose handlers stop the run."""
    import signal

    held = signal.pthread_sigmask(signal.SIG_BLOCK, (signal.SIGINT, signal.SIGTERM, signal.SIGHUP))
    try:
        for thread in threads:
            thread.start()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
    return threads


def _tell(names: list[str], results: Mapping[str, HostHealth], told: set[str], emit: Callable[[Event], None],
          lock: threading.Lock, *, last: bool = False) -> None:
    """Tell each result not told yet, in the hosts' order (from the main thread): those before the first host still checked, or all once ``last``."""
    ready = []
    with lock:
        for host in names:
            if host not in results:
                if last:
                    continue
                break
            if host not in told:
                ready.append(results[host])
    for health in ready:
        told.add(health.host)
        emit(HealthChecked(host=health.host, ok=health.ok, status=-1 if health.status is None else health.status,
                           ms=health.ms, timed_out=health.timed_out, reason=health.reason, tail=health.tail))


def _check(backend: object, host: str, command: str, timeout_s: float, environ: Mapping[str, str]) -> HostHealth:
    """Run ``command`` on ``host``; return how it went."""
    from poprun.apply.hostrun import run_script

    token = os.urandom(8).hex()
    began = time.monotonic()
    answer = run_script(backend, host, host_script(command, timeout_s, token), environ=environ,
                        timeout_s=timeout_s + _MARGIN_S)
    ms = round((time.monotonic() - began) * 1000)
    if isinstance(answer, str):
        return HostHealth(host=host, ok=False, ms=ms, reason=answer)
    _, out = answer
    return _read(host, out, token, ms)


def _read(host: str, out: bytes, token: str, ms: int) -> HostHealth:
    """Return the result the script's output ``out`` says (its mark line, then the check's last output)."""
    mark = _mark(token).encode()
    at = out.find(mark)
    if at < 0:
        return HostHealth(host=host, ok=False, ms=ms, reason="no answer from the check's script (its connection or "
                                                             "shell ended first)")
    line, _, rest = out[at + len(mark):].partition(b"\n")
    how = line.decode(errors="replace").strip()
    tail = tuple(text for text in rest.decode(errors="replace").splitlines()[-TAIL_LINES:])
    if how.startswith("none"):
        return HostHealth(host=host, ok=False, ms=ms, reason=how[4:].strip() or "the check could not start")
    if how == "timeout":
        return HostHealth(host=host, ok=False, ms=ms, timed_out=True, tail=tail)
    status = int(how) if how.isdigit() else -1
    return HostHealth(host=host, ok=status == 0, ms=ms, status=status, tail=tail)
