"""
The network interface collectives use on each host: decided, explained, and settled at launch.

Layer: ``poprun.planner``; imports ``poprun.core``, the plan model, the solver's state and
:mod:`poprun.planner.netroute` (the reading's text and parsing); ``ipaddress`` on use. The
solver calls :func:`network` only for a plan whose instances span hosts; the apply step calls
:func:`settle` with what the hosts answered (docs/network.md).

For a plan whose instances run on more than one machine, poprun decides per host the
interface Gloo, NCCL and Open MPI's TCP transports use, and sets ``GLOO_SOCKET_IFNAME`` and
``NCCL_SOCKET_IFNAME`` in each instance's environment (its host's interface: names may differ
between hosts) and, under mpirun, ``--mca btl_tcp_if_include`` and ``--mca
oob_tcp_if_include`` (global to mpirun: the hosts' subnets in CIDR form, which hold on every
host). The sources, first first:

1. the user's: a variable given with ``-x`` (for every instance or one), an MCA parameter in
   ``--mpi-global-args``, ``-x OMPI_MCA_*`` or the launching shell's ``OMPI_MCA_*`` (an ``*_if_exclude`` too: Open MPI refuses
   include and exclude together); poprun then sets nothing for that name;
2. ``--host-subnet CIDR``: on each host, the interface whose address lies in the subnet (the
   lowest ifindex when several do: PR477 warns);
3. the route to MASTER_ADDR, read on each host: MASTER_ADDR resolved there, and the kernel's
   choice for it (:mod:`poprun.planner.netroute`). On instance 0's host MASTER_ADDR is its own
   address: the interface that holds it.

The plan reads the hosts when its context can (``Context.routes``); ``poprun plan`` never
waits on hosts, so its plan records the rule and "at launch"; the apply step reads every host
before the first start (and again for a re-planned plan) through the backend's
``run_on_host`` and records the values (:func:`settle`). Apply never re-solves.

Diagnostics: PR318 (MASTER_ADDR is a loopback
address on a plan that spans machines); at plan time with a route reader, or at launch: PR474
(no route from a host to MASTER_ADDR), PR475 (no interface in ``--host-subnet`` on a host),
PR476 (warning: a host's route could not be read; its instances get no variable), PR477 (warning:
several interfaces in the subnet),
PR478 (an interface name Gloo and NCCL cannot be given).
"""

from __future__ import annotations

from poprun.core.diagnostic import Diagnostic, error, warning
from poprun.core.record import evolve
from poprun.core.span import SourceSpan
from poprun.planner import plan as p

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from poprun.planner.netroute import RouteAnswer
    from poprun.planner.state import Solver
    from poprun.planner.trait import Traits

__all__ = ["GLOO", "MCA", "NCCL", "PREFIX", "choose", "network", "settle", "variables"]

PREFIX = "network."
GLOO, NCCL = "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"
MCA = ("oob_tcp_if_include", "btl_tcp_if_include")  # the control plane, then the data plane
_EXCLUDE = {"btl_tcp_if_include": "btl_tcp_if_exclude", "oob_tcp_if_include": "oob_tcp_if_exclude"}
_MCA_FLAGS = ("--mca", "-mca", "--gmca", "-gmca")
AT_LAUNCH = "at launch"
_LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")
SPAN = SourceSpan.derived("network")
HINT = ("give --host-subnet CIDR (the subnet the hosts share), or name the interface yourself with "
        "-x GLOO_SOCKET_IFNAME=IF -x NCCL_SOCKET_IFNAME=IF")


def network(s: Solver, instances: Sequence[p.Instance], *, traits: Traits, offline: bool,
            ) -> tuple[p.Network, dict[int, dict[str, str]]]:
    """
    Return the network record of a plan of ``instances``, and the variables each instance gets (index -> name -> value).

    Diagnostics: PR318; PR474-PR478 when the context reads the hosts (``Context.routes``).
    """
    hosts = tuple(dict.fromkeys(i.host for i in instances))
    why = _nothing_to_decide(s, hosts, traits=traits, offline=offline)
    if why:
        return p.Network(source="none", reason=why), {}
    master = instances[0].env.get("MASTER_ADDR") or ""
    user = _user_set(s, mpirun=traits.mpirun_world())
    sets = tuple(n for n in (GLOO, NCCL, *(MCA if traits.mpirun_world() else ())) if n not in user)
    subnet = _subnet(s)
    _check_loopback(s, master)
    source = "host-subnet" if subnet else "route"
    if user:
        s.decide(PREFIX + "user", ",".join(user), SourceSpan.derived(PREFIX + "user"),
                 "set by the user: poprun sets none of them")
    record = p.Network(source=source, master_addr=master, subnet=subnet, user=user, sets=sets,
                       hosts=tuple(p.HostInterface(host=h) for h in hosts))
    if not sets:
        record = evolve(record, reason="every variable and parameter is the user's: nothing to decide")
        s.decide(PREFIX + "interfaces", "the user's", SourceSpan.derived(PREFIX + "interfaces"), record.reason)
        return record, {}
    how = f"the interface with an address in {subnet} (--host-subnet)" if subnet else \
        f"the interface on the route to MASTER_ADDR {master or '(forwarded)'}"
    if s.ctx.routes is None or not master:
        record = evolve(record, reason=f"{how}, read on each host at launch")
        s.decide(PREFIX + "interfaces", AT_LAUNCH, s.origin("host_subnet") if subnet else SourceSpan.derived(
            PREFIX + "interfaces"), f"{how}: read on each host before the first start ('poprun plan' reads no host)")
        return record, {}
    answers = s.ctx.routes(hosts, master)
    settled, problems = choose(record, answers)
    s.diags.extend(problems)
    s.decide(PREFIX + "interfaces", "read", s.origin("host_subnet") if subnet else SourceSpan.derived(
        PREFIX + "interfaces"), f"{how}, read on each host while planning")
    return settled, variables(settled, instances)


def _nothing_to_decide(s: Solver, hosts: tuple[str, ...], *, traits: Traits, offline: bool) -> str:
    """Return why nothing is decided ("" when something is)."""
    if offline:
        return "offline: the instances run on this machine and talk over its loopback"
    if traits.all_here:
        return "every instance runs on this machine (its loopback carries the collectives)"
    if len(hosts) < 2:  # noqa: PLR2004 - one host
        return f"one host ({hosts[0]}): the collectives stay on it" if hosts else "no host"
    if all(h in s.ctx.local_names for h in hosts):
        return "every host is this machine: the collectives stay on it"
    return ""


def _user_set(s: Solver, *, mpirun: bool) -> tuple[str, ...]:
    """Return the variables and MCA parameters the user set (-x, --mpi-global-args): poprun sets none of them."""
    given = {v.name for v in (e.value for e in s.spec.env)} | {v.name for a in s.spec.instance_args for v in a.value.env}
    user = [n for n in (GLOO, NCCL) if n in given]
    if mpirun:
        args = s.spec.mpi_global_args.value if s.spec.mpi_global_args is not None else ()
        mca = {args[i + 1] for i in range(len(args) - 1) if args[i] in _MCA_FLAGS}
        # -x OMPI_MCA_*, and the launching shell's (mpirun reads its own environment)
        mca |= {n.removeprefix("OMPI_MCA_") for n in (*given, *s.ctx.environ) if n.startswith("OMPI_MCA_")}
        user += [n for n in MCA if n in mca or _EXCLUDE[n] in mca]
    return tuple(user)


def _subnet(s: Solver) -> str:
    """Return ``--host-subnet`` as a network in CIDR form ("" when not given; the option's reader refused a bad one: PR213)."""
    given = s.spec.host_subnet
    if given is None:
        return ""
    import ipaddress

    try:
        return str(ipaddress.ip_network(given.value.strip(), strict=False))
    except ValueError:  # a saved spec the reader did not see: PR213 is the option's
        return ""


def is_loopback(address: str) -> bool:
    """Return whether ``address`` (a name or an address) is this machine's loopback wherever it is used."""
    import ipaddress

    if address.lower().rstrip(".") in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(address.split("%", maxsplit=1)[0]).is_loopback
    except ValueError:
        return False


def _check_loopback(s: Solver, master: str) -> None:
    """PR318 when MASTER_ADDR is a loopback address: each host would reach itself, not instance 0."""
    if master and is_loopback(master):
        user = next((e for e in s.spec.env if e.value.name == "MASTER_ADDR"), None)
        s.fail("PR318", "MASTER_ADDR is a loopback address on a plan over several hosts",
               detail=f"MASTER_ADDR is '{master}': the instances on every other host would reach themselves, "
                      "not instance 0's host", span=user.origin if user is not None else s.origin("hosts"),
               hint="leave MASTER_ADDR to poprun, or set it to an address of instance 0's host that every host "
                    "reaches (-x MASTER_ADDR=ADDRESS); name this machine in --host by its name, not localhost")


# -- choosing from the hosts' answers --------------------------------------------------------
def choose(record: p.Network, answers: Mapping[str, RouteAnswer | str],
           ) -> tuple[p.Network, tuple[Diagnostic, ...]]:
    """
    Return ``record`` with each host's interface chosen from its answer (or why a host could not be: diagnostics).

    Pure: ``answers`` maps each host to its :class:`~poprun.planner.netroute.RouteAnswer`, or a
    one-line reason it has none (unreachable, no tool, no answer in time).
    """
    problems: list[Diagnostic] = []
    peer = _peer_target(answers)
    chosen = []
    for h in record.hosts:
        if h.interface:
            chosen.append(h)
            continue
        answer = answers.get(h.host, "the host was not read")
        one, found = _choose_one(h.host, answer, record, peer)
        problems += found
        chosen.append(one)
    return evolve(record, hosts=tuple(chosen)), tuple(problems)


def _peer_target(answers: Mapping[str, RouteAnswer | str]) -> str:
    """Return the first address, not a loopback one, that a host resolved MASTER_ADDR to ("" when none did)."""
    for answer in answers.values():
        if not isinstance(answer, str):
            for target in answer.targets:
                if not is_loopback(target):
                    return target
    return ""


def _choose_one(host: str, answer: RouteAnswer | str, record: p.Network, peer: str,
                ) -> tuple[p.HostInterface, list[Diagnostic]]:
    """Return ``host``'s interface from its answer, and the diagnostics it gives."""
    blank = p.HostInterface(host=host)
    span = SourceSpan.environment(f"host {host}")
    if isinstance(answer, str):  # a warning: the launch goes on, this host's instances without the variables
        return _unread(host, answer), [warning(
            "PR476", "cannot read a host's route", detail=f"on {host}: {answer}; its instances get no interface from "
            "poprun", span=span, hint=f"check that {host} has ip (iproute2) or python3; or {HINT}")]
    if record.source == "host-subnet":
        return _by_subnet(host, answer, record.subnet, span)
    master = record.master_addr
    if not answer.targets:
        return _unread(host, f"MASTER_ADDR '{master}' does not resolve there"), [warning(
            "PR476", "cannot read a host's route", detail=f"on {host}, MASTER_ADDR '{master}' does not resolve to an "
            "address; its instances get no interface from poprun", span=span,
            hint=f"make '{master}' resolve on {host} (DNS, /etc/hosts), or set MASTER_ADDR to an address with "
                 "-x MASTER_ADDR=ADDRESS")]
    target, interface, source, how_route = answer.targets[0], answer.interface, answer.source, answer.route
    if is_loopback(target) and answer.local:  # its own name as a loopback address: the others reach it at peer
        holder = answer.interface_of(peer) if peer else ""
        if not holder:
            return blank, [error("PR318", "MASTER_ADDR is a loopback address on a plan over several hosts",
                                 detail=f"on {host}, MASTER_ADDR '{master}' resolves to {target}, its loopback, and "
                                        "no other host's address for it is held by an interface of " + host,
                                 span=span, hint="set MASTER_ADDR to an address of instance 0's host that every host "
                                                 f"reaches (-x MASTER_ADDR=ADDRESS); or {HINT}")]
        interface, source, how_route = holder, peer, f"{peer} is held by {holder} (the others' address for {master})"
    elif not interface:
        said = answer.route or "no answer"
        return blank, [error("PR474", "no route to MASTER_ADDR",
                             detail=f"{host} has no route to MASTER_ADDR {master}"
                                    + (f" ({target})" if target != master else "") + f": the kernel says '{said}'",
                             span=span, hint=f"give {host} a route to {target}, or {HINT}")]
    more = f" (first of {len(answer.targets)} addresses of {master})" if len(answer.targets) > 1 else ""
    how = (f"route get {target} -> {interface} src {source}{more}" if how_route == answer.route
           else how_route) + ("" if answer.tool == "ip" else f" ({answer.tool})")
    if not _valid(interface):
        return blank, [_bad_name(host, interface, span)]
    return p.HostInterface(host=host, interface=interface, address=source,
                           subnet=answer.subnet_of(interface, source), how=how), []


def _unread(host: str, why: str) -> p.HostInterface:
    """Return the record of a host whose route could not be read: no interface, and why (never read again)."""
    from poprun.core.secret import printable

    return p.HostInterface(host=host, how="not read: " + printable(" ".join(why.split()))[:300])


def _by_subnet(host: str, answer: RouteAnswer, subnet: str, span: SourceSpan,
               ) -> tuple[p.HostInterface, list[Diagnostic]]:
    """Return the interface of ``host`` whose address lies in ``subnet`` (the lowest ifindex when several)."""
    import ipaddress

    network = ipaddress.ip_network(subnet)
    inside = []
    for a in answer.addresses:
        try:
            if ipaddress.ip_address(a.address.split("%")[0]) in network:
                inside.append(a)
        except ValueError:
            continue
    if not inside:
        held = ", ".join(f"{a.interface} {a.address}/{a.prefix}" for a in answer.addresses
                         if not is_loopback(a.address) and not a.address.lower().startswith("fe80"))
        return p.HostInterface(host=host), [error(
            "PR475", "no interface in --host-subnet", detail=f"no interface of {host} has an address in {subnet}"
            + (f" (it has {held})" if held else ""), span=span,
            hint="give the subnet all hosts share in --host-subnet, or leave it out: poprun then uses the route to "
                 "MASTER_ADDR on each host")]
    first = inside[0]
    problems: list[Diagnostic] = []
    others = sorted({a.interface for a in inside} - {first.interface})
    if others:
        problems.append(warning("PR477", "several interfaces in --host-subnet",
                                detail=f"on {host}, {first.interface} and {', '.join(others)} have addresses in "
                                       f"{subnet}: {first.interface} is used (the lowest ifindex, {first.index})",
                                span=span, hint="give a narrower --host-subnet, or name the interface with "
                                                "-x GLOO_SOCKET_IFNAME=IF -x NCCL_SOCKET_IFNAME=IF"))
    if not _valid(first.interface):
        return p.HostInterface(host=host), [*problems, _bad_name(host, first.interface, span)]
    how = f"host-subnet {subnet}: {first.interface} holds {first.address}"
    return p.HostInterface(host=host, interface=first.interface, address=first.address, subnet=subnet,
                           how=how), problems


def _valid(name: str) -> bool:
    from poprun.planner.netroute import valid_interface

    return valid_interface(name)


def _bad_name(host: str, interface: str, span: SourceSpan) -> Diagnostic:
    from poprun.core.secret import printable

    return error("PR478", "interface name Gloo and NCCL cannot take",
                 detail=f"on {host}, the interface is named '{printable(interface[:40])}', which GLOO_SOCKET_IFNAME "
                        "and NCCL_SOCKET_IFNAME cannot name (a comma, a leading ^ or =, or not a kernel name)",
                 span=span, hint=f"rename the interface on {host} (ip link set OLD name NEW), or {HINT}")


def variables(record: p.Network, instances: Sequence[p.Instance]) -> dict[int, dict[str, str]]:
    """Return the variables each instance gets from ``record``: its host's interface for each variable poprun sets."""
    names = [n for n in (GLOO, NCCL) if n in record.sets]
    found: dict[int, dict[str, str]] = {}
    for i in instances:
        h = record.of(i.host)
        if h is not None and h.interface and names:
            found[i.index] = dict.fromkeys(names, h.interface)
    return found


def settle(plan: p.LaunchPlan, answers: Mapping[str, RouteAnswer | str], *, master: str = "", partial: bool = False,
           ) -> tuple[p.LaunchPlan, tuple[Diagnostic, ...]]:
    """
    Return ``plan`` with the interfaces left "at launch" chosen from the hosts' ``answers``, and the diagnostics.

    What the apply step calls before the first start: the plan's rule, the hosts' values; the
    instances get their variables. ``master``: MASTER_ADDR when the plan forwards it (read from
    the launching shell). With an error among the diagnostics, the plan is returned unchanged.
    ``partial``: only the hosts of ``answers`` are chosen; the others stay "at launch".
    """
    record = plan.network
    if master and not record.master_addr:
        record = evolve(record, master_addr=master)
    if partial:
        settled, problems = choose(evolve(record, hosts=tuple(h for h in record.hosts if h.host in answers)), answers)
        chosen = {h.host: h for h in settled.hosts}
        settled = evolve(settled, hosts=tuple(chosen.get(h.host, h) for h in record.hosts))
    else:
        settled, problems = choose(record, answers)
    if any(d.is_error for d in problems):
        return plan, problems
    return evolve(plan.with_instance_variables(variables(settled, plan.instances)), network=settled), problems
