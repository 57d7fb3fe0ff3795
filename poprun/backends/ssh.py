"""
The ``ssh`` backend: instances on other hosts through the OpenSSH client, those on this machine as children.

Layer: ``poprun.backends``; imports the backend modules, ``poprun.core`` (diagnostics) and
``poprun.planner.plan``; never the spec. Needs ``ssh`` here and a POSIX login shell, ``sh`` and
``setsid`` (util-linux) on the hosts.

The client runs non-interactively (``BatchMode``), with a connect timeout, and with one
multiplexed connection per host (``ControlMaster``) that the preflight opens and every
instance of that host reuses; ``POPRUN_SSH_CONFIG`` names an ``ssh_config`` file to use
(``-F``), else the user's own is. Before anything starts, every host is checked in parallel
(:func:`preflight`): a host whose name is unknown (PR405), that cannot be reached (PR406),
whose host key is not trusted (PR407), that refuses the key (PR408), or that lacks the working
directory, the program or its interpreter (PR409) is reported, each with the seed's advice
(section 2.2.1), within :data:`PREFLIGHT_S` seconds, never a hang.

Each remote instance runs in the plan's working directory (section 2.2.4: the same on every
host) with the host's login environment minus ``env.unset``, plus the forwarded variables
with their values here, plus ``env.set``: every value is single-quoted for the remote shell,
so quotes, spaces, ``$(...)``, backticks, newlines and any Unicode arrive unchanged.

Teardown. On the host, :data:`_WRAPPER` runs the program in a session of its own and reads the
ssh connection's standard input: a ``T`` line sends SIGTERM to the program's whole process
group (poprun stopping the launch gracefully), and the end of input, which comes when the ssh
client here dies (killed after the grace period, or with poprun itself, even by SIGKILL, by
the launch's watchdog), sends SIGKILL. The local ssh clients are spared SIGTERM, so that
a graceful stop reaches the remote program instead of cutting its connection: the clients live in a
process group of their own, led by a second watchdog, which gets SIGKILL but never SIGTERM.
So no remote process survives a failure, a Ctrl-C or the death of poprun.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence

from popdist.env import EXECUTABLE_CACHE_PATH
from poprun.backends.base import LaunchError, OutputSink, environment
from poprun.backends.files import private_directory, remove_directories
from poprun.backends.local import (
    CACHE_PREFIX,
    DEFAULT_GRACE_S,
    LocalLaunch,
    abandon,
    executable,
    is_this_machine,
    start_instance,
    temporary_directories,
)
from poprun.backends.output import Router
from poprun.backends.watchdog import Watchdog, WatchdogError
from poprun.core.diagnostic import Diagnostic, error
from poprun.core.span import SourceSpan
from poprun.planner.plan import Instance, LaunchPlan

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from typing import ClassVar

SSH_CONFIG = "POPRUN_SSH_CONFIG"
CONNECT_TIMEOUT_S = 3  # ssh's ConnectTimeout
PREFLIGHT_S = 4.5  # the longest the whole preflight takes: a host that has not answered by then is unreachable
CONTROL_PERSIST_S = 30  # how long a host's shared connection outlives its last use, should poprun die
_MARK = "poprun-preflight"
# Runs the program ($1...) in its own session; a "T" line on stdin stops its group with
# SIGTERM, the end of stdin kills it. Exits with the program's status (128+N: signal N).
# (`kill -TERM -PGID`, not `kill -TERM -- -PGID`: dash's kill takes no `--`.)
_WRAPPER = """\
p=$1; shift
command -v -- "$p" >/dev/null 2>&1 || { [ -x "./$p" ] && p=./$p; }
exec 3<&0
setsid -- "$p" "$@" </dev/null 3<&- &
c=$!
{ while read -r w; do [ "$w" = T ] && { kill -TERM -$c || kill -TERM $c; }; done
  kill -KILL -$c || kill -KILL $c; } <&3 3<&- >/dev/null 2>&1 &
r=$!
exec 3<&-
wait $c; s=$?
kill -KILL -$c 2>/dev/null
kill $r 2>/dev/null
exit $s"""
_INTERPRETERS = ("python", "python3", "bash", "sh", "perl")


class PreflightError(LaunchError):
    """Some hosts cannot run the plan; ``diagnostics`` says which and why, one each."""

    def __init__(self, diagnostics: Sequence[Diagnostic]) -> None:
        super().__init__(f"{len(diagnostics)} host(s) cannot run the plan: "
                         + "; ".join(d.detail for d in diagnostics), diagnostics=tuple(diagnostics))


class SshClient:
    """
    The OpenSSH client as poprun runs it: batch mode, a connect timeout, a shared connection per host.

    ``config`` is an ``ssh_config`` file (``-F``), or None for the user's own.
    """

    def __init__(self, *, config: str | None = None, ssh: str = "ssh") -> None:
        self._control = private_directory("poprun-ssh-")
        self._base = [ssh, *(["-F", config] if config else []), "-o", "BatchMode=yes",
                      "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}", "-o", "ControlMaster=auto",
                      "-o", f"ControlPath={self._control}/%C", "-o", f"ControlPersist={CONTROL_PERSIST_S}"]
        self._hosts: set[str] = set()

    def argv(self, host: str, command: str) -> list[str]:
        """Return the command line that runs ``command`` (shell text) on ``host``."""
        self._hosts.add(host)
        return [*self._base, "-T", host, "--", command]

    def close(self, *, timeout_s: float = 2.0) -> None:
        """Close every host's shared connection and remove the control directory. Idempotent."""
        procs = [subprocess.Popen([*self._base, "-O", "exit", host], stdin=subprocess.DEVNULL,  # noqa: S603
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                 for host in sorted(self._hosts)]
        self._hosts.clear()
        deadline = time.monotonic() + timeout_s
        for proc in procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        remove_directories([self._control])


def remote_command(instance: Instance, env: Mapping[str, str], *, check: str | None = None) -> str:
    """
    Return the shell text that runs ``instance`` on its host, with ``env``'s planned and forwarded values.

    ``env`` is the instance's environment as it would be here (:func:`environment`): only the
    names the plan sets or forwards are exported; the rest of the remote environment is the
    host's own. ``check``, when given, is run in place of the program (the preflight).
    """
    names = [*instance.env.forward, *(k for k, _ in instance.env.set)]
    exports = " ".join(shlex.quote(f"{k}={env[k]}") for k in dict.fromkeys(names) if k in env)
    lines = [f"cd -- {shlex.quote(instance.cwd)} || exit 125"]
    if instance.env.unset:
        lines.append("unset " + " ".join(instance.env.unset))
    if exports:
        lines.append("export " + exports)
    cache = env.get(EXECUTABLE_CACHE_PATH)
    if cache and os.path.basename(cache).startswith(CACHE_PREFIX):  # noqa: PTH119
        lines.append(f"mkdir -p -m 700 -- {shlex.quote(cache)}")
    if check is not None:
        lines.append(check)
    else:
        lines.append(f"exec sh -c {shlex.quote(_WRAPPER)} poprun-instance " + shlex.join(instance.argv))
    return "\n".join(lines)


def _check_script(instances: Sequence[Instance]) -> str:
    """Return the preflight's check of a host: setsid, and every program and script of its instances."""
    words = [f"command -v setsid >/dev/null 2>&1 || echo '{_MARK} setsid'"]
    for argv in dict.fromkeys(tuple(i.argv) for i in instances):
        if not argv:
            continue
        program = shlex.quote(argv[0])
        words.append(f"command -v -- {program} >/dev/null 2>&1 || [ -x ./{program} ] || "
                     f"echo '{_MARK} program '{program}")
        script = argv[1] if len(argv) > 1 else ""
        if os.path.basename(argv[0]).rstrip("0123456789.") in _INTERPRETERS and script and not script.startswith("-"):  # noqa: PTH119
            words.append(f"[ -e {shlex.quote(script)} ] || echo '{_MARK} script '{shlex.quote(script)}")
    words.append(f"echo '{_MARK} ok'")
    return "\n".join(words)


def preflight(client: SshClient, plan: LaunchPlan, envs: Sequence[Mapping[str, str]]) -> list[Diagnostic]:
    """
    Check every remote host of ``plan`` at once; return one diagnostic per host that cannot run it.

    A host is asked, through the connection its instances will share, to enter the working
    directory and find every program; the answer, or ssh's own error, decides. The whole check
    takes at most :data:`PREFLIGHT_S`.
    """
    by_host: dict[str, list[int]] = {}
    for instance in plan.instances:
        if not is_this_machine(instance.host):
            by_host.setdefault(instance.host, []).append(instance.index)
    procs = {}
    for host, indices in by_host.items():
        first = plan.instances[indices[0]]
        command = remote_command(first, envs[indices[0]],
                                 check=_check_script([plan.instances[i] for i in indices]))
        procs[host] = subprocess.Popen(client.argv(host, command), stdin=subprocess.DEVNULL,  # noqa: S603
                                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace")
    deadline = time.monotonic() + PREFLIGHT_S
    found = []
    for host, proc in procs.items():
        try:
            out, err = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            found.append(_unreachable(host, f"no answer within {PREFLIGHT_S:g} s"))
            continue
        problem = _diagnose(host, proc.returncode, out, err, plan.instances[by_host[host][0]].cwd)
        if problem is not None:
            found.append(problem)
    return found


def _diagnose(host: str, status: int, out: str, err: str, cwd: str) -> Diagnostic | None:
    """Return what the preflight's answer from ``host`` says is wrong, or None."""
    said = [line[len(_MARK) + 1:] for line in out.splitlines() if line.startswith(_MARK + " ")]
    if status == 0 and said[-1:] == ["ok"] and len(said) == 1:
        return None
    if status == 125 and not said:  # noqa: PLR2004 - remote_command's exit status for a missing cwd
        return _missing(host, f"the working directory {cwd} does not exist on {host}")
    if said and said[-1] == "ok":
        what = []
        for item in said[:-1]:
            kind, _, name = item.partition(" ")
            what.append({"setsid": "'setsid' (util-linux) is not installed", "program": f"program '{name}' is not found",
                         "script": f"'{name}' does not exist in {cwd}"}.get(kind, item))
        return _missing(host, f"on {host}: " + "; ".join(what))
    text = " ".join(line.strip() for line in err.splitlines() if line.strip()) or f"ssh exited with {status}"
    if "Could not resolve hostname" in text or "Name or service not known" in text:
        return error("PR405", f"host name '{host}' is unknown", detail=f"ssh found no address for '{host}'",
                     span=_span(host),
                     hint="check the host name, or give its IP address (use ifconfig on the host to find it, "
                          "or add it to /etc/hosts; seed 2.2.1)")
    if "Host key verification failed" in text or "HOST IDENTIFICATION HAS CHANGED" in text:
        return error("PR407", f"host key verification failed for '{host}'", detail=text, span=_span(host),
                     hint=f"the key of {host} is not in ~/.ssh/known_hosts; poprun runs ssh non-interactively, so "
                          f"log into it once with 'ssh {host}' to accept its key (seed 2.2.1)")
    if "Permission denied" in text:
        return error("PR408", f"permission denied by '{host}'", detail=text, span=_span(host),
                     hint=f"add this host's public key to ~/.ssh/authorized_keys on {host} (ssh-copy-id, or poprun "
                          "--distribute-ssh-key); password authentication is not supported (seed 2.2.1)")
    return _unreachable(host, text)


def _unreachable(host: str, detail: str) -> Diagnostic:
    return error("PR406", f"host '{host}' cannot be reached", detail=detail, span=_span(host),
                 hint=f"check that {host} is up, runs an SSH server and is reachable from here (try 'ssh {host}'); "
                      "with several networks, --host-subnet or --mpi-global-args picks the interface (seed 2.2.3)")


def _missing(host: str, detail: str) -> Diagnostic:
    return error("PR409", f"'{host}' cannot run the program", detail=detail, span=_span(host),
                 hint="every host needs the same file system layout: the working directory, the program and its "
                      "interpreter at the same paths (a shared file system is easiest; seed 2.2.4)")


def _span(host: str) -> SourceSpan:
    return SourceSpan.environment(f"host {host}")


class SshBackend:
    """Runs the instances of remote hosts through ssh, and those of this machine as child processes."""

    name: ClassVar[str] = "ssh"

    def __init__(self, *, grace_s: float = DEFAULT_GRACE_S) -> None:
        self.grace_s = grace_s

    def launch(self, plan: LaunchPlan, *, env_source: Mapping[str, str], sink: OutputSink) -> LocalLaunch:
        """
        Check every host, then start every instance; return without waiting.

        Raises:
            PreflightError: when any host cannot run the plan (nothing has started).
            LaunchError: when an instance on this machine cannot start.
        """
        source = dict(env_source)
        envs = [environment(i, source) for i in plan.instances]
        client = SshClient(config=source.get(SSH_CONFIG) or None)
        try:
            problems = preflight(client, plan, envs)
        except BaseException:
            client.close()
            raise
        if problems:
            client.close()
            raise PreflightError(problems)
        try:
            return self._start(plan, envs, source, client, sink)
        except BaseException:
            client.close()
            raise

    def _start(self, plan: LaunchPlan, envs: list[dict[str, str]], source: dict[str, str], client: SshClient,
               sink: OutputSink) -> LocalLaunch:
        remote = frozenset(i.index for i in plan.instances if not is_this_machine(i.host))
        router = Router(plan, sink)
        remove = temporary_directories(plan)
        try:
            watchdog = Watchdog(remove=remove, env=source)
        except WatchdogError as exc:
            router.close()
            raise LaunchError(str(exc.strerror)) from exc
        try:
            clients = Watchdog(env=source)  # the ssh clients' group: SIGKILL, never SIGTERM
        except WatchdogError as exc:
            abandon(watchdog, [], router)
            raise LaunchError(str(exc.strerror)) from exc
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for instance, env in zip(plan.instances, envs, strict=True):
                if instance.index in remote:
                    argv = client.argv(instance.host, remote_command(instance, env))
                    procs.append(subprocess.Popen(  # noqa: S603 - ssh with the plan's command
                        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=source,
                        process_group=clients.group))
                else:
                    procs.append(start_instance(instance, env, executable(instance, env), watchdog.group))
            watchdog.await_ready()
            clients.await_ready()
        except (WatchdogError, LaunchError, OSError) as exc:
            clients.close()
            abandon(watchdog, procs, router)
            if isinstance(exc, LaunchError):
                raise
            raise LaunchError(f"cannot start ssh: {exc.strerror}") from exc
        caches = sorted({e[EXECUTABLE_CACHE_PATH] for i, e in zip(plan.instances, envs, strict=True)
                         if i.index in remote and os.path.basename(e.get(EXECUTABLE_CACHE_PATH, "")).startswith(  # noqa: PTH119
                             CACHE_PREFIX) and plan.cache.remove_at_exit})
        remote_hosts = sorted({plan.instances[i].host for i in remote})

        def stop(sig: int) -> None:
            if sig == signal.SIGKILL:
                clients.signal(signal.SIGKILL)  # the remote wrappers see their input end, and kill
                return
            for index in sorted(remote):
                pipe = procs[index].stdin
                with contextlib.suppress(OSError, ValueError):
                    if pipe is not None:
                        os.set_blocking(pipe.fileno(), False)
                        os.write(pipe.fileno(), b"T\n")

        def finish() -> None:
            clients.close()
            for index in sorted(remote):
                with contextlib.suppress(OSError, ValueError):
                    if procs[index].stdin is not None:
                        procs[index].stdin.close()  # type: ignore[union-attr]
            if caches:
                _remove_remote(client, remote_hosts, caches)
            client.close()

        return LocalLaunch(plan, procs, watchdog=watchdog, router=router, sink=sink, grace_s=self.grace_s,
                           remove=remove, stop=stop, remote=remote, finish=finish)


def _remove_remote(client: SshClient, hosts: Sequence[str], paths: Sequence[str], *, timeout_s: float = 3.0) -> None:
    """Remove the temporary executable caches ``paths`` on ``hosts``, at most ``timeout_s`` long."""
    command = "rm -rf -- " + shlex.join(paths)
    procs = [subprocess.Popen(client.argv(host, command), stdin=subprocess.DEVNULL,  # noqa: S603
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for host in hosts]
    deadline = time.monotonic() + timeout_s
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
