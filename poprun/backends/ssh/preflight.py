"""
The ssh backend's preflight: every host is checked before anything starts, and told "G" only when all passed.

Layer: ``poprun.backends``; imports the ssh backend's :mod:`.client` and :mod:`.remote` (the
check's marks), :mod:`poprun.process.output`, ``poprun.core`` (diagnostics, events)
and ``poprun.planner.plan``.

Each instance's session first runs a check and waits for poprun's "G" (:class:`_Sessions`),
sent only when every host passed. A host whose name is unknown (PR405), that cannot be reached
(PR406), whose host key is not trusted (PR407), that refuses the key (PR408), that lacks the
working directory, the program or its interpreter (PR409), or that is a machine another host
names already (PR413) is reported, each with the seed's advice (section 2.2.1), within
:data:`PREFLIGHT_S` seconds, never a hang.
"""

from __future__ import annotations

import os
import selectors
import subprocess
import time
from collections.abc import Callable, Mapping

from poprun.backends.base import Event
from poprun.backends.ssh.client import HOST_TIMEOUT, SshClient, _send
from poprun.backends.ssh.relay import Routes
from poprun.backends.ssh.remote import _MARK, _OK
from poprun.core.diagnostic import Diagnostic, PreflightError, error
from poprun.core.events import HostChecked, HostConnected, PhaseEnded
from poprun.core.exitstatus import CANNOT_LAUNCH
from poprun.core.localhost import is_this_machine
from poprun.core.record import evolve
from poprun.core.span import SourceSpan
from poprun.planner.plan import Instance, LaunchPlan
from poprun.process.instance import helper_failed
from poprun.process.output import Router
from poprun.process.watchdog import Watchdog

PREFLIGHT_S = 4.5  # the longest the whole preflight takes (or the host timeout, when longer and set by the user)


def _diagnose(host: str, status: int, out: str, err: str, cwd: str) -> Diagnostic | None:
    """Return what the preflight's answer from ``host`` (or ssh's error) says is wrong, or None."""
    said = [line.partition(_MARK + " ")[2] for line in out.splitlines() if _MARK + " " in line]  # after a greeting too
    said = [item for item in said if not item.startswith("id ")]  # which machine answered: not a problem
    if said == ["ok"]:
        return None
    if said and said[-1] == "ok":
        what = []
        for item in said[:-1]:
            kind, _, name = item.partition(" ")
            what.append({"setsid": "'setsid' (util-linux) is not installed",
                         "timeout": "'timeout' (coreutils) is not installed",
                         "flock": "'flock' (util-linux) is not installed",
                         "cache": f"the temporary executable cache {name} exists there and is not this user's "
                                  "directory, or cannot be made",
                         "taskset": "'taskset' (util-linux), which binds the instance to its CPUs, is not installed",
                         "program": f"program '{name}' is not found",
                         "script": f"'{name}' does not exist in {cwd}"}.get(kind, item))
        return _missing(host, f"on {host}: " + "; ".join(what))
    if status == CANNOT_LAUNCH and not said:  # remote_command's exit status for a missing cwd
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


def _machine(answer: bytes) -> str:
    """
    Return which machine a check's ``answer`` came from (its boot id and network namespace), or "" when it did not say.

    The check's own line is the last of its kind (just before ``ok``): a login shell's greeting may hold the mark too.
    """
    for line in reversed(answer.decode(errors="replace").splitlines()):
        _, found, rest = line.partition(_MARK + " id ")
        parts = rest.split()
        if found and len(parts) == 2:  # noqa: PLR2004 - the boot id and the network namespace
            return " ".join(parts)
    return ""


def _one_machine(plan: LaunchPlan, machines: Mapping[str, str]) -> dict[str, Diagnostic]:
    """Return PR413 for each host that is a machine another host of the plan names already (``machines``: host -> id)."""
    first: dict[str, str] = {}
    problems = {}
    for host in dict.fromkeys(instance.host for instance in plan.instances):
        machine = machines.get(host, "")
        if not machine:
            continue
        if machine in first:
            other = first[machine]
            problems[host] = error(
                "PR413", f"hosts '{other}' and '{host}' are one machine", span=_span(host),
                detail="both answered from the same system (boot and network); their instances would share its "
                       "IPUs and local indexes as if they were on two machines",
                hint=f"name each machine once in --host (keep '{other}' or '{host}')")
        else:
            first[machine] = host
    return problems


class _Sessions:
    """
    The ssh sessions of a launch's remote instances, from their checks to the "G" that starts them.

    Each session first reads its environment (``inputs``: written here while the checks are
    read, so that a large one cannot block), prints its check and waits; :meth:`await_checks`
    reads every check (at most until the deadline) and returns the problems, one per host;
    :meth:`go` starts them all. Output read past a check (a login shell's greeting) is kept for
    the router.
    """

    def __init__(self, procs: dict[int, subprocess.Popen[bytes]], inputs: Mapping[int, bytes], *,
                 budget_s: float = PREFLIGHT_S, window: int = 0) -> None:
        self.procs, self._budget_s, self._window = procs, budget_s, window
        self.routes = Routes({}, [])  # how each host was reached (open() takes the client's)
        self.began = self.checked = time.monotonic()  # when the sessions were opened, and when every check was read
        self.early: dict[int, bytes] = {}  # stdout read with the check, that is not part of it
        self._inputs = {index: memoryview(data) for index, data in inputs.items() if data}

    def open(self, plan: LaunchPlan, commands: Mapping[int, str], *, client: SshClient, slots: Mapping[int, int],
             env: Mapping[str, str], group: int) -> None:
        """Start the session of each instance of ``commands`` (its :func:`remote_command`), in process group ``group``."""
        self.began, self.routes = time.monotonic(), client.routes
        for index, command in commands.items():
            self.procs[index] = subprocess.Popen(  # noqa: S603 - ssh with the plan's command
                client.argv(plan.instances[index].host, command, slot=slots[index]), stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, process_group=group)

    def await_checks(self, plan: LaunchPlan) -> list[Diagnostic]:
        """Return the problems the checks found, one per host (that of its first instance), in host order."""
        return list(self._problems(plan).values())

    def _problems(self, plan: LaunchPlan) -> dict[str, Diagnostic]:
        """Return the problem each host's checks found (that of its first instance), by host, in host order."""
        problems: dict[str, Diagnostic] = {}
        machines: dict[str, str] = {}  # host -> which machine answered its check
        answers, waited = self._read_checks()
        for index, answer in answers.items():
            instance = plan.instances[index]
            problem: Diagnostic | None
            if answer is None:
                problem = _unreachable(instance.host, f"connected, but its check did not answer within {waited:.3g} s")
            elif answer.endswith(_OK):
                problem = _diagnose(instance.host, 0, answer.decode(errors="replace"), "", instance.cwd)
                self.early[index] = _greeting(answer)
            else:  # the session ended before its check did: ssh failed, or the directory is missing
                problem = self._failure(instance, answer)
            if problem is not None and problem.code != "PR409" and instance.host in self.routes.via:
                relay = self.routes.via[instance.host]
                problem = evolve(problem, detail=f"{problem.detail} (from its relay {relay}; POPRUN_SSH_RELAY=off "
                                                 "connects to every host from here)")
            if problem is not None:
                problems.setdefault(instance.host, problem)
            elif answer is not None and (machine := _machine(answer)):
                machines.setdefault(instance.host, machine)
        for host, problem in _one_machine(plan, machines).items():
            problems.setdefault(host, problem)
        return problems

    def check(self, plan: LaunchPlan, *, tell: Callable[[Event], None] | None = None) -> None:
        """
        Read every check (at most until the deadline); ``tell`` hears each remote host's answer (a HostChecked event).

        Raises:
            PreflightError: naming each host that cannot run the plan, and why.
        """
        problems = self._problems(plan)
        self.checked = time.monotonic()
        if tell is not None and self.procs:
            tell(PhaseEnded(phase="preflight", ms=_ms_since(self.began)))
        if tell is not None:
            for host in dict.fromkeys(plan.instances[index].host for index in sorted(self.procs)):
                problem = problems.get(host)
                tell(HostChecked(host=host, ok=problem is None,
                                 problem=f"{problem.code}: {problem.summary}" if problem is not None else ""))
        if problems:
            raise PreflightError(list(problems.values()), hosts=list(problems))

    def _read_checks(self) -> tuple[dict[int, bytes | None], float]:
        """
        Return each session's answer (up to its check's ``ok``, to its end, or None if neither came in time), and how long it waited.

        In time: while the sessions answer, one after another, the wait goes on (every session's
        connection is up, so a late check is a busy host, or a busy launcher); it ends once no
        session has said anything for the budget, or after the budget once per window of sessions in all.
        """
        answers: dict[int, bytes] = dict.fromkeys(self.procs, b"")
        pending = set(self.procs)
        began = time.monotonic()
        windows = -(-len(self.procs) // self._window) if self._window else 1
        deadline, cap = began + self._budget_s, began + self._budget_s * max(1, windows)
        with selectors.DefaultSelector() as selector:
            for index, proc in self.procs.items():
                assert proc.stdout is not None
                selector.register(proc.stdout, selectors.EVENT_READ, index)
                if index in self._inputs and proc.stdin is not None:
                    os.set_blocking(proc.stdin.fileno(), False)
                    selector.register(proc.stdin, selectors.EVENT_WRITE, -1 - index)
            while pending and (left := min(deadline, cap) - time.monotonic()) > 0:
                for key, _ in selector.select(left):
                    if key.data < 0:
                        self._write_input(selector, key)
                        continue
                    chunk = os.read(key.fd, 65536)
                    answers[key.data] += chunk
                    deadline = time.monotonic() + self._budget_s
                    if not chunk or answers[key.data].endswith(_OK):  # nothing follows ok until "G"
                        selector.unregister(key.fileobj)
                        pending.discard(key.data)
        return ({index: None if index in pending else answer for index, answer in sorted(answers.items())},
                time.monotonic() - began)

    def _write_input(self, selector: selectors.BaseSelector, key: selectors.SelectorKey) -> None:
        """Write what the pipe takes of a session's environment; stop watching it once written or gone."""
        index = -1 - key.data
        data = self._inputs[index]
        try:
            written = os.write(key.fd, data[:65536])
        except BlockingIOError:
            return
        except OSError:  # the session is gone: its end says why
            written = len(data)
        self._inputs[index] = data[written:]
        if not self._inputs[index]:
            selector.unregister(key.fileobj)

    def _failure(self, instance: Instance, answer: bytes) -> Diagnostic | None:
        """Return why the session of ``instance`` ended early, from its status and ssh's error text."""
        proc = self.procs[instance.index]
        try:
            status = proc.wait(self._budget_s)
        except subprocess.TimeoutExpired:
            return _unreachable(instance.host, f"its session did not end within {self._budget_s:g} s")
        assert proc.stderr is not None
        err = proc.stderr.read().decode(errors="replace")
        return _diagnose(instance.host, status, answer.decode(errors="replace"), err, instance.cwd)

    def go(self, router: Router, *, tell: Callable[[Event], None] | None = None) -> None:
        """
        Pass on what the checks' answers held besides the checks, then start every instance: "G" on its input.

        ``tell`` hears that the start phase ended (from the end of the checks: this machine's
        instances were started meanwhile).
        """
        for index, early in self.early.items():
            if early:
                router.feed(index, "stdout", early)
        for proc in self.procs.values():
            _send(proc, b"G\n")
        router.started()
        if tell is not None:
            tell(PhaseEnded(phase="start", ms=_ms_since(self.checked)))


def _greeting(answer: bytes) -> bytes:
    """Return what a login shell printed around a check's lines (a greeting, even one without a newline)."""
    mark = (_MARK + " ").encode()
    kept = []
    for line in answer.splitlines(keepends=True):
        if mark in line:
            line = line.partition(mark)[0]  # noqa: PLW2901 - what came before the mark on its line
        kept.append(line)
    return b"".join(kept)


def _connect(plan: LaunchPlan, client: SshClient, connections: list[tuple[str, int]], budget_s: float, *,
             guards: tuple[Watchdog, ...], tell: Callable[[Event], None] | None = None) -> None:
    """
    Open the shared ``connections`` first, in the client's window; on any failure, close the watchdogs ``guards`` too.

    ``tell`` hears how each host connected (HostConnected: its time, attempts, whether slow) and
    the phase's end (PhaseEnded ``connect``).

    Raises:
        PreflightError: naming each host that could not be connected to, and why.
    """
    began, ahead_s, client.ahead_s = time.monotonic(), client.ahead_s, 0.0  # opened ahead: the phase's time too
    try:
        failed = client.connect(connections, timeout_s=budget_s)
    except BaseException as exc:
        for guard in guards:
            guard.close()
        if isinstance(exc, OSError):
            raise helper_failed(exc, "ssh", f"cannot start ssh: {exc.strerror or exc}") from exc
        raise
    if tell is not None:
        for host in dict.fromkeys(host for host, _ in connections):
            if (how := client.connections.get(host)) is not None:
                tell(HostConnected(host=host, ms=round(how.seconds * 1000), attempts=how.attempts, slow=how.slow))
        hosts = len({i.host for i in plan.instances if not is_this_machine(i.host)})
        through = f" through {client.routes.relay_count()} relays" if client.routes.via else ""
        tell(PhaseEnded(phase="connect", ms=_ms_since(began) + round(ahead_s * 1000),
                        detail=f"{hosts} hosts{through}, {client.window} connections at a time"))
    problems = {host: d for host, (status, err) in failed.items()
                if (d := _diagnose(host, status, "", err, plan.instances[0].cwd)) is not None}
    if problems:
        for guard in guards:
            guard.close()
        raise PreflightError(list(problems.values()), hosts=list(problems))


def _ms_since(began: float) -> int:
    return round((time.monotonic() - began) * 1000)


def preflight_budget(env: Mapping[str, str], host_timeout_s: float) -> float:
    """
    Return how long the preflight waits for every host: :data:`PREFLIGHT_S`, or the host timeout the user set if longer.

    A host on a slow link is not unreachable when the user said how long a host may take.
    """
    return max(PREFLIGHT_S, host_timeout_s) if env.get(HOST_TIMEOUT, "").strip() else PREFLIGHT_S
