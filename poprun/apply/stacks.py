"""
Where each instance of a hung run was: every thread's Python stack, read on its host before teardown.

Layer: ``poprun.apply``; imports :mod:`poprun.apply.hostrun` (so ``poprun.backends.base``) and
``poprun.core``. On each host, through the backend's host commands (here for local and
offline), one POSIX sh script (:data:`STACKS_SCRIPT`) finds the run's processes by their
environment: this user's processes whose ``/proc/PID/environ`` holds ``POPRUN_RUN_ID=<run>``,
the instance being their ``POPDIST_INSTANCE_INDEX`` (the ssh backend's own wrapper shell is left
out). For each Python process among them (its executable's or its argv[0]'s name begins with
``python``):

1. ``py-spy dump`` (on PATH there, or beside the instance's Python: its virtual environment),
   which prints every thread's stack without stopping the program for more than an instant;
2. else, when the process's environment sets ``PYTHONFAULTHANDLER``, its core size limit is set
   to 0 (``prlimit``; checked in ``/proc/PID/limits``: no core file is left in the user's
   directory) and it gets SIGABRT: faulthandler writes every thread's traceback to the
   instance's standard error, which poprun already captures (the process then ends);
3. else a line says why no stack could be had.

Other processes of the instance are listed (pid, command name, state, kernel wait channel).
Every value read from /proc reaches this parser as hex (``od``), one record a line, so that a
process name or argv with newlines, quotes or ``$()`` cannot forge a record; the run id is
checked and quoted in the script, which travels on the shell's standard input, never in an argv.
Each host's script is bounded in time (``timeout_s``) and size; hosts are read at once.

:data:`KILL_SCRIPT` finds the processes of one instance (and one restart count of it) the same
way and kills them alone (:func:`end_instance`): a hung instance or a straggler that
``--restart-scope instance`` restarts by itself.
"""

from __future__ import annotations

import re
import shlex
import threading
from collections.abc import Mapping

from popdist import env as names
from poprun.apply.hostrun import run_script
from poprun.core.threads import start_thread

STACKS_TIMEOUT_S = 20.0  # a default for the caller: py-spy on a few processes, over a slow link
PY_SPY_S = 10  # one py-spy dump at most (a process it cannot attach to)
MAX_STACK = 65536  # bytes of one process's stack kept
FAULTHANDLER = "faulthandler: written to the instance's standard error"
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:+-]{0,127}\Z")
_NOT_INHERITED = (names.RUN_ID, names.INSTANCE_INDEX)  # the script itself must not look like an instance
_NOTES = {
    "faulthandler": FAULTHANDLER,
    "core": "no stack: PYTHONFAULTHANDLER is set, but its core size limit could not be set to 0 (prlimit missing), "
            "so it was not sent SIGABRT (a core file could be left behind)",
    "signal": "no stack: SIGABRT could not be sent to it",
    "isolated": "no stack: no py-spy, and it runs with python -I or -E, which ignores PYTHONFAULTHANDLER",
    "none": "no stack: py-spy is not installed on the host and PYTHONFAULTHANDLER is not set in the instance's "
            "environment (install py-spy there, or set PYTHONFAULTHANDLER=1)",
}
_STATES = {"R": "running", "S": "sleeping", "D": "in uninterruptible wait", "T": "stopped", "t": "traced",
           "Z": "zombie", "X": "dead", "I": "idle"}

__all__ = ["FAULTHANDLER", "KILL_SCRIPT", "STACKS_SCRIPT", "STACKS_TIMEOUT_S", "collect_stacks", "end_instance",
           "kill_script", "parse_stacks", "stacks_script"]

# The loop over this user's processes that carry the run's id (POPRUN_RUN_ID in /proc/PID/environ,
# the script itself and SKIP left out), with each one's variables in $__poprun_env: both scripts begin so.
_EACH_PROCESS = """\
for __poprun_e in $(grep -l -F -e "POPRUN_RUN_ID=$__poprun_id" /proc/[0-9]*/environ 2>/dev/null); do
  __poprun_d=${__poprun_e%/environ}; __poprun_p=${__poprun_d#/proc/}
  case $__poprun_p in ''|*[!0-9]*|"$__poprun_me"|"$__poprun_skip") continue;; esac
  [ -O "$__poprun_d" ] || continue
  __poprun_env=$(tr '\\0' '\\n' < "$__poprun_e" 2>/dev/null) || continue
  printf '%s\\n' "$__poprun_env" | grep -qxF -e "POPRUN_RUN_ID=$__poprun_id" || continue
"""

# Records, one a line: "proc PID INDEX HEX(stat) HEX(wchan)", "stack PID HEX(py-spy's dump)",
# "spyfail PID HEX(py-spy's words)", "note PID WORD" (see _NOTES), and "@done" at the end.
STACKS_SCRIPT = """\
__poprun_id=@RUN_ID@; __poprun_want=" @WANTED@ "; __poprun_me=$$; __poprun_skip=@SKIP@; __poprun_abrt=
__poprun_hex() { od -An -v -tx1 2>/dev/null | tr -d ' \\n'; }
__poprun_tmo=; command -v timeout >/dev/null 2>&1 && __poprun_tmo="timeout -s KILL @PY_SPY_S@"
""" + _EACH_PROCESS + """  __poprun_i=$(printf '%s\\n' "$__poprun_env" | sed -n 's/^POPDIST_INSTANCE_INDEX=//p' | head -n 1)
  case $__poprun_i in ''|*[!0-9]*) continue;; esac
  case $__poprun_want in *" $__poprun_i "*) ;; *) continue;; esac
  tr '\\0' '\\n' < "$__poprun_d/cmdline" 2>/dev/null | grep -qx poprun-instance && continue
  __poprun_x=$(readlink "$__poprun_d/exe" 2>/dev/null)
  __poprun_a=$(tr '\\0' '\\n' < "$__poprun_d/cmdline" 2>/dev/null | head -n 1)
  printf 'proc %s %s %s %s\\n' "$__poprun_p" "$__poprun_i" "$(head -c 1024 "$__poprun_d/stat" 2>/dev/null | __poprun_hex)" \\
    "$(head -c 256 "$__poprun_d/wchan" 2>/dev/null | __poprun_hex)"
  case "${__poprun_x##*/} ${__poprun_a##*/}" in python*|*" python"*) ;; *) continue;; esac
  __poprun_s=$(command -v py-spy 2>/dev/null)
  case $__poprun_a in */*) [ -z "$__poprun_s" ] && [ -x "${__poprun_a%/*}/py-spy" ] && __poprun_s=${__poprun_a%/*}/py-spy;; esac
  if [ -n "$__poprun_s" ]; then
    if __poprun_o=$($__poprun_tmo "$__poprun_s" dump --pid "$__poprun_p" 2>&1 </dev/null); then
      printf 'stack %s %s\\n' "$__poprun_p" "$(printf '%s\\n' "$__poprun_o" | head -c @MAX_STACK@ | __poprun_hex)"
      continue
    fi
    printf 'spyfail %s %s\\n' "$__poprun_p" "$(printf '%s\\n' "$__poprun_o" | head -c 2048 | __poprun_hex)"
  fi
  __poprun_iso=$(tr '\\0' '\\n' < "$__poprun_d/cmdline" 2>/dev/null | sed 1d | while IFS= read -r __poprun_w; do
    case $__poprun_w in -c|-m|--*) break;; -*[IE]*) echo 1; break;; -*) ;; *) break;; esac; done)
  if [ -n "$__poprun_iso" ]; then echo "note $__poprun_p isolated"
  elif printf '%s\\n' "$__poprun_env" | grep -q '^PYTHONFAULTHANDLER=.'; then
    command -v prlimit >/dev/null 2>&1 && prlimit --core=0 --pid "$__poprun_p" >/dev/null 2>&1
    if grep -q '^Max core file size  *0 ' "$__poprun_d/limits" 2>/dev/null; then
      __poprun_abrt="$__poprun_abrt $__poprun_p"; echo "note $__poprun_p faulthandler"
    else echo "note $__poprun_p core"; fi
  else echo "note $__poprun_p none"; fi
done
# every SIGABRT at once, each before any other signal: stopped, signalled, continued (the lowest pending
# signal is delivered first), so that a teardown's SIGTERM, which one dump's end may cause, comes after it
if [ -n "$__poprun_abrt" ]; then
  kill -STOP $__poprun_abrt 2>/dev/null; kill -ABRT $__poprun_abrt 2>/dev/null; kill -CONT $__poprun_abrt 2>/dev/null
fi
echo @done"""


# Ends one instance of a run alone (a hung instance or a straggler under --restart-scope instance): its processes
# on the host of the restart count judged (not a restart of it that began meanwhile), found as above (the ssh backend's wrapper shell left out, so that it tells how the instance ended),
# get SIGKILL and SIGCONT (a stopped one too). "killed PID" a line each, "@done" at the end.
KILL_SCRIPT = """\
__poprun_id=@RUN_ID@; __poprun_want=@INDEX@; __poprun_count=@COUNT@; __poprun_me=$$; __poprun_skip=@SKIP@
""" + _EACH_PROCESS + """  printf '%s\\n' "$__poprun_env" | grep -qxF -e "POPDIST_INSTANCE_INDEX=$__poprun_want" || continue
  printf '%s\\n' "$__poprun_env" | grep -qxF -e "POPRUN_RESTART_COUNT=$__poprun_count" || continue
  tr '\\0' '\\n' < "$__poprun_d/cmdline" 2>/dev/null | grep -qx poprun-instance && continue
  kill -KILL "$__poprun_p" 2>/dev/null && echo "killed $__poprun_p"
  kill -CONT "$__poprun_p" 2>/dev/null
done
echo @done"""


def kill_script(run_id: str, index: int, count: int, *, skip_pid: int = 0) -> str:
    """
    Return :data:`KILL_SCRIPT` for instance ``index`` (its restart ``count``) of run ``run_id``; ``skip_pid``: never touched.

    Raises:
        ValueError: when ``run_id`` is not a run id.
    """
    if not _RUN_ID.match(run_id):
        msg = f"{run_id!r} is not a run id"
        raise ValueError(msg)
    return (KILL_SCRIPT.replace("@RUN_ID@", shlex.quote(run_id)).replace("@INDEX@", str(int(index)))
            .replace("@COUNT@", str(int(count))).replace("@SKIP@", str(int(skip_pid))))


def end_instance(backend: object, host: str, run_id: str, index: int, count: int, *, environ: Mapping[str, str],
                 timeout_s: float = STACKS_TIMEOUT_S, skip_pid: int = 0) -> str:
    """Kill instance ``index`` (restart ``count``) of ``run_id`` on ``host`` alone (:data:`KILL_SCRIPT`); return "" or why not."""
    env = {k: v for k, v in environ.items() if k not in _NOT_INHERITED}
    answer = run_script(backend, host, kill_script(run_id, index, count, skip_pid=skip_pid), environ=env,
                        timeout_s=timeout_s)
    if isinstance(answer, str):
        return f"{host} did not answer: {answer}"
    return "" if b"@done" in answer[1] else f"{host} did not finish (status {answer[0]})"


def stacks_script(run_id: str, indices: tuple[int, ...], *, skip_pid: int = 0) -> str:
    """
    Return :data:`STACKS_SCRIPT` for run ``run_id`` and the instances ``indices`` of a host.

    ``skip_pid``: a process never touched (poprun itself, when it runs on that host).

    Raises:
        ValueError: when ``run_id`` is not a run id (letters, digits and ``._:+-``).
    """
    if not _RUN_ID.match(run_id):
        msg = f"{run_id!r} is not a run id"
        raise ValueError(msg)
    return (STACKS_SCRIPT.replace("@RUN_ID@", shlex.quote(run_id))
            .replace("@WANTED@", " ".join(str(int(i)) for i in indices)).replace("@SKIP@", str(int(skip_pid)))
            .replace("@PY_SPY_S@", str(PY_SPY_S)).replace("@MAX_STACK@", str(MAX_STACK)))


def parse_stacks(text: str) -> tuple[dict[int, list[str]], bool]:
    """
    Return the text of each instance found in :data:`STACKS_SCRIPT`'s output, and whether the output was whole.

    Lines that are not records (a login shell's greeting, a cut record) are ignored.
    """
    procs: dict[int, tuple[int, str]] = {}  # pid -> (instance, its line)
    extra: dict[int, list[str]] = {}
    done = False
    for line in text.splitlines():
        words = line.split(" ")
        kind = words[0]
        if line == "@done":
            done = True
        elif kind == "proc" and len(words) == 5 and words[1].isdigit() and words[2].isdigit():  # noqa: PLR2004
            procs[int(words[1])] = (int(words[2]), _describe(int(words[1]), _unhex(words[3]), _unhex(words[4])))
        elif kind in ("stack", "spyfail", "note") and len(words) == 3 and words[1].isdigit():  # noqa: PLR2004
            extra.setdefault(int(words[1]), []).append(_detail(kind, words[2]))
    found: dict[int, list[str]] = {}
    for pid, (index, head) in sorted(procs.items()):
        found.setdefault(index, []).append("\n".join([head, *extra.get(pid, [])]))
    return found, done


def _detail(kind: str, value: str) -> str:
    if kind == "stack":
        return _indent(_unhex(value).rstrip("\n"))
    if kind == "spyfail":
        said = " ".join(_unhex(value).split())[:300]
        return f"  py-spy failed: {said}"
    return "  " + _NOTES.get(value, f"no stack ({_printable(value)})")


def _describe(pid: int, stat: str, wchan: str) -> str:
    """Return "pid N (name), state S (sleeping), waiting in W" from /proc/PID/stat and wchan."""
    name, _, rest = stat.partition(" (")[2].rpartition(")")
    state = rest.split()[0] if rest.split() else "?"
    where = _printable(wchan.strip())
    text = f"pid {pid} ({_printable(name)}), state {state} ({_STATES.get(state, 'unknown')})"
    return f"{text}, waiting in {where}" if where and where != "0" else text


def _indent(text: str) -> str:
    return "\n".join("  " + _printable(line) for line in text.splitlines())


def _printable(text: str) -> str:
    return "".join(c if c.isprintable() else "?" for c in text)


def _unhex(text: str) -> str:
    try:
        return bytes.fromhex(text).decode(errors="replace")
    except ValueError:
        return ""


def collect_stacks(backend: object, hosts: Mapping[int, str], run_id: str, *, environ: Mapping[str, str],
                   timeout_s: float = STACKS_TIMEOUT_S, skip_pid: int = 0) -> dict[int, str]:
    """
    Return where each instance was: ``{instance index: text}``, for every index of ``hosts`` (instance -> its host).

    Each host is read at once, through the backend's host commands (see the module
    docstring), within ``timeout_s``. A host that does not answer, or an instance none of whose
    processes is found, gets a line saying so; this never raises for a host. ``skip_pid``: a
    process of this machine never touched (poprun's own; 0: none). The text of a Python
    process signalled for faulthandler says :data:`FAULTHANDLER`: its stack is in the
    instance's standard error.

    Raises:
        ValueError: when ``run_id`` is not a run id.
    """
    by_host: dict[str, list[int]] = {}
    for index, host in sorted(hosts.items()):
        by_host.setdefault(host, []).append(index)
    scripts = {host: stacks_script(run_id, tuple(indices), skip_pid=skip_pid) for host, indices in by_host.items()}
    env = {k: v for k, v in environ.items() if k not in _NOT_INHERITED}
    answers: dict[str, tuple[int, bytes] | str] = {}

    def read(host: str) -> None:
        answers[host] = run_script(backend, host, scripts[host], environ=env, timeout_s=timeout_s)

    threads = [threading.Thread(target=read, args=(host,), name=f"poprun-stacks-{n}", daemon=True)
               for n, host in enumerate(by_host)]
    for thread in threads:
        start_thread(thread)
    for thread in threads:
        thread.join(timeout_s + 5)
    result: dict[int, str] = {}
    for host, indices in by_host.items():
        result.update(_texts(host, indices, answers.get(host, f"no answer within {timeout_s:g} s")))
    return dict(sorted(result.items()))


def _texts(host: str, indices: list[int], answer: tuple[int, bytes] | str) -> dict[int, str]:
    """Return the text of each of ``indices`` from ``host``'s ``answer`` (or the reason there is none)."""
    if isinstance(answer, str):
        return dict.fromkeys(indices, f"{host} did not answer: {answer}")
    status, out = answer
    found, whole = parse_stacks(out.decode(errors="replace"))
    texts = {}
    for index in indices:
        parts = found.get(index, [])
        if not parts:
            parts = [f"no process of instance {index} found on {host} (it had ended)" if whole
                     else f"{host} did not finish listing its processes (status {status})"]
        elif not whole:
            parts.append(f"(cut short: {host} did not finish listing its processes, status {status})")
        texts[index] = "\n".join(parts)
    return texts
