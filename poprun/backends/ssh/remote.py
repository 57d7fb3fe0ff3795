"""
The ssh backend's host-side shell scripts, as text: what each remote session runs, and what it reads first.

Layer: ``poprun.backends``; imports ``poprun.core`` (``launch_error``, the exit statuses),
:func:`poprun.process.instance.bound_argv`, ``poprun.planner.plan`` and the client's
default host timeout; nothing here starts a process: given an instance, these functions return
the exact text (``tests/unit/test_ssh_remote.py``).

Teardown. On the host, :data:`_WRAPPER` runs the program in a session of its own and reads the
ssh connection's standard input: a ``T`` line sends SIGTERM to the program's whole process
group (poprun stopping the launch gracefully), and the end of input, which comes when the ssh
client here dies (killed after the grace period, or with poprun itself, even by SIGKILL, by
the launch's watchdog), sends SIGKILL.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
from collections.abc import Mapping, Sequence

from popdist.env import EXECUTABLE_CACHE_PATH, PROGRESS
from poprun.backends.ssh.client import DEFAULT_HOST_TIMEOUT_S
from poprun.core.diagnostic import launch_error
from poprun.core.exitstatus import CANNOT_LAUNCH
from poprun.core.span import SourceSpan
from poprun.planner.plan import Instance
from poprun.process.instance import bound_argv

_MARK = "poprun-preflight"
_OK = f"{_MARK} ok\n".encode()  # the last line of a host's check: nothing else follows it until "G"
_MADE = ".poprun-made"  # in a temporary cache made on a host: the record that this poprun made it (holds _TOKEN)
_TOKEN = os.urandom(8).hex()  # this poprun's own: a cache is removed on a host only when its _MADE holds it
_LOCK = ".poprun-lock"  # ... and the file each instance there holds a shared lock on while it runs
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")  # a POSIX variable name: the only kind that reaches a shell
# The scripts below name their own variables __poprun_*: they run with the instance's exported
# variables, whose names are the user's, and must neither read nor change any of those.
#
# The wrapper waits for poprun's "G" (go: every host passed the preflight; anything else, or the
# end of stdin, and it exits 0 without starting anything), then runs the program ($4...) in its
# own session. Then it reads poprun's lines: "T" stops the program's group with SIGTERM, "S" and
# "C" stop and continue it (Ctrl-Z and fg: SIGSTOP, since a SIGTSTP to the program's session of
# its own, an orphaned process group, is discarded by the kernel), "N" and a number sends that
# signal to the group (a forwarded one: --signal's), "H" is poprun's heartbeat; the end of stdin, or no
# line for $1 seconds while not stopped (the link to poprun is down: poprun sends "H" three
# times in that time), kills the group. Exits with the program's status (128+N: signal N).
# (`kill -TERM -PGID`, not `kill -TERM -- -PGID`: dash's kill takes no `--`.)
# With a directory $2 (not "-"), the program reads a FIFO made in it, which poprun's second
# session for the instance (:data:`_STDIN`) fills with poprun's own standard input; the wrapper
# made the directory (it fails if the directory exists), so it removes it at the end.
# With a temporary cache $3 that this poprun made on the host (its own directory, whose _MADE
# holds this poprun's _TOKEN: a record, not a name), the wrapper
# holds a shared lock on its _LOCK while the program runs, and at the end the one that gets the
# lock alone removes the cache: the last instance of the host to end, or any, when none started.
_WRAPPER = f"""\
__poprun_k=$3
__poprun_made() {{
  [ "$__poprun_k" != - ] && [ -d "$__poprun_k" ] && [ ! -h "$__poprun_k" ] && [ -O "$__poprun_k" ] &&
    [ "$(cat -- "$__poprun_k/{_MADE}" 2>/dev/null)" = {_TOKEN} ]
}}
__poprun_done() {{
  __poprun_made || return 0
  (command exec 9<"$__poprun_k/{_LOCK}" && flock -n -x 9 && rm -rf -- "$__poprun_k") 2>/dev/null
  return 0
}}
IFS= read -r __poprun_go; [ "$__poprun_go" = G ] || {{ __poprun_done; exit 0; }}
__poprun_t=$1; __poprun_f=$2; __poprun_p=$4; shift 4
command -v -- "$__poprun_p" >/dev/null 2>&1 || {{ [ -x "./$__poprun_p" ] && __poprun_p=./$__poprun_p; }}
__poprun_made && command exec 9<"$__poprun_k/{_LOCK}" && flock -s 9
exec 3<&0
if [ "$__poprun_f" = - ]; then setsid -- "$__poprun_p" "$@" </dev/null 3<&- 9<&- &
else mkdir -m 700 -- "$__poprun_f" || exit {CANNOT_LAUNCH}
  mkfifo -m 600 -- "$__poprun_f/in" || {{ rm -rf -- "$__poprun_f"; exit {CANNOT_LAUNCH}; }}
  setsid -- "$__poprun_p" "$@" <"$__poprun_f/in" 3<&- 9<&- &
fi
__poprun_c=$!
{{ __poprun_z=
  while :; do
    if [ -n "$__poprun_z" ]; then IFS= read -r __poprun_w || break; __poprun_w=x$__poprun_w
    else __poprun_w=$(timeout "$__poprun_t" sh -c 'IFS= read -r w && echo "x$w"') || break; fi
    case $__poprun_w in
      xT) kill -TERM -$__poprun_c || kill -TERM $__poprun_c;;
      xS) __poprun_z=1; kill -STOP -$__poprun_c || kill -STOP $__poprun_c;;
      xC) __poprun_z=; kill -CONT -$__poprun_c || kill -CONT $__poprun_c;;
      xN[0-9]*) kill -"${{__poprun_w#xN}}" -$__poprun_c || kill -"${{__poprun_w#xN}}" $__poprun_c;;
    esac
  done
  kill -KILL -$__poprun_c || kill -KILL $__poprun_c; }} <&3 3<&- 9<&- >/dev/null 2>&1 &
__poprun_r=$!
exec 3<&- >/dev/null 2>/dev/null
wait $__poprun_c; __poprun_s=$?
kill -KILL -$__poprun_c 2>/dev/null
kill $__poprun_r 2>/dev/null
[ "$__poprun_f" = - ] || rm -rf -- "$__poprun_f"
exec 9<&-
__poprun_done
exit $__poprun_s"""
# The second session of an instance that reads poprun's standard input: once the wrapper has
# made the FIFO ($1/in, waited for 10 s at most), copy this session's input into it, only if
# the directory and the FIFO are this user's (a FIFO planted by someone else never gets a byte).
# The copy ends when the wrapper has removed the directory (its instance ended, or was killed
# for want of poprun's heartbeat): on a host cut off from poprun, its input never ends.
_STDIN = """\
__poprun_i=0
until [ -d "$1" ] && [ ! -h "$1" ] && [ -O "$1" ] && [ -p "$1/in" ] && [ ! -h "$1/in" ] && [ -O "$1/in" ]; do
  [ $__poprun_i -lt 200 ] || exit 0; sleep 0.05; __poprun_i=$((__poprun_i + 1)); done
exec 3<&0
cat <&3 > "$1/in" 3<&- &
__poprun_c=$!
exec 3<&- </dev/null
while [ -d "$1" ] && kill -0 $__poprun_c 2>/dev/null; do sleep 1; done
kill $__poprun_c 2>/dev/null
wait $__poprun_c
"""
# Reads the environment poprun sends before anything else (a count of bytes, then that many
# bytes of `export NAME='value'` lines), so that no value is ever on a command line (ps shows
# those). `head -c` reads exactly that many bytes, at once: the lines that follow are the wrapper's.
_READ_ENV = """\
IFS= read -r __poprun_n || exit 0
__poprun_e=$(head -c "$__poprun_n"; echo .) || exit 0
eval "${__poprun_e%.}"; unset __poprun_e __poprun_n"""
# A host reached through a relay sends its progress to poprun's address as the relay saw it (``__poprun_via``,
# set by the relay's command: poprun.backends.ssh.relay), not to the relay's in its own SSH_CONNECTION.
_VIA = f"""\
case ${{{PROGRESS}-}} in :*) case ${{__poprun_via-}} in '') ;;
  *:*) {PROGRESS}="[$__poprun_via]${PROGRESS}";; *) {PROGRESS}="$__poprun_via${PROGRESS}";; esac;; esac"""
_LINES = {int(signal.SIGTSTP): b"S\n", int(signal.SIGCONT): b"C\n", int(signal.SIGTERM): b"T\n"}  # stop, go on, end


def signal_line(sig: int) -> bytes:
    """Return the line that has the wrappers (:data:`_WRAPPER`) send ``sig`` to their programs: S, C, T, or N and its number."""
    return _LINES.get(sig, b"N%d\n" % sig)
_INTERPRETERS = ("python", "python3", "bash", "sh", "perl")


def remote_command(instance: Instance, *, cache: str | None = None, cache_instances: Sequence[int] = (),
                   host_timeout_s: float = DEFAULT_HOST_TIMEOUT_S, stdin_directory: str | None = None,
                   check: bool = True) -> str:
    """
    Return the shell text that checks, then (on poprun's "G") runs ``instance`` on its host.

    The text holds no value of the environment: the session reads them first from its input
    (:func:`environment_input`), so that no secret is ever on a command line. Only the names the
    plan sets or forwards are exported; the rest of the remote environment is the host's own.
    The check (:func:`_check_script`) prints what is missing, then ``ok``.

    ``cache`` is the temporary executable cache this process made (None: there is none to make
    or remove). The first instance of a host (``cache_instances``: that host's instances, the
    first of them when this is the one) makes it there if it does not exist, with a file per
    instance of the host in it, and only then is it removed, by the last instance of the host to
    end; a directory that already exists (a shared file system: the one made here) is used as it is
    and never removed there. Anything else at that path (a link, a directory of another user but
    root) fails the check: an instance never uses a cache that someone else could fill.

    ``stdin_directory``: the program reads its standard input from a FIFO that its wrapper makes
    in this new directory there, and :func:`stdin_command`'s session fills (None: /dev/null).
    Without ``check`` (an instance started again: its host passed already), the session prints
    nothing of its own and starts on "G".
    """
    lines = [_READ_ENV, f"cd -- {shlex.quote(instance.cwd)} || exit {CANNOT_LAUNCH}"]
    if dict(instance.env.set).get(PROGRESS, "").startswith(":"):  # a leaf of a relay: where its relay saw poprun
        lines.append(_VIA)
    if instance.env.unset:
        lines.append("unset " + " ".join(shlex.quote(name) for name in instance.env.unset))
    where = "-"
    if cache is not None:
        lines.append(_cache_script(cache, first=bool(cache_instances) and cache_instances[0] == instance.index))
        where = '"$__poprun_k"'
    # the check prints in a subshell that survives a closed session (poprun killed meanwhile): the
    # wrapper must still run, to see the end of its input and remove what the first instance made
    if check:
        lines.append(f"(trap '' PIPE\n{_check_script(instance)}\n)")
    lines.append(f"sh -c {shlex.quote(_WRAPPER)} poprun-instance {host_timeout_s:g} "
                 f"{shlex.quote(stdin_directory or '-')} {where} " + shlex.join(bound_argv(instance)))
    return "\n".join(lines)


def _cache_script(cache: str, *, first: bool) -> str:
    """
    Return the lines that choose the temporary cache on a host (``$__poprun_k``) and, for its first instance, make it.

    The cache is at the path made here when its parent exists there (a shared file system: the
    very directory), else under the host's /tmp with the same name; POPDIST_EXECUTABLE_CACHE_PATH
    says which. The first instance makes it, with _LOCK and _MADE (this poprun's _TOKEN) in it, unless it exists: an
    existing directory is used as it is, and never removed there, if it is this user's (or
    root's) and not a link; anything else fails the check.
    """
    parent, name = os.path.split(cache)
    path, other = shlex.quote(cache), shlex.quote(f"/tmp/{name}")  # noqa: S108
    lines = [f"if [ -d {shlex.quote(parent or '/')} ]; then __poprun_k={path}; else __poprun_k={other}; fi",
             f"export {EXECUTABLE_CACHE_PATH}=$__poprun_k"]
    if first:
        lines.append(f'if mkdir -m 700 -- "$__poprun_k" 2>/dev/null; then : > "$__poprun_k/{_LOCK}" && '
                     f'printf %s {_TOKEN} > "$__poprun_k/{_MADE}" || echo "{_MARK} cache $__poprun_k"\n'
                     'elif [ -d "$__poprun_k" ] && [ ! -h "$__poprun_k" ] && { [ -O "$__poprun_k" ] || '
                     '{ __poprun_o=$(ls -ldn -- "$__poprun_k") && set -- $__poprun_o && [ "$3" = 0 ]; }; }; then :\n'
                     f'else echo "{_MARK} cache $__poprun_k"; fi')
    return "\n".join(lines)


def stdin_command(directory: str) -> str:
    """Return the shell text of the session that copies poprun's standard input to the FIFO in ``directory``."""
    return f"sh -c {shlex.quote(_STDIN)} poprun-stdin {shlex.quote(directory)}"


def environment_input(instance: Instance, env: Mapping[str, str]) -> bytes:
    """
    Return what a session of ``instance`` reads first: its exported variables, for :data:`_READ_ENV`.

    ``env`` is the instance's environment as it would be here (:func:`environment`); every value
    is single-quoted for the remote shell, so quotes, ``$(...)``, backticks, newlines and any
    Unicode arrive unchanged.

    Raises:
        LaunchError: for a name that is not a POSIX variable name (only a hand-made plan has one).
    """
    names = [name for name in dict.fromkeys([*instance.env.forward, *(k for k, _ in instance.env.set)]) if name in env]
    bad = next((name for name in [*names, *instance.env.unset] if not _NAME.match(name)), None)
    if bad is not None:
        raise launch_error("PR433", "instance cannot start as planned",
                           detail=f"instance {instance.index}: {bad!r} is not a variable name",
                           span=SourceSpan.environment(f"instance {instance.index}"),
                           hint="a variable's name is letters, digits and underscores, not starting with a digit: "
                                "make the plan again with poprun rather than by hand")
    text = "".join(f"export {shlex.quote(f'{name}={env[name]}')}\n" for name in names).encode(errors="surrogateescape")
    return b"%d\n%s" % (len(text), text)


def _check_script(instance: Instance) -> str:
    """Return the check of an instance's host: setsid, its program, and the script given to an interpreter."""
    words = [f"command -v setsid >/dev/null 2>&1 || echo '{_MARK} setsid'",
             f"command -v flock >/dev/null 2>&1 || echo '{_MARK} flock'",
             f"command -v timeout >/dev/null 2>&1 || echo '{_MARK} timeout'"]
    if instance.placement.cpus:
        words.append(f"command -v taskset >/dev/null 2>&1 || echo '{_MARK} taskset'")
    argv = instance.argv
    if argv:
        program = shlex.quote(argv[0])
        words.append(f"command -v -- {program} >/dev/null 2>&1 || [ -x ./{program} ] || "
                     f"echo '{_MARK} program '{program}")
        script = argv[1] if len(argv) > 1 else ""
        if os.path.basename(argv[0]).rstrip("0123456789.") in _INTERPRETERS and script and not script.startswith("-"):
            words.append(f"[ -e {shlex.quote(script)} ] || echo '{_MARK} script '{shlex.quote(script)}")
    # which machine answered: its boot and its network (one of a pair of names for one machine: PR413)
    words.append(f'echo "{_MARK} id $(cat /proc/sys/kernel/random/boot_id 2>/dev/null) '
                 f'$(readlink /proc/self/ns/net 2>/dev/null)"')
    words.append(f"echo '{_MARK} ok'")
    return "\n".join(words)
