"""
The ``ssh`` backend: instances on other hosts through the OpenSSH client, those on this machine as children.

Layer: ``poprun.backends``; imports the backend modules, ``poprun.core`` (diagnostics) and
``poprun.planner.plan``; never the spec. Needs ``ssh`` here and a POSIX login shell, ``sh`` and
``setsid`` (util-linux) on the hosts.

The client runs non-interactively (``BatchMode``), with a connect timeout, and with one
multiplexed connection per host (``ControlMaster``) that every instance of that host reuses
(:class:`SshClient`); ``POPRUN_SSH_CONFIG`` names an ``ssh_config`` file to use (``-F``), else
the user's own is. Before anything starts, every host is checked in parallel: each instance's
session first runs a check and waits for poprun's "G" (:class:`_Sessions`), sent only when
every host passed. A host whose name is unknown (PR405), that cannot be reached (PR406),
whose host key is not trusted (PR407), that refuses the key (PR408), or that lacks the working
directory, the program or its interpreter (PR409) is reported, each with the seed's advice
(section 2.2.1), within :data:`PREFLIGHT_S` seconds, never a hang. With ``--distribute-ssh-key``
the key is copied to every host first (:mod:`poprun.backends.sshkey`).

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
import selectors
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
from poprun.planner.mpicommand import bound_argv
from poprun.planner.plan import Instance, LaunchPlan

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from typing import ClassVar

SSH_CONFIG = "POPRUN_SSH_CONFIG"
CONNECT_TIMEOUT_S = 3  # ssh's ConnectTimeout
PREFLIGHT_S = 4.5  # the longest the whole preflight takes: a host that has not answered by then is unreachable
CONTROL_PERSIST_S = 30  # how long a host's shared connection outlives its last use, should poprun die
_MARK = "poprun-preflight"
_OK = f"{_MARK} ok\n".encode()  # the last line of a host's check: nothing else follows it until "G"
_ALIVE = ".alive"  # beside a temporary cache on a host: one file per instance still running there
# Waits for poprun's "G" (go: every host passed the preflight; anything else, or the end of
# stdin, and it exits 0 without starting anything), then runs the program ($1...) in its own
# session; a "T" line on stdin stops its group with SIGTERM, the end of stdin kills it. Exits
# with the program's status (128+N: signal N), after removing the temporary executable cache
# $2 if it is the last of its instances there ($POPRUN_CACHE, with a marker file per instance).
# (`kill -TERM -PGID`, not `kill -TERM -- -PGID`: dash's kill takes no `--`.)
_WRAPPER = """\
read -r go; [ "$go" = G ] || exit 0
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
    The OpenSSH client as poprun runs it: batch mode, a connect timeout, one shared connection per host.

    ``config`` is an ``ssh_config`` file (``-F``), or None for the user's own.
    """

    def __init__(self, *, config: str | None = None, ssh: str = "ssh") -> None:
        self.directory = private_directory("poprun-ssh-")  # the shared connections' sockets
        self._base = [ssh, *(["-F", config] if config else []), "-o", "BatchMode=yes",
                      "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}", "-o", f"ControlPath={self.directory}/%C"]
        self._hosts: set[str] = set()

    def connect(self, hosts: Sequence[str], *, timeout_s: float) -> dict[str, tuple[int, str]]:
        """
        Open the shared connection of every host at once; return ``{host: (ssh's status, its error text)}`` of failures.

        A connection only authenticates (``-N``: no remote command, so no login shell runs);
        it stays in the background for the sessions of the launch. A host that has not
        answered within ``timeout_s`` fails with status -1.
        """
        procs = {host: subprocess.Popen(  # noqa: S603 - ssh, options of our own
            [*self._base, "-o", "ControlMaster=yes", "-o", f"ControlPersist={CONTROL_PERSIST_S}", "-f", "-N", host],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, errors="replace")
            for host in hosts}
        self._hosts.update(hosts)
        deadline = time.monotonic() + timeout_s
        failed = {}
        for host, proc in procs.items():
            try:
                _, err = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()
                failed[host] = (-1, f"no answer within {timeout_s:g} s")
                continue
            if proc.returncode != 0:
                failed[host] = (proc.returncode, err)
        return failed

    def argv(self, host: str, command: str) -> list[str]:
        """
        Return the command line that runs ``command`` (shell text) on ``host``, through its shared connection.

        Without one yet (a host of one instance: :meth:`connect` was not worth a connection of
        its own), this session opens it and leaves it shared (``ControlMaster=auto``).
        """
        self._hosts.add(host)
        return [*self._base, "-o", "ControlMaster=auto", "-o", f"ControlPersist={CONTROL_PERSIST_S}", "-T", host,
                "--", command]

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
        remove_directories([self.directory])


def remote_command(instance: Instance, env: Mapping[str, str]) -> str:
    """
    Return the shell text that checks, then (on poprun's "G") runs ``instance`` on its host.

    ``env`` is the instance's environment as it would be here (:func:`environment`): only the
    names the plan sets or forwards are exported; the rest of the remote environment is the
    host's own. The check (:func:`_check_script`) prints what is missing, then ``ok``.
    """
    names = [*instance.env.forward, *(k for k, _ in instance.env.set)]
    exports = " ".join(shlex.quote(f"{k}={env[k]}") for k in dict.fromkeys(names) if k in env)
    lines = [f"cd -- {shlex.quote(instance.cwd)} || exit 125"]
    if instance.env.unset:
        lines.append("unset " + " ".join(instance.env.unset))
    if exports:
        lines.append("export " + exports)
    cache = env.get(EXECUTABLE_CACHE_PATH, "")
    cleanup = ":"
    if os.path.basename(cache).startswith(CACHE_PREFIX):  # noqa: PTH119 - a temporary cache: made and removed here
        cache, alive, marker = (shlex.quote(p) for p in (cache, cache + _ALIVE, f"{cache}{_ALIVE}/{instance.index}"))
        lines.append(f"mkdir -p -m 700 -- {cache} && mkdir -p -m 700 -- {alive} && : > {marker}")
        cleanup = f"rm -f -- {marker}; rmdir -- {alive} 2>/dev/null && rm -rf -- {cache}"
    lines.append(_check_script(instance))
    lines.append(f"sh -c {shlex.quote(_WRAPPER)} poprun-instance " + shlex.join(bound_argv(instance)) + "; s=$?")
    lines.append(f"{cleanup}; exit $s")
    return "\n".join(lines)


def _check_script(instance: Instance) -> str:
    """Return the check of an instance's host: setsid, its program, and the script given to an interpreter."""
    words = [f"command -v setsid >/dev/null 2>&1 || echo '{_MARK} setsid'"]
    if instance.placement.cpus:
        words.append(f"command -v taskset >/dev/null 2>&1 || echo '{_MARK} taskset'")
    argv = instance.argv
    if argv:
        program = shlex.quote(argv[0])
        words.append(f"command -v -- {program} >/dev/null 2>&1 || [ -x ./{program} ] || "
                     f"echo '{_MARK} program '{program}")
        script = argv[1] if len(argv) > 1 else ""
        if os.path.basename(argv[0]).rstrip("0123456789.") in _INTERPRETERS and script and not script.startswith("-"):  # noqa: PTH119
            words.append(f"[ -e {shlex.quote(script)} ] || echo '{_MARK} script '{shlex.quote(script)}")
    words.append(f"echo '{_MARK} ok'")
    return "\n".join(words)


def _diagnose(host: str, status: int, out: str, err: str, cwd: str) -> Diagnostic | None:
    """Return what the preflight's answer from ``host`` (or ssh's error) says is wrong, or None."""
    said = [line[len(_MARK) + 1:] for line in out.splitlines() if line.startswith(_MARK + " ")]
    if said == ["ok"]:
        return None
    if said and said[-1] == "ok":
        what = []
        for item in said[:-1]:
            kind, _, name = item.partition(" ")
            what.append({"setsid": "'setsid' (util-linux) is not installed",
                         "taskset": "'taskset' (util-linux), which binds the instance to its CPUs, is not installed",
                         "program": f"program '{name}' is not found",
                         "script": f"'{name}' does not exist in {cwd}"}.get(kind, item))
        return _missing(host, f"on {host}: " + "; ".join(what))
    if status == 125 and not said:  # noqa: PLR2004 - remote_command's exit status for a missing cwd
        return _missing(host, f"the working directory {cwd} does not exist on {host}")
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


class _Sessions:
    """
    The ssh sessions of a launch's remote instances, from their checks to the "G" that starts them.

    Each session prints its check and waits; :meth:`await_checks` reads every check (at most
    until the deadline) and returns the problems, one per host; :meth:`go` starts them all.
    Output read past a check (a login shell's greeting) is kept for the router.
    """

    def __init__(self, procs: dict[int, subprocess.Popen[bytes]]) -> None:
        self.procs = procs
        self.early: dict[int, bytes] = {}  # stdout read with the check, that is not part of it

    def await_checks(self, plan: LaunchPlan, deadline: float) -> list[Diagnostic]:
        """Return the problems the checks found, one per host (that of its first instance), in host order."""
        problems: dict[str, Diagnostic] = {}
        for index, answer in self._read_checks(deadline).items():
            instance = plan.instances[index]
            problem: Diagnostic | None
            if answer is None:
                problem = _unreachable(instance.host, f"no answer within {PREFLIGHT_S:g} s")
            elif answer.endswith(_OK):
                problem = _diagnose(instance.host, 0, answer.decode(errors="replace"), "", instance.cwd)
                self.early[index] = b"".join(line for line in answer.splitlines(keepends=True)
                                             if not line.startswith(_MARK.encode()))
            else:  # the session ended before its check did: ssh failed, or the directory is missing
                problem = self._failure(instance, answer, deadline)
            if problem is not None:
                problems.setdefault(instance.host, problem)
        return list(problems.values())

    def _read_checks(self, deadline: float) -> dict[int, bytes | None]:
        """Return each session's answer: up to its check's ``ok``, to its end, or None if neither came in time."""
        answers: dict[int, bytes] = dict.fromkeys(self.procs, b"")
        pending = set(self.procs)
        with selectors.DefaultSelector() as selector:
            for index, proc in self.procs.items():
                assert proc.stdout is not None
                selector.register(proc.stdout, selectors.EVENT_READ, index)
            while pending and (left := deadline - time.monotonic()) > 0:
                for key, _ in selector.select(left):
                    chunk = os.read(key.fd, 65536)
                    answers[key.data] += chunk
                    if not chunk or answers[key.data].endswith(_OK):  # nothing follows ok until "G"
                        selector.unregister(key.fileobj)
                        pending.discard(key.data)
        return {index: None if index in pending else answer for index, answer in sorted(answers.items())}

    def _failure(self, instance: Instance, answer: bytes, deadline: float) -> Diagnostic | None:
        """Return why the session of ``instance`` ended early, from its status and ssh's error text."""
        proc = self.procs[instance.index]
        try:
            status = proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return _unreachable(instance.host, f"no answer within {PREFLIGHT_S:g} s")
        assert proc.stderr is not None
        err = proc.stderr.read().decode(errors="replace")
        return _diagnose(instance.host, status, answer.decode(errors="replace"), err, instance.cwd)

    def go(self) -> None:
        """Start every instance: "G" on each session's input."""
        for proc in self.procs.values():
            _send(proc, b"G\n")


def _send(proc: subprocess.Popen[bytes], data: bytes) -> None:
    """Write ``data`` to ``proc``'s stdin without blocking; a gone session is no error."""
    pipe = proc.stdin
    with contextlib.suppress(OSError, ValueError):
        if pipe is not None:
            os.set_blocking(pipe.fileno(), False)
            os.write(pipe.fileno(), data)


def _shared_hosts(plan: LaunchPlan) -> list[str]:
    """
    Return the remote hosts of several instances, in plan order: those whose shared connection is opened first.

    One key exchange then serves all their sessions; a host of one instance gets its shared
    connection from its session instead (a separate connection would cost a second exchange).
    """
    counts: dict[str, int] = {}
    for instance in plan.instances:
        if not is_this_machine(instance.host):
            counts[instance.host] = counts.get(instance.host, 0) + 1
    return [host for host, count in counts.items() if count > 1]


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
        config = source.get(SSH_CONFIG) or None
        if plan.ssh_keys.enabled:
            from poprun.backends.sshkey import distribute_key

            hosts = list(dict.fromkeys(i.host for i in plan.instances if not is_this_machine(i.host)))
            distribute_key(plan.ssh_keys, hosts, env=source, config=config)
        client = SshClient(config=config)
        try:
            return self._launch(plan, envs, source, client, sink)
        except BaseException:
            client.close()
            raise

    def _launch(self, plan: LaunchPlan, envs: list[dict[str, str]], source: dict[str, str], client: SshClient,
                sink: OutputSink) -> LocalLaunch:
        deadline = time.monotonic() + PREFLIGHT_S
        failed = client.connect(_shared_hosts(plan), timeout_s=PREFLIGHT_S)
        problems = [d for host, (status, err) in failed.items()
                    if (d := _diagnose(host, status, "", err, plan.instances[0].cwd)) is not None]
        if problems:
            raise PreflightError(problems)
        remote = frozenset(i.index for i in plan.instances if not is_this_machine(i.host))
        remove = temporary_directories(plan)
        try:  # the watchdog also removes the control directory, should poprun die
            watchdog = Watchdog(remove=(*remove, client.directory), env=source)
        except WatchdogError as exc:
            raise LaunchError(str(exc.strerror)) from exc
        try:
            clients = Watchdog(env=source)  # the ssh sessions' group: SIGKILL, never SIGTERM
        except WatchdogError as exc:
            watchdog.close()
            raise LaunchError(str(exc.strerror)) from exc
        router = Router(plan, sink)
        procs: dict[int, subprocess.Popen[bytes]] = {}
        try:
            for index in sorted(remote):
                instance = plan.instances[index]
                procs[index] = subprocess.Popen(  # noqa: S603 - ssh with the plan's command
                    client.argv(instance.host, remote_command(instance, envs[index])), stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=source, process_group=clients.group)
            sessions = _Sessions(procs)
            problems = sessions.await_checks(plan, deadline)
            if problems:
                raise PreflightError(problems)
            for instance, env in zip(plan.instances, envs, strict=True):
                if instance.index not in remote:
                    procs[instance.index] = start_instance(instance, env, executable(instance, env), watchdog.group)
            watchdog.await_ready()
            clients.await_ready()
        except (WatchdogError, LaunchError, OSError) as exc:
            clients.close()
            abandon(watchdog, list(procs.values()), router)
            if isinstance(exc, LaunchError):
                raise
            raise LaunchError(f"cannot start ssh: {exc.strerror}") from exc
        ordered = [procs[i] for i in range(len(plan.instances))]
        for index, early in sessions.early.items():
            if early:
                router.feed(index, "stdout", early)
        sessions.go()

        def stop(sig: int) -> None:
            if sig == signal.SIGKILL:
                clients.signal(signal.SIGKILL)  # the remote wrappers see their input end, and kill
                return
            for index in sorted(remote):
                _send(procs[index], b"T\n")

        def finish() -> None:
            clients.close()
            for index in sorted(remote):
                with contextlib.suppress(OSError, ValueError):
                    if procs[index].stdin is not None:
                        procs[index].stdin.close()  # type: ignore[union-attr]
            client.close()

        return LocalLaunch(plan, ordered, watchdog=watchdog, router=router, sink=sink, grace_s=self.grace_s,
                           remove=remove, stop=stop, remote=remote, finish=finish)
