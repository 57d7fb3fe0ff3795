"""
mpirun's settings for a launch, and its own failures told as mpirun's or a host's, not an instance's.

Layer: ``poprun.backends``; imports ``poprun.core`` and ``poprun.planner.plan`` only.

:func:`mpirun_settings` is what the mpirun backend adds to the user's mpirun arguments and
environment: ssh keepalives for the ssh clients that mpirun starts (``plm_rsh_args``, appended
to the user's), TCP keepalives for mpirun's own connections to its daemons
(``oob_tcp_keepalive_*``, unless the user set them), so that a host that stops answering is
noticed by mpirun and ssh within the host timeout (``POPRUN_HOST_TIMEOUT`` as the plan recorded
it: ``plan.backend.settings``, 15 s by default), as
it is by poprun's relay connections; and ``--output-filename`` taken out (the router writes
those files; the instances' output no longer passes through mpirun).

The other functions read mpirun's own messages: why it failed before any instance started
(:func:`startup_failure`: PR412, PR421-PR423, exit 125) and which host stopped answering during
the run (:func:`lost_hosts`, :func:`host_lost`: PR411).
"""

from __future__ import annotations

import re
import time

from poprun.core.diagnostic import Diagnostic, error
from poprun.core.span import SourceSpan

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from poprun.planner.plan import LaunchPlan

HOST_TIMEOUT_VARIABLE = "POPRUN_HOST_TIMEOUT"
DEFAULT_HOST_TIMEOUT_S = 15.0
_MCA_FLAGS = frozenset(("--mca", "-mca", "--gmca", "-gmca"))
_KEEPALIVE = ("oob_tcp_keepalive_time", "oob_tcp_keepalive_intvl", "oob_tcp_keepalive_probes")


class Settings:
    """What the backend runs mpirun with: its global arguments, variables to add, and what they imply."""

    def __init__(self, *, global_args: tuple[str, ...], env: dict[str, str], merge: bool,
                 host_timeout_s: float, ssh_args: str = "") -> None:
        self.global_args = global_args
        self.ssh_args = ssh_args  # plm_rsh_args as mpirun's ssh gets them
        self.env = env
        self.merge = merge  # --merge-stderr-to-stdout: an instance's stderr goes with its stdout
        self.host_timeout_s = host_timeout_s


def host_timeout(plan: LaunchPlan) -> float:
    """
    Return the host timeout in seconds: ``POPRUN_HOST_TIMEOUT`` as the plan recorded it, else 15.

    The solver checked it (3 to 3600 s, PR225); a plan without it (made by hand, as the
    conformance suite's) gets the default.
    """
    text = plan.backend.setting(HOST_TIMEOUT_VARIABLE)
    return float(text) if text else DEFAULT_HOST_TIMEOUT_S


def mpirun_settings(global_args: Sequence[str], environ: Mapping[str, str], *,
                    host_timeout_s: float = DEFAULT_HOST_TIMEOUT_S) -> Settings:
    """Return the settings of a launch with the user's ``global_args`` (``--mpi-global-args``), ``environ`` and host timeout."""
    timeout = host_timeout_s
    step = max(1, round(timeout / 3))
    ssh = f"-o ServerAliveInterval={step} -o ServerAliveCountMax=2 -o ConnectTimeout={max(1, round(timeout))}"
    args: list[str] = []
    given: set[str] = set()
    words = list(global_args)
    i = 0
    while i < len(words):
        word = words[i]
        if word == "--output-filename" and i + 1 < len(words):
            i += 2
            continue
        if word.startswith("--output-filename="):
            i += 1
            continue
        if word in _MCA_FLAGS and i + 2 < len(words):
            name, value = words[i + 1], words[i + 2]
            given.add(name)
            if name == "plm_rsh_args" and _is_ssh(words, environ):
                value = f"{value} {ssh}".strip()
            args += [word, name, value]
            i += 3
            continue
        args.append(word)
        i += 1
    env: dict[str, str] = {}
    if "plm_rsh_args" not in given and _is_ssh(words, environ):
        env["OMPI_MCA_plm_rsh_args"] = f"{environ.get('OMPI_MCA_plm_rsh_args', '')} {ssh}".strip()
    for name, number in zip(_KEEPALIVE, (step, step, 2), strict=True):
        if name not in given and f"OMPI_MCA_{name}" not in environ:
            env[f"OMPI_MCA_{name}"] = str(number)
    merge = any(word in ("--merge-stderr-to-stdout", "-merge-stderr-to-stdout") for word in global_args)
    given_args = [args[i + 2] for i in range(len(args) - 2) if args[i] in _MCA_FLAGS and args[i + 1] == "plm_rsh_args"]
    ssh_args = given_args[-1] if given_args else env.get("OMPI_MCA_plm_rsh_args", environ.get("OMPI_MCA_plm_rsh_args", ""))
    return Settings(global_args=tuple(args), env=env, merge=merge, host_timeout_s=timeout, ssh_args=ssh_args)


def greets(host: str, ssh_args: str, *, timeout_s: float) -> bool:
    """
    Return whether ``host``'s SSH server sends its greeting within ``timeout_s`` (where mpirun's ssh reaches it).

    No session, no login: ``ssh -G`` (mpirun's ssh options) says where the host is, and a TCP
    connection there waits for the ``SSH-`` line. A host that is hung, cut off or whose server
    died never greets; one reached through a proxy is taken as greeting (it cannot be asked so).
    """
    import shlex
    import socket
    import subprocess

    deadline = time.monotonic() + timeout_s
    try:
        done = subprocess.run(["ssh", *shlex.split(ssh_args), "-G", "--", host], capture_output=True, text=True,  # noqa: S603, S607 - ssh, as mpirun runs it
                              timeout=timeout_s, check=False, stdin=subprocess.DEVNULL)
    except (OSError, ValueError, subprocess.TimeoutExpired):
        return True
    said = dict(line.partition(" ")[::2] for line in done.stdout.splitlines())
    if done.returncode != 0 or said.get("proxycommand", "none") != "none" or said.get("proxyjump", "none") != "none":
        return True
    try:
        with socket.create_connection((said.get("hostname", host), int(said.get("port", "22"))),
                                      timeout=max(0.1, deadline - time.monotonic())) as sock:
            return sock.recv(4).startswith(b"SSH-")
    except (OSError, ValueError):
        return False


def ssh_host_named(name: str, hosts: Sequence[str], ssh_args: str) -> str:
    """
    Return the host of ``hosts`` that ssh reaches at ``name`` (an address ssh printed), else ``name``.

    Asks ``ssh -G`` (no connection is made) with mpirun's ssh options, which may name an
    ``ssh_config`` whose aliases map to addresses; 2 s at most for all.
    """
    import shlex
    import subprocess

    deadline = time.monotonic() + 2
    for host in hosts:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        try:
            done = subprocess.run(["ssh", *shlex.split(ssh_args), "-G", host], capture_output=True, text=True,  # noqa: S603, S607 - ssh, as mpirun runs it
                                  timeout=left, check=False, stdin=subprocess.DEVNULL)
        except (OSError, ValueError, subprocess.TimeoutExpired):
            break
        if f"\nhostname {name}\n" in f"\n{done.stdout}":
            return host
    return name


def _is_ssh(words: Sequence[str], environ: Mapping[str, str]) -> bool:
    """Return whether mpirun starts its daemons with ssh (its default agent), so that ssh's options apply."""
    agent = environ.get("OMPI_MCA_plm_rsh_agent", "ssh")
    for i, word in enumerate(words[:-2]):
        if word in _MCA_FLAGS and words[i + 1] in ("plm_rsh_agent", "orte_rsh_agent"):
            agent = words[i + 2]
    return "ssh" in agent.split(":")[0]


def mpirun_missing() -> Diagnostic:
    """Return PR420: there is no ``mpirun`` on PATH."""
    return error("PR420", "mpirun not found", detail="the mpirun backend needs OpenMPI's mpirun, and no directory "
                 "of PATH has one", span=SourceSpan.environment("PATH"),
                 hint="install OpenMPI (Debian: apt-get install openmpi-bin) or put its bin directory on PATH; "
                      "or use another backend (--backend local or ssh)")


_UNKNOWN = re.compile(r"mpirun: Error: (unknown option .*|.*)")
_SLOTS = re.compile(r"There are not enough slots available in the system|All nodes which are allocated for this job "
                    r"are already filled")
# ssh's own words first; then its refusals, but not mpirun's own "[HOST:PID] plm:rsh: Warning: setpgid(...) failed
# ... errno=Permission denied(13)", which says nothing about a host
_SSH = (re.compile(r"^(ssh: .*)$", re.MULTILINE),
        re.compile(r"^((?!\[[^\]]*\] plm:).*Permission denied.*|Host key verification failed.*)$", re.MULTILINE))
_DAEMONS = "ORTE was unable to reliably start one or more daemons"  # also when a daemon's ssh dies mid-run


def lost_daemon(text: str) -> bool:
    """Return whether mpirun's ``text`` says one of its daemons failed (its ssh client ended)."""
    return _DAEMONS in text


def startup_failure(text: str, code: int, plan: LaunchPlan, *, named: Callable[[str], str] | None = None) -> Diagnostic:
    """
    Return what mpirun said when it ended with ``code`` before starting any instance (``text``: its stderr).

    PR421 it refused its arguments, PR423 not enough slots, PR422 it could not start its
    daemon on a host (ssh's own words), else PR412 with mpirun's first lines. ``named(address)``
    returns the plan's host that ssh reached at an address it printed (else the address).
    """
    span = SourceSpan.environment("mpirun")
    found = _UNKNOWN.search(text)
    if found is not None:
        return error("PR421", "mpirun refused its arguments", detail=f"mpirun: {found[1].strip()}", span=span,
                     hint="check --mpi-global-args and --mpi-local-args against 'mpirun --help' "
                          "(poprun passes them to mpirun as they are)")
    slots = _SLOTS.search(text)
    if slots is not None:
        return error("PR423", "not enough slots for mpirun", detail=f"mpirun: {slots[0]}", span=span,
                     hint="poprun gives each host as many slots as it has instances; remove options of "
                          "--mpi-global-args that change the mapping (--map-by, -np, --host, --hostfile), or add "
                          "--oversubscribe")
    ssh = next((found for pattern in _SSH if (found := pattern.search(text)) is not None), None)
    if ssh is not None or _DAEMONS in text:
        line = ssh[1].strip() if ssh is not None else _DAEMONS
        host = _plan_host(_ssh_host(line), plan)
        if host is not None and named is not None and host not in plan.topology.hosts:
            host = named(host)
        return error("PR422", f"mpirun could not start on {f'host {host}' if host else 'a host'}",
                     detail=line, span=SourceSpan.environment(f"host {host}" if host else "mpirun"),
                     hint="mpirun starts its daemon on each host with ssh: check that 'ssh HOST' logs in without a "
                          "password and that OpenMPI is installed there at the same path")
    said = _first_paragraph(text) or "nothing"
    return error("PR412", "mpirun failed before starting any instance",
                 detail=f"mpirun exited with status {code} and said: {said}", span=span,
                 hint="run the command of 'poprun plan --explain' by hand to see mpirun's full message")


def _first_paragraph(text: str) -> str:
    """Return the first paragraph of mpirun's ``text`` on one line (its boxes' rules left out), at most 300 characters."""
    lines: list[str] = []
    for line in text.splitlines():
        if line.startswith("-----"):
            continue
        if not line.strip():
            if lines:
                break
            continue
        lines.append(line.strip())
    said = " ".join(lines)
    return said if len(said) <= 300 else said[:297] + "..."  # noqa: PLR2004 - one readable line


def _ssh_host(line: str) -> str | None:
    """Return the host that ssh's message ``line`` names, if it names one."""
    found = re.search(r"(?:connect to host|resolve hostname) ([^\s:]+)|^[^@\s]+@([^\s:]+): Permission", line)
    return (found[1] or found[2]) if found else None


_LOST = (
    re.compile(r"Timeout, server (\S+) not responding"),
    re.compile(r"Connection to (\S+) closed by remote host"),
    re.compile(r"Remote daemon: \[\[\d+,\d+\],\d+\] on node (\S+)"),
)


def _plan_host(name: str | None, plan: LaunchPlan) -> str | None:
    """Return the plan's host that mpirun calls ``name`` (it drops the domain of a host name), else ``name``."""
    if name is None:
        return None
    return next((h for h in plan.topology.hosts if h == name), None) or next(
        (h for h in plan.topology.hosts if h.startswith(f"{name}.")), name)


def lost_hosts(text: str, plan: LaunchPlan) -> list[tuple[str, str]]:
    """Return ``(host, how)`` for each host that ``text`` (mpirun's and ssh's messages) says stopped answering."""
    found = []
    for pattern in _LOST:
        for match in pattern.finditer(text):
            host = _plan_host(match[1].rstrip("."), plan) or match[1]
            line = text[text.rfind("\n", 0, match.start()) + 1:].split("\n", 1)[0].strip()
            found.append((host, line))
    return found


def host_lost(host: str, how: str, plan: LaunchPlan) -> Diagnostic:
    """Return PR411: ``host`` stopped answering (noticed ``how``); the launch was stopped."""
    on = [str(i.index) for i in plan.instances if i.host == host]
    instances = f"instance{'s' if len(on) > 1 else ''} {', '.join(on)}" if on else "its instances"
    return error("PR411", f"host {host} stopped answering",
                 detail=f"{how}; poprun stopped the launch ({instances} ran there)", span=SourceSpan.environment(
                     f"host {host}"),
                 hint=f"check that {host} is up and reachable from here; poprun gives up on a host that does not "
                      f"answer for {HOST_TIMEOUT_VARIABLE} seconds (15 by default)")
