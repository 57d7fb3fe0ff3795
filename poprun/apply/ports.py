"""
The port plan: a free MASTER_PORT on instance 0's host, chosen at apply time, and a check of one the user set.

Layer: ``poprun.apply``; imports ``poprun.backends.base`` (through :mod:`poprun.apply.hostrun`) and
``poprun.core``, ``popdist.env`` and the traits table (:mod:`poprun.planner.trait`; ``poprun.planner.plan`` for types only). What is free is read from the host itself (:data:`PORT_SCRIPT`: its
``/proc/net/tcp``, ``/proc/net/tcp6`` and ephemeral port range; no Python needed there), through
the backend's host commands, over the launch's own connection. A port is taken when any TCP
socket of the host is bound to it, in any state (listening, connected, TIME_WAIT: a restarted run
dies on EADDRINUSE otherwise). popdist's hub listens on the port after MASTER_PORT, so both must
be free. :func:`choose_port` picks at random among the free ports outside the ephemeral range, so
that two runs started at once on one host get different ports; :func:`check_port` turns a port
the user set that is taken into PR440 (or PR441 when only the hub's port is). :func:`master_port`
decides an attempt's MASTER_PORT from the plan with them.

On this machine a choice reads no socket list: listing ``/proc/net/tcp`` walks the kernel's whole
socket table (milliseconds, however few sockets there are), so :func:`choose_port` tries the
drawn ports by binding them instead (:func:`_bindable`: a bind without ``SO_REUSEADDR`` fails
while any TCP socket, in any state, holds the port), and lists the sockets only when no draw
is free.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping

from popdist import env as names
from poprun.apply.hostrun import run_script
from poprun.core.diagnostic import Diagnostic, DiagnosticError, error, warning
from poprun.core.localhost import is_this_machine
from poprun.core.record import record
from poprun.core.span import SourceSpan
from poprun.planner.trait import traits_of

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    import random

    from poprun.backends.base import Backend
    from poprun.planner.plan import LaunchPlan

DEFAULT_PORT = 29500  # torchrun's and poprun's MASTER_PORT when nothing better is known
PORT_TIMEOUT_S = 5.0  # how long reading a host's sockets may take
LOWEST = 20000  # chosen ports are at least this (below: services that may start later, well known or not)
HIGHEST = 65534  # ... and at most this, so that the hub's (P+1) is a port
_SECTIONS = ("@tcp", "@tcp6", "@range", "@end")
# Each socket's line cut to what parse_ports reads (the port, the state, the inode: about 30 bytes, not
# 150), so that a host with tens of thousands of sockets still fits in what a host command returns
# (MAX_OUTPUT); without awk, the lines as they are.
PORT_SCRIPT = """\
__poprun_cut() { if command -v awk >/dev/null 2>&1; then
  awk 'NR > 1 { n = split($2, a, ":"); print ":", "0:" a[n], "-", $4, "-", "-", "-", "-", "-", $10 }' "$1"
else cat "$1"; fi 2>/dev/null; }
echo @tcp; __poprun_cut /proc/net/tcp
echo @tcp6; __poprun_cut /proc/net/tcp6
echo @range; cat /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null
echo @end"""
_STATES = {"01": "ESTABLISHED", "02": "SYN_SENT", "03": "SYN_RECV", "04": "FIN_WAIT1", "05": "FIN_WAIT2",
           "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT", "09": "LAST_ACK", "0A": "LISTEN", "0B": "CLOSING"}

__all__ = ["DEFAULT_PORT", "PORT_SCRIPT", "HostPorts", "PortChoice", "check_port", "choose_port", "master_port", "parse_ports",
           "read_ports"]


@record
class HostPorts:
    """What a host said of its TCP ports: each bound port's sockets, and its ephemeral range."""

    bound: tuple[tuple[int, tuple[tuple[str, int], ...]], ...]  # (port, ((state, socket inode), ...)), by port
    ephemeral: tuple[int, int]  # the kernel's ip_local_port_range (32768-60999 when it did not say)

    def sockets(self, port: int) -> tuple[tuple[str, int], ...]:
        """Return the (state, inode) of every socket bound to ``port`` (empty: it is free)."""
        return next((found for bound, found in self.bound if bound == port), ())


@record
class PortChoice:
    """The MASTER_PORT of an attempt, and why: chosen free on the host, or kept at the default."""

    port: int
    host: str
    chosen: bool  # True: read free on ``host`` (with the hub's port after it); False: the default, unchecked
    reason: str  # one line, for explain, the run record and events ("chosen at apply time: ...")


def parse_ports(text: str) -> HostPorts:
    """
    Return the ports :data:`PORT_SCRIPT`'s output says are bound, and the ephemeral range.

    Raises:
        ValueError: when the text is not that output (its sections missing: not Linux, cut short).
    """
    lines = text.splitlines()
    if [line for line in lines if line in _SECTIONS] != list(_SECTIONS):
        msg = "not a report of /proc/net/tcp"
        raise ValueError(msg)
    bound: dict[int, list[tuple[str, int]]] = {}
    section, ephemeral = "", (32768, 60999)
    for line in lines:
        if line in _SECTIONS:
            section = line
        elif section in ("@tcp", "@tcp6"):
            _socket(line, bound)
        elif section == "@range":
            words = line.split()
            if len(words) == 2 and all(w.isdigit() for w in words):  # noqa: PLR2004 - "low high"
                ephemeral = (int(words[0]), int(words[1]))
    return HostPorts(bound=tuple((port, tuple(sorted(found))) for port, found in sorted(bound.items())),
                     ephemeral=ephemeral)


def _socket(line: str, bound: dict[int, list[tuple[str, int]]]) -> None:
    """Add the socket of one line of /proc/net/tcp (``sl local rem st ... uid timeout inode``) to ``bound``."""
    words = line.split()
    if len(words) < 10 or not words[0].endswith(":") or ":" not in words[1]:  # noqa: PLR2004 - the header, or junk
        return
    try:
        port = int(words[1].rpartition(":")[2], 16)
        inode = int(words[9])
    except ValueError:
        return
    bound.setdefault(port, []).append((_STATES.get(words[3].upper(), words[3]), inode))


def _runs_here(backend: object, host: str) -> bool:
    """Return whether ``host``'s instances run on this machine (it is this machine, or the backend's traits say all run here)."""
    return traits_of(backend).all_here or is_this_machine(host)


def _read_here() -> str:
    """Return what :data:`PORT_SCRIPT` prints, read on this machine without a shell."""
    parts = []
    for section, path in (("@tcp", "/proc/net/tcp"), ("@tcp6", "/proc/net/tcp6"),
                          ("@range", "/proc/sys/net/ipv4/ip_local_port_range")):
        parts.append(section)
        try:
            with open(path, encoding="ascii", errors="replace") as file:  # pathlib costs start-up
                parts.append(file.read().rstrip("\n"))
        except FileNotFoundError:  # no IPv6
            continue
    parts.append("@end")
    return "\n".join(parts) + "\n"


def read_ports(backend: object, host: str, *, environ: Mapping[str, str],
               timeout_s: float = PORT_TIMEOUT_S) -> HostPorts | str:
    """
    Return what ``host`` says of its TCP ports, or a one-line reason it could not be read.

    When the host's instances run on this machine (it is this machine, or the backend's traits
    say it runs every instance here: local, offline), the files are read here directly: no shell is started
    on the launch path.
    """
    if _runs_here(backend, host):
        try:
            return parse_ports(_read_here())
        except (OSError, ValueError):
            pass  # not Linux: the script says why, as for another host
    done = run_script(backend, host, PORT_SCRIPT, environ=environ, timeout_s=timeout_s)
    if isinstance(done, str):
        return done
    status, out = done
    try:
        return parse_ports(out.decode("ascii", errors="replace"))
    except ValueError:
        return f"{host} did not list its TCP ports (status {status}): not Linux, or /proc is not readable there"


_DRAWS = 64


def _urandom_below(n: int) -> int:
    """Return a random whole number from 0 to ``n`` - 1 (the system's randomness, without the random module)."""
    return int.from_bytes(os.urandom(4), "big") % n


def choose_port(backend: object, host: str, *, environ: Mapping[str, str], avoid: Collection[int] = (),
                rng: random.Random | None = None) -> PortChoice:
    """
    Return a port P of ``host`` such that P and P+1 (popdist's hub) are free there, chosen at random, or the default.

    Free: no TCP socket of the host bound to it in any state; outside the ephemeral range (a
    port there may be taken by any connection meanwhile); at least :data:`LOWEST`. Never a
    port of ``avoid`` nor one after it (their hubs), nor one whose hub is one of them.
    ``rng``: the random source (tests give a seeded one). When the host's ports cannot be read
    (a backend without host commands, for another host; a host that does not answer), or none
    is free, the result keeps :data:`DEFAULT_PORT` and its reason says why.
    """
    if rng is None and _runs_here(backend, host) and (port := _draw_here(avoid)) is not None:
        return PortChoice(port=port, host=host, chosen=True,
                          reason=f"chosen at apply time: free on {host} with popdist's hub port {port + 1}")
    ports = read_ports(backend, host, environ=environ)
    if isinstance(ports, str):
        return PortChoice(port=DEFAULT_PORT, host=host, chosen=False,
                          reason=f"the default {DEFAULT_PORT}, unchecked: {ports}")
    blocked = {p for a in avoid for p in (a, a + 1)}
    low, high = ports.ephemeral
    taken = {port for port, _ in ports.bound}

    def free(p: int) -> bool:
        return not (p in taken or p + 1 in taken or p in blocked or p + 1 in blocked or (low <= p + 1 and p <= high))

    # without a given source, a few draws of the system's randomness find one at once on any usual host (a
    # launch's start-up: no list of 45,000 ports, no random module); a host nearly full of sockets, or a
    # given source (tests), gets the whole list
    port = None if rng is not None else next(
        (p for p in (LOWEST + _urandom_below(HIGHEST + 1 - LOWEST) for _ in range(_DRAWS)) if free(p)), None)
    if port is None:
        every = [p for p in range(LOWEST, HIGHEST + 1) if free(p)]
        if not every:
            return PortChoice(port=DEFAULT_PORT, host=host, chosen=False,
                              reason=f"the default {DEFAULT_PORT}: no two free ports in a row on {host} from {LOWEST} "
                                     f"to {HIGHEST + 1} outside its ephemeral range {low}-{high}")
        port = rng.choice(every) if rng is not None else every[_urandom_below(len(every))]
    return PortChoice(port=port, host=host, chosen=True,
                      reason=f"chosen at apply time: free on {host} with popdist's hub port {port + 1}")


def _draw_here(avoid: Collection[int]) -> int | None:
    """
    Return a port P of this machine that :func:`choose_port` would take, tried by binding P and P+1; None if no draw is.

    The draws are :func:`choose_port`'s (at least :data:`LOWEST`, P+1 at most :data:`HIGHEST` + 1,
    outside the ephemeral range, away from ``avoid`` and their hubs); None too when the
    ephemeral range cannot be read (not Linux): then the sockets are listed.
    """
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range", encoding="ascii") as file:  # start-up
            words = file.read().split()
        low, high = int(words[0]), int(words[1])
    except (OSError, ValueError, IndexError):
        return None
    blocked = {p for a in avoid for p in (a, a + 1)}
    for _ in range(_DRAWS):
        p = LOWEST + _urandom_below(HIGHEST + 1 - LOWEST)
        if not (p in blocked or p + 1 in blocked or (low <= p + 1 and p <= high)) and _bindable(p) and _bindable(p + 1):
            return p
    return None


def _bindable(port: int) -> bool:
    """
    Return whether a TCP socket of this machine could bind ``port`` now: no socket holds it, in any state.

    Without ``SO_REUSEADDR`` a bind fails while any TCP socket is bound to the port (listening,
    connected, in TIME_WAIT, or only bound), on any address; the socket is dual-stack (IPv4 and
    IPv6) where IPv6 is there. ``_socket``, not ``socket``, whose import costs start-up.
    """
    import _socket

    try:
        sock = _socket.socket(_socket.AF_INET6, _socket.SOCK_STREAM)
        address: tuple[str, int] = ("::", port)
    except OSError:  # no IPv6
        sock, address = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM), ("0.0.0.0", port)  # noqa: S104
    try:
        if sock.family == _socket.AF_INET6:
            sock.setsockopt(_socket.IPPROTO_IPV6, _socket.IPV6_V6ONLY, 0)
        sock.bind(address)
    except OSError:
        return False
    finally:
        sock.close()
    return True


def check_port(backend: object, host: str, port: int, *, environ: Mapping[str, str],
               span: SourceSpan | None = None) -> Diagnostic | None:
    """
    Return PR440 when ``port`` (the user's MASTER_PORT) is taken on ``host`` (instance 0's), PR441 when only ``port + 1`` is.

    ``span``: where the user set the port (default: the environment's MASTER_PORT). None: both
    are free, or the host's ports could not be read (the launch then finds out).

    Diagnostics:
        PR440: the port is bound on the host (an error: nothing should start).
        PR441: popdist's hub port (``port + 1``) is bound (a warning: programs without popdist's hub still run).
    """
    ports = read_ports(backend, host, environ=environ)
    if isinstance(ports, str):
        return None
    where = span if span is not None else SourceSpan.environment("MASTER_PORT")
    held = ports.sockets(port)
    if held:
        return error("PR440", f"port {port} is already in use on {host}",
                     detail=f"MASTER_PORT {port}: {_holders(backend, host, held, environ=environ)}", span=where,
                     hint=f"stop what holds it, or choose another port (leave MASTER_PORT unset and poprun picks a "
                          f"free one on {host})")
    hub = ports.sockets(port + 1)
    if hub:
        return warning("PR441", f"popdist's hub port {port + 1} is already in use on {host}",
                       detail=f"port {port + 1} (MASTER_PORT + 1): {_holders(backend, host, hub, environ=environ)}",
                       span=where,
                       hint=f"popdist's own rendezvous listens on MASTER_PORT + 1: choose a MASTER_PORT whose next "
                            f"port is free on {host}, or leave it unset and poprun picks both")
    return None


def _holders(backend: object, host: str, sockets: tuple[tuple[str, int], ...], *, environ: Mapping[str, str]) -> str:
    """Return who holds ``sockets`` on ``host``: "held by pid 1234 (python3)" when /proc tells, else their states."""
    states = ", ".join(sorted({state for state, _ in sockets}))
    inodes = sorted({inode for _, inode in sockets if inode > 0})
    pids = _owners(backend, host, inodes, environ=environ) if inodes else []
    if not pids:
        return f"a socket is bound to it ({states})"
    said = ", ".join(f"pid {pid} ({name})" if name else f"pid {pid}" for pid, name in pids[:3])
    return f"held by {said}, socket {states}"


def _owners(backend: object, host: str, inodes: list[int], *, environ: Mapping[str, str]) -> list[tuple[int, str]]:
    """Return (pid, command name) of the processes (this user's, whose fds /proc shows) holding socket ``inodes``."""
    script = _OWNERS.replace("@INODES@", " ".join(str(i) for i in inodes))  # numbers only: nothing of a user's
    done = run_script(backend, host, script, environ=environ, timeout_s=PORT_TIMEOUT_S)
    if isinstance(done, str):
        return []
    found = []
    for line in done[1].decode("ascii", errors="replace").splitlines():
        words = line.split()
        if len(words) in (2, 3) and words[0] == "pid" and words[1].isdigit():
            name = _unhex(words[2]) if len(words) == 3 else ""  # noqa: PLR2004
            found.append((int(words[1]), "".join(c if c.isprintable() else "?" for c in name.strip())))
    return found


def _unhex(text: str) -> str:
    try:
        return bytes.fromhex(text).decode(errors="replace")
    except ValueError:
        return ""


# `ls -lq` (POSIX): a link target with odd characters cannot forge a line; awk keeps the pids
# whose fds are the sockets; the command name comes as hex (od), so none can confuse this parser.
_OWNERS = """\
ls -lq /proc/[0-9]*/fd 2>/dev/null | awk -v want=" @INODES@ " '
  /^\\/proc\\/[0-9]+\\/fd:$/ { split($0, p, "/"); pid = p[3]; next }
  { n = $NF; if (n ~ /^socket:\\[[0-9]+\\]$/) { gsub(/[^0-9]/, "", n); if (pid != "" && index(want, " " n " ")) print pid } }' |
  sort -un | head -n 5 | while read -r p; do
    printf 'pid %s %s\\n' "$p" "$(od -An -v -tx1 "/proc/$p/comm" 2>/dev/null | tr -d ' \\n')"
  done"""


def master_port(backend: Backend, plan: LaunchPlan, environ: Mapping[str, str],
                 *, avoid: tuple[int, ...]) -> tuple[int, bool, bool, Diagnostic | None]:
    """
    Return an attempt's MASTER_PORT, whether it was chosen here, whether it was read free, and a warning about it.

    Chosen free on instance 0's host when the plan leaves it to the apply step, never one of
    ``avoid`` (the earlier attempts'); else the user's, checked: PR440 (raised) when it is taken.
    """
    if not plan.instances:
        return 0, False, False, None
    first = plan.instances[0]
    environ = plan.backend.with_settings(environ)  # the host commands read the plan's settings, not the shell's
    if plan.recovery.choose_port:
        _prepare(backend, plan, environ)
        choice = choose_port(backend, first.host, environ=environ, avoid=avoid)
        return choice.port, True, choice.chosen, None
    given = first.env.get(names.TORCH_MASTER_PORT)
    if given is None and names.TORCH_MASTER_PORT in first.env.forward:
        given = environ.get(names.TORCH_MASTER_PORT)
    if not given or not given.strip().isdigit() or not 0 < int(given) < 65536:  # noqa: PLR2004
        return 0, False, False, None
    _prepare(backend, plan, environ)
    problem = check_port(backend, first.host, int(given), environ=environ)
    if problem is not None and problem.is_error:
        raise DiagnosticError((problem,))
    return int(given), False, problem is None, problem


def _prepare(backend: Backend, plan: LaunchPlan, environ: Mapping[str, str]) -> None:
    """
    Let a backend that can (:class:`~poprun.backends.base.Prepares`) get ready to launch ``plan`` before instance 0's host is read.

    The ssh backend opens every host's connection then, so that the port plan's is one of them,
    not one opened alone before the others.
    """
    prepare = getattr(backend, "prepare", None)
    if callable(prepare) and not is_this_machine(plan.instances[0].host):
        prepare(plan, environ=environ)
