"""
Reading a host's route to MASTER_ADDR: the script that asks the kernel, and its answer parsed.

Layer: ``poprun.planner``; imports ``poprun.core`` only, and ``shlex``, ``re``, ``secrets`` and
``ipaddress`` on use. Pure text: whatever runs the script (the apply step through a backend's
``run_on_host``, :func:`read_here` on this machine, a test's fake reader) hands its output to
:func:`parse`. Imported only for a plan whose instances span hosts.

How a host is read (:func:`host_script`, POSIX sh, on ``sh -s``'s standard input; nothing but
the address to resolve is in any argv, and it is quoted):

1. MASTER_ADDR is resolved on the host as its programs resolve it: an address stands, a name
   goes through ``getent ahosts`` (getaddrinfo: the order torch's connect tries), each address
   once.
2. The kernel is asked which interface it would use for the first address: ``ip -o route get
   ADDR`` (iproute2). Its answer is kept as given (``10.0.0.1 dev eth0 src 10.0.0.2 uid 0``,
   ``local 10.0.0.1 dev lo ...``, or ``RTNETLINK answers: Network is unreachable``, which the
   kernel gives for ``unreachable``, ``prohibit`` and ``blackhole`` routes and for no route).
3. Every address of every interface, with its ifindex and prefix: ``ip -o addr show``.

Without ``ip``, ``python3`` does the same with the standard library only: ``getaddrinfo``; a
UDP socket ``connect`` then ``getsockname`` (the kernel's source address for the route; no
packet is sent; ENETUNREACH and EHOSTUNREACH are "no route"); IPv4 addresses and netmasks by
``SIOCGIFADDR``/``SIOCGIFNETMASK`` on ``socket.if_nameindex()``, IPv6 ones from
``/proc/net/if_inet6``; the route's interface is the one holding the source address. Without
either, the answer says so. Every line of the answer starts with a random mark, so that what a
login shell prints (a banner) is never read as an answer.
"""

from __future__ import annotations

from poprun.core.record import record

__all__ = ["Address", "RouteAnswer", "host_script", "parse", "read_here", "valid_interface"]

MAX_ADDRESSES = 4096  # lines of ``ip -o addr`` read back at most
IFNAMSIZ = 16  # the kernel's limit on an interface name, with its NUL
LOCAL_ROUTE = "lo" + "cal"  # the kernel's route type for one of the host's own addresses (not a backend's name)


@record
class Address:
    """One address of a host's interface: ``index`` is the interface's ifindex, ``prefix`` the prefix length."""

    index: int
    interface: str
    address: str
    prefix: int


@record
class RouteAnswer:
    """
    What a host said of its route to MASTER_ADDR.

    ``targets``: MASTER_ADDR's addresses as resolved on the host (empty: it does not resolve
    there); ``route``: the kernel's answer for the first (one line, as given); ``interface`` and
    ``source``: the route's interface and source address ("" when there is no route: ``route``
    then says why); ``local``: the address is the host's own; ``addresses``: every interface's
    addresses, by ifindex; ``tool``: ``ip``, ``python3`` or ``none`` (neither is on the host).
    """

    targets: tuple[str, ...] = ()
    route: str = ""
    interface: str = ""
    source: str = ""
    local: bool = False
    addresses: tuple[Address, ...] = ()
    tool: str = "ip"

    def interface_of(self, address: str) -> str:
        """Return the interface that holds ``address`` ("" when none does)."""
        return next((a.interface for a in self.addresses if _same(a.address, address)), "")

    def subnet_of(self, interface: str, address: str) -> str:
        """Return the subnet (CIDR) of ``address`` on ``interface`` ("" when the host did not list it)."""
        import ipaddress

        for a in self.addresses:
            if a.interface == interface and _same(a.address, address):
                return str(ipaddress.ip_interface(f"{a.address}/{a.prefix}").network)
        return ""


def _same(one: str, other: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(one) == ipaddress.ip_address(other)
    except ValueError:
        return one == other


_PYTHON = r"""
import fcntl, os, socket, struct, sys
m, a = sys.argv[1], sys.argv[2]
print(m, "tool python3")
seen = []
try:
    for info in socket.getaddrinfo(a, 9, type=socket.SOCK_DGRAM):
        if info[4][0] not in seen:
            seen.append(info[4][0])
except (OSError, UnicodeError):
    pass
for t in seen:
    print(m, "target", t)
held = []
s4 = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for index, name in socket.if_nameindex():
    try:
        raw = struct.pack("256s", name.encode()[:15])
        ad = socket.inet_ntoa(fcntl.ioctl(s4.fileno(), 0x8915, raw)[20:24])
        mask = int.from_bytes(fcntl.ioctl(s4.fileno(), 0x891B, raw)[20:24], "big")
        held.append((index, name, "inet", ad, bin(mask).count("1")))
    except OSError:
        pass
try:
    with open("/proc/net/if_inet6") as f:
        for line in f:
            w = line.split()
            if len(w) == 6:
                ad = socket.inet_ntop(socket.AF_INET6, bytes.fromhex(w[0]))
                held.append((int(w[1], 16), w[5], "inet6", ad, int(w[2], 16)))
except OSError:
    pass
for index, name, kind, ad, plen in sorted(held):
    print(m, "addr", "%d: %s    %s %s/%d" % (index, name, kind, ad, plen))
if seen:
    t = seen[0]
    try:
        u = socket.socket(socket.AF_INET6 if ":" in t else socket.AF_INET, socket.SOCK_DGRAM)
        u.connect((t, 9))
        src = u.getsockname()[0]
        dev = [h[1] for h in held if h[3] == src]
        local = " ".join(["local"] * (t == src))
        print(m, "route", ("%s %s dev %s src %s" % (local, t, dev[0], src)).strip() if dev else
              "%s src %s (no interface holds it)" % (t, src))
    except OSError as e:
        print(m, "route", "RTNETLINK answers:", e.strerror)
"""


def host_script(master_addr: str, mark: str) -> str:
    """Return the POSIX sh script that reads the route to ``master_addr`` on a host; each answer line starts with ``mark``."""
    import shlex

    a, m = shlex.quote(master_addr), shlex.quote(mark)
    return f"""a={a}
m={m}
if command -v ip >/dev/null 2>&1; then
  case $a in
    *:*) t=$a ;;
    *[!0-9.]*|'') t=$(getent ahosts "$a" 2>/dev/null | awk '!seen[$1]++ {{print $1}}' | head -n 16) ;;
    *) t=$a ;;
  esac
  printf '%s tool ip\\n' "$m"
  for x in $t; do printf '%s target %s\\n' "$m" "$x"; done
  x=$(printf '%s\\n' "$t" | head -n 1)
  if [ -n "$x" ]; then ip -o route get "$x" 2>&1 | head -n 2 | sed "s/^/$m route /"; fi
  ip -o addr show 2>&1 | head -n {MAX_ADDRESSES} | sed "s/^/$m addr /"
elif command -v python3 >/dev/null 2>&1; then
  python3 - "$m" "$a" <<'NETROUTE_PY_EOF'
{_PYTHON}
NETROUTE_PY_EOF
else
  printf '%s tool none\\n' "$m"
fi
"""


def parse(output: bytes | str, mark: str) -> RouteAnswer | str:
    """Return the answer in a host's output of :func:`host_script` (lines with ``mark``), or why there is none."""
    import re

    text = output.decode("utf-8", "replace") if isinstance(output, bytes) else output
    lines = [line[len(mark) + 1:] for line in text.splitlines() if line.startswith(mark + " ")]
    if not lines:
        return "the host gave no answer"
    tool, targets, route, addresses = "", [], "", []
    for line in lines:
        kind, _, rest = line.partition(" ")
        if kind == "tool":
            tool = rest.strip()
        elif kind == "target" and rest.strip():
            targets.append(rest.strip())
        elif kind == "route" and not route:
            route = " ".join(rest.split(" \\")[0].split())  # ip's "\    cache" tail is not the route
        elif kind == "addr":
            found = re.match(r"\s*(\d+):\s+(\S+)\s+inet6?\s+([0-9A-Fa-f.:]+)/(\d+)", rest)
            if found:
                addresses.append(Address(index=int(found.group(1)), interface=found.group(2),
                                         address=found.group(3), prefix=int(found.group(4))))
    if tool == "none":
        return "neither ip (iproute2) nor python3 is on the host"
    words = route.split()
    interface = words[words.index("dev") + 1] if "dev" in words[:-1] else ""
    source = words[words.index("src") + 1] if "src" in words[:-1] else ""
    answer = RouteAnswer(targets=tuple(targets), route=route, interface=interface, source=source,
                         local=words[:1] == [LOCAL_ROUTE], addresses=tuple(sorted(addresses, key=lambda a: a.index)),
                         tool=tool or "ip")
    if answer.local and targets:  # the host's own address: the interface that holds it (not lo), when one does
        holder = answer.interface_of(targets[0])
        if holder:
            answer = RouteAnswer(targets=answer.targets, route=route, interface=holder, source=targets[0], local=True,
                                 addresses=answer.addresses, tool=answer.tool)
    return answer


def valid_interface(name: str) -> bool:
    """
    Return whether ``name`` is an interface name Gloo and NCCL can be given.

    The kernel's rules (1 to 15 bytes, not ``.`` or ``..``, no ``/``, ``:`` or whitespace), and
    no ``,`` (GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME are comma-separated lists) nor a
    leading ``^`` or ``=`` (NCCL's exclude and exact-match prefixes).
    """
    raw = name.encode("utf-8", "surrogateescape")
    return (0 < len(raw) < IFNAMSIZ and name not in (".", "..") and not any(c in name for c in "/:,\0")
            and not any(c.isspace() for c in name) and name[0] not in "^=")


def read_here(master_addr: str, *, timeout_s: float = 10.0) -> RouteAnswer | str:
    """Return this machine's answer (the script run by ``/bin/sh``), or why there is none."""
    import secrets
    import subprocess

    mark = "poprun-net-" + secrets.token_hex(6)
    try:
        proc = subprocess.Popen(["/bin/sh", "-s"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError as exc:
        return f"cannot run /bin/sh here: {exc.strerror}"
    try:
        out, _ = proc.communicate(host_script(master_addr, mark).encode(), timeout=timeout_s)
    except subprocess.TimeoutExpired:
        import contextlib
        import os
        import signal

        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)  # the script's whole session: a hung ip too
        proc.communicate()
        return f"no answer within {timeout_s:g} s"
    return parse(out, mark)
