"""
The interface collectives use (poprun.planner.network, netroute; poprun.apply.network): decided, read, settled.

The pure decision is tested with answers written as ``ip`` gives them (a fake route reader);
the reading itself runs for real on this machine: ``ip``, the ``python3`` fallback without
``ip``, neither, a hanging ``ip``, hostile values of MASTER_ADDR.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from poprun.apply.network import read_routes, settle_network
from poprun.backends.base import LaunchError
from poprun.backends.mpirun.command import mpirun_command
from poprun.core.diagnostic import error
from poprun.core.record import evolve
from poprun.core.span import SourceSpan
from poprun.planner import plan as p
from poprun.planner.context import Context
from poprun.planner.flags import parse_flags
from poprun.planner.netroute import host_script, parse, read_here, valid_interface
from poprun.planner.network import GLOO, NCCL, choose, settle
from poprun.planner.plancheck import validate_plan
from poprun.planner.serde import from_json, to_json
from poprun.planner.solve import solve

pytestmark = pytest.mark.timeout(60)

CTX = Context(environ={"PATH": "/usr/bin"}, cwd="/work", local_names=("localhost", "me"))
HOSTS = "10.1.0.11,10.1.0.12"


def answer(*lines: str) -> str:
    """Return a host's answer as the script prints it (each line after the mark M)."""
    return "".join(f"M {line}\n" for line in lines)


def h1(route: str = "local 10.1.0.11 dev lo src 10.1.0.11 uid 0 \\    cache <local>") -> str:
    return answer("tool ip", "target 10.1.0.11", f"route {route}", "addr 1: lo    inet 127.0.0.1/8 scope host lo",
                  "addr 2: docker0    inet 172.17.0.1/16 scope global docker0",
                  "addr 3: eth0    inet 10.1.0.11/24 brd 10.1.0.255 scope global eth0\\       valid_lft forever")


def h2(interface: str = "eth0", route: str | None = None) -> str:
    said = route or f"10.1.0.11 dev {interface} src 10.1.0.12 uid 0 \\    cache"
    return answer("tool ip", "target 10.1.0.11", f"route {said}", "addr 1: lo    inet 127.0.0.1/8 scope host lo",
                  "addr 2: docker0    inet 172.17.0.1/16 scope global docker0",
                  f"addr 3: {interface}    inet 10.1.0.12/24 scope global {interface}",
                  "addr 4: ib0    inet 10.2.0.12/24 scope global ib0")


def reader(answers: dict[str, str]) -> Context:
    return evolve(CTX, routes=lambda hosts, _master: {h: parse(answers[h], "M") for h in hosts})


def plan_of(*argv: str, ctx: Context = CTX, program: tuple[str, ...] = ("python3", "train.py")) -> p.LaunchPlan:
    return solve(parse_flags([*argv, *program]).spec, ctx).plan


# -- parsing what a host says -----------------------------------------------------------------
def test_parse_reads_the_route_and_the_addresses_and_skips_what_is_not_marked() -> None:
    """A banner or a stray line is never an answer; ip's cache tail is not part of the route."""
    found = parse("Welcome to pod2!\nM2 route 1.2.3.4 dev evil src 6.6.6.6\n" + h2(), "M")

    assert not isinstance(found, str)
    assert (found.interface, found.source, found.local) == ("eth0", "10.1.0.12", False)
    assert found.route == "10.1.0.11 dev eth0 src 10.1.0.12 uid 0"
    assert found.subnet_of("eth0", "10.1.0.12") == "10.1.0.0/24"
    assert [a.interface for a in found.addresses] == ["lo", "docker0", "eth0", "ib0"]


def test_the_hosts_own_address_is_its_interface_not_lo() -> None:
    """On instance 0's host, `route get` answers `local ... dev lo`: the interface holding the address is used."""
    found = parse(h1(), "M")

    assert not isinstance(found, str)
    assert (found.interface, found.source, found.local) == ("eth0", "10.1.0.11", True)


def test_parse_of_nothing_and_of_no_tool() -> None:
    assert parse(b"", "M") == "the host gave no answer"
    assert parse(answer("tool none"), "M") == "neither ip (iproute2) nor python3 is on the host"


def test_an_ipv6_route_is_read() -> None:
    found = parse(answer("tool ip", "target fd00::1", "route fd00::1 from :: dev eth0 proto kernel src fd00::2 metric 256",
                         "addr 2: eth0    inet6 fd00::2/64 scope global"), "M")

    assert not isinstance(found, str)
    assert (found.interface, found.source, found.subnet_of("eth0", "fd00::2")) == ("eth0", "fd00::2", "fd00::/64")


@given(st.text(max_size=20))
def test_an_accepted_interface_name_is_one_gloo_nccl_and_the_kernel_take(name: str) -> None:
    """No comma (a list), no ^ or = first (NCCL's prefixes), no /, :, white space or NUL, 1 to 15 bytes."""
    if valid_interface(name):
        assert 0 < len(name.encode("utf-8", "surrogateescape")) <= 15
        assert not any(c in name for c in ",/:\0") and not any(c.isspace() for c in name)
        assert name[0] not in "^=" and name not in (".", "..")


@pytest.mark.parametrize("name", ["eth0", "enp1s0f0", "ib0", "bond0.100", "veth$(x)", "a'b", "x" * 15])
def test_names_the_kernel_allows_are_taken(name: str) -> None:
    assert valid_interface(name)


@pytest.mark.parametrize("name", ["", "a,b", "^eth", "=eth0", "eth0:1", "a b", "a/b", "x" * 16, "é" * 8, "."])
def test_names_gloo_or_the_kernel_refuse_are_not(name: str) -> None:
    assert not valid_interface(name)


# -- reading this machine for real --------------------------------------------------------------
def test_read_here_agrees_with_ip_route_get() -> None:
    """The reading on this machine names what `ip -o route get` names, for the loopback and for another address."""
    local = read_here("127.0.0.1")
    assert not isinstance(local, str) and local.interface == "lo" and local.local
    said = subprocess.run(["ip", "-o", "route", "get", "192.0.2.77"], capture_output=True, text=True, check=False)
    found = read_here("192.0.2.77")
    if said.returncode != 0:
        assert not isinstance(found, str) and not found.interface and "RTNETLINK" in found.route
    else:
        words = said.stdout.split()
        assert not isinstance(found, str)
        assert (found.interface, found.source) == (words[words.index("dev") + 1], words[words.index("src") + 1])


def _path_without_ip(tmp_path: Path, *, python: bool) -> str:
    """Return a PATH of the tools the script uses, without ip (and without python3 unless asked)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for tool in ("getent", "awk", "head", "sed", *(["python3"] if python else [])):
        found = shutil.which(tool)
        if found:
            (folder / tool).symlink_to(found)
    return str(folder)


def _run_script(master: str, path: str, timeout: float = 20) -> tuple[object, float]:
    began = time.monotonic()
    done = subprocess.run(["/bin/sh", "-s"], input=host_script(master, "M").encode(), capture_output=True,
                          env={"PATH": path}, timeout=timeout, check=False)
    return parse(done.stdout, "M"), time.monotonic() - began


def test_without_ip_python3_reads_the_same_route(tmp_path: Path) -> None:
    """The fallback (getaddrinfo, a UDP socket's source address, SIOCGIFADDR) names ip's interface and source."""
    by_ip = read_here("127.0.0.1")
    by_python, _ = _run_script("127.0.0.1", _path_without_ip(tmp_path, python=True))

    assert not isinstance(by_ip, str) and not isinstance(by_python, str)
    assert by_python.tool == "python3"
    assert (by_python.interface, by_python.source, by_python.local) == (by_ip.interface, by_ip.source, True)
    assert {(a.interface, a.address) for a in by_ip.addresses if ":" not in a.address} <= \
        {(a.interface, a.address) for a in by_python.addresses}


def test_without_ip_nor_python3_the_host_says_so(tmp_path: Path) -> None:
    found, _ = _run_script("10.1.0.11", _path_without_ip(tmp_path, python=False))

    assert found == "neither ip (iproute2) nor python3 is on the host"


def test_an_ip_that_hangs_is_given_up_within_its_deadline(tmp_path: Path) -> None:
    """A host whose ip never answers: the reading ends at its deadline, and so does everything it started."""
    folder = tmp_path / "bin"
    folder.mkdir()
    (folder / "ip").write_text("#!/bin/sh\nexec sleep 300\n")
    (folder / "ip").chmod(0o755)
    old = os.environ["PATH"]
    os.environ["PATH"] = f"{folder}:{old}"
    try:
        began = time.monotonic()
        found = read_here("10.1.0.11", timeout_s=1)
    finally:
        os.environ["PATH"] = old

    assert found == "no answer within 1 s"
    assert time.monotonic() - began < 10


def test_a_hostile_master_addr_is_never_run_by_the_shell(tmp_path: Path) -> None:
    """Quotes, $(), back-quotes and new lines in MASTER_ADDR stay data: nothing runs, nothing resolves."""
    mark = tmp_path / "ran"
    for hostile in (f"$(touch {mark})", f"`touch {mark}`", f"x'; touch {mark}; '", f"a\ntouch {mark}"):
        found = read_here(hostile)

        assert not mark.exists(), hostile
        assert not isinstance(found, str) and found.targets == ()


# -- the decision ---------------------------------------------------------------------------------
def test_one_host_local_and_offline_decide_nothing() -> None:
    assert plan_of("--num-replicas", "2", "--num-instances", "2").network == p.Network(
        reason="one host: the collectives stay on it")
    local = plan_of("-H", "localhost,me", "--num-replicas", "2")
    assert local.network.source == "none" and "this machine" in local.network.reason
    offline = plan_of("-H", HOSTS, "--num-replicas", "2", "--offline-mode=yes")
    assert offline.network.source == "none" and offline.network.reason.startswith("offline")
    assert all(i.env.get(GLOO) is None for i in (*local.instances, *offline.instances))


def test_read_while_planning_each_instance_gets_its_hosts_interface() -> None:
    """Names may differ per host: each instance gets its own host's."""
    plan = plan_of("-H", HOSTS, "--num-replicas", "4", "--num-instances", "4", "--backend", "ssh",
                   ctx=reader({"10.1.0.11": h1(), "10.1.0.12": h2("enp2s0")}))

    assert [(i.host, i.env.get(GLOO), i.env.get(NCCL)) for i in plan.instances] == [
        ("10.1.0.11", "eth0", "eth0"), ("10.1.0.11", "eth0", "eth0"),
        ("10.1.0.12", "enp2s0", "enp2s0"), ("10.1.0.12", "enp2s0", "enp2s0")]
    assert plan.network.hosts[1].how == "route get 10.1.0.11 -> enp2s0 src 10.1.0.12"
    assert not plan.network.pending


def test_the_users_variable_wins_and_poprun_sets_the_other() -> None:
    plan = plan_of("-H", HOSTS, "--num-replicas", "2", "--backend", "ssh", "--instance-mpi-local-args=0:-x GLOO_SOCKET_IFNAME=ib0",
                   ctx=reader({"10.1.0.11": h1(), "10.1.0.12": h2()}))

    assert plan.network.user == (GLOO,) and plan.network.sets == (NCCL,)
    assert [(i.env.get(GLOO), i.env.get(NCCL)) for i in plan.instances] == [("ib0", "eth0"), (None, "eth0")]


def test_mpirun_an_exclude_in_the_launching_shell_is_the_users_and_include_is_not_added() -> None:
    """Open MPI refuses include and exclude together: an OMPI_MCA_btl_tcp_if_exclude of the shell keeps btl's own."""
    ctx = evolve(reader({"10.1.0.11": h1(), "10.1.0.12": h2()}),
                 environ={"PATH": "/usr/bin", "OMPI_MCA_btl_tcp_if_exclude": "docker0,lo"})
    plan = plan_of("-H", HOSTS, "--num-replicas", "2", "--backend", "mpirun", ctx=ctx)
    words = mpirun_command(plan)

    assert plan.network.user == ("btl_tcp_if_include",)
    assert words[words.index("oob_tcp_if_include") + 1] == "10.1.0.0/24"
    assert "btl_tcp_if_include" not in words


def test_mpirun_two_subnets_are_both_given() -> None:
    """Hosts on two subnets (routed): the if_include list holds both, in CIDR form (names never reach the line)."""
    other = answer("tool ip", "target 10.1.0.11", "route 10.1.0.11 via 10.9.0.1 dev odd$(x) src 10.9.0.5 uid 0",
                   "addr 3: odd$(x)    inet 10.9.0.5/16 scope global odd$(x)")
    plan = plan_of("-H", HOSTS, "--num-replicas", "2", "--backend", "mpirun",
                   ctx=reader({"10.1.0.11": h1(), "10.1.0.12": other}))
    words = mpirun_command(plan)

    assert words[words.index("oob_tcp_if_include") + 1] == "10.1.0.0/24,10.9.0.0/16"
    assert plan.instances[1].env.get(GLOO) == "odd$(x)"  # a value in the environment, never a shell word


def test_the_first_of_several_addresses_is_the_route_and_the_explain_says_so() -> None:
    two = answer("tool ip", "target 10.1.0.11", "target fd00::11", "route 10.1.0.11 dev eth0 src 10.1.0.12",
                 "addr 3: eth0    inet 10.1.0.12/24 scope global eth0")
    plan = plan_of("-H", "pod1,pod2", "--num-replicas", "2", "--backend", "ssh",
                   ctx=reader({"pod1": h1(), "pod2": two}))

    assert plan.network.hosts[1].how == "route get 10.1.0.11 -> eth0 src 10.1.0.12 (first of 2 addresses of pod1)"


def test_an_own_name_on_the_loopback_takes_the_address_the_others_reach() -> None:
    """Debian's `127.0.1.1 pod1`: on pod1, MASTER_ADDR is its loopback; the others' address for it is held by eth0."""
    own = answer("tool ip", "target 127.0.1.1", "route local 127.0.1.1 dev lo src 127.0.0.1",
                 "addr 1: lo    inet 127.0.0.1/8 scope host lo", "addr 3: eth0    inet 10.1.0.11/24 scope global eth0")
    record = p.Network(source="route", master_addr="pod1", sets=(GLOO, NCCL),
                       hosts=(p.HostInterface(host="pod1"), p.HostInterface(host="pod2")))
    chosen, problems = choose(record, {"pod1": parse(own, "M"), "pod2": parse(h2(), "M")})

    assert problems == ()
    assert (chosen.hosts[0].interface, chosen.hosts[0].address) == ("eth0", "10.1.0.11")
    _, problems = choose(record, {"pod1": parse(own, "M"), "pod2": "unreachable"})
    assert [d.code for d in problems] == ["PR318", "PR476"]


def test_ipv6_host_subnet_picks_the_interface_in_it() -> None:
    v6 = answer("tool ip", "target fd00::11", "route fd00::11 dev eth0 src fd00::12",
                "addr 3: eth0    inet6 fd00::12/64 scope global", "addr 3: eth0    inet6 fe80::1/64 scope link")
    record = p.Network(source="host-subnet", master_addr="fd00::11", subnet="fd00::/64", sets=(GLOO,),
                       hosts=(p.HostInterface(host="a"),))
    chosen, problems = choose(record, {"a": parse(v6, "M")})

    assert problems == () and chosen.hosts[0].interface == "eth0" and chosen.mca_value() == "fd00::/64"


def test_master_addr_that_is_ipv6_goes_through() -> None:
    plan = plan_of("-H", HOSTS, "--num-replicas", "2", "--backend", "ssh", "--mpi-global-args=-x MASTER_ADDR=fd00::11")

    assert plan.network.master_addr == "fd00::11" and plan.network.pending


# -- settling at launch ---------------------------------------------------------------------------
def test_settle_fills_the_plan_at_launch_and_leaves_it_on_error() -> None:
    plan = plan_of("-H", HOSTS, "--num-replicas", "2", "--backend", "ssh")
    assert plan.network.pending

    settled, problems = settle(plan, {"10.1.0.11": parse(h1(), "M"), "10.1.0.12": parse(h2("ens1"), "M")})
    assert problems == () and not settled.network.pending
    assert [i.env.get(GLOO) for i in settled.instances] == ["eth0", "ens1"]
    assert from_json(to_json(settled)) == settled  # the run record's copy loads as it was

    refused, problems = settle(plan, {"10.1.0.11": parse(h1(), "M"),
                                      "10.1.0.12": parse(h2(route="RTNETLINK answers: Permission denied"), "M")})
    assert refused is plan
    assert [d.code for d in problems] == ["PR474"]
    assert "the kernel says 'RTNETLINK answers: Permission denied'" in problems[0].detail


class Hosts:
    """A backend whose run_on_host runs the script here for one host, and for the other fails as told."""

    name = "scripted"

    def __init__(self, other: str) -> None:
        self.other = other

    def run_on_host(self, host: str, script: str, *, environ: dict[str, str],  # noqa: ARG002 - the protocol's
                    timeout_s: float) -> tuple[int, bytes]:
        if host == "10.1.0.11":
            done = subprocess.run(["/bin/sh", "-s"], input=script.encode(), capture_output=True, timeout=timeout_s,
                                  check=False)
            return done.returncode, done.stdout
        if self.other == "unreachable":
            raise LaunchError("PR406: host '10.1.0.12' cannot be reached", diagnostics=(
                error("PR406", "host '10.1.0.12' cannot be reached", detail="ssh: connect: No route to host",
                      span=SourceSpan.environment("host 10.1.0.12"), hint="check it"),))
        time.sleep(timeout_s + 5)
        return 0, b""


def test_an_unreached_host_is_left_to_the_launch_and_the_others_are_read() -> None:
    """The backend's own launch names a host it cannot reach (its preflight, in its words); the others get theirs."""
    here = read_here("127.0.0.1")
    assert not isinstance(here, str)
    own = next((a for a in here.addresses if "." in a.address and not a.address.startswith("127.")), None)
    if own is None:
        pytest.skip("this machine has no IPv4 address but its loopback")
    plan = plan_of("-H", HOSTS, "--num-replicas", "2", "--backend", "ssh")
    plan = evolve(plan, network=evolve(plan.network, master_addr=own.address))  # this machine reads it as h1

    settled, warnings = settle_network(Hosts("unreachable"), plan, environ=dict(os.environ))

    assert warnings == ()
    assert [(h.host, h.interface) for h in settled.network.hosts] == [("10.1.0.11", own.interface), ("10.1.0.12", "")]
    assert settled.network.pending  # read again before the next attempt
    assert [i.env.get(GLOO) for i in settled.instances] == [own.interface, None]


def test_a_stop_ends_a_reading_that_hangs() -> None:
    """Ctrl-C while a host's reading hangs: read_routes returns within seconds, that host 'stopped'."""
    import threading

    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    began = time.monotonic()
    answers, unreached = read_routes(Hosts("hangs"), ("10.1.0.11",), "127.0.0.1", environ=dict(os.environ),
                                     stop=stop, timeout_s=2)

    assert unreached == {} and not isinstance(answers["10.1.0.11"], str)
    assert time.monotonic() - began < 10


# -- a saved plan -------------------------------------------------------------------------------------
def test_a_forged_network_record_is_refused_per_rule() -> None:
    plan = plan_of("-H", HOSTS, "--num-replicas", "2", "--backend", "ssh",
                   ctx=reader({"10.1.0.11": h1(), "10.1.0.12": h2()}))
    assert validate_plan(plan, file="plan.json") == []
    forged = evolve(plan, network=evolve(plan.network, user=(GLOO,), hosts=(
        evolve(plan.network.hosts[0], interface="a,b"), evolve(plan.network.hosts[1], subnet="nonsense"))))

    found = [d.detail for d in validate_plan(forged, file="plan.json")]
    assert any("$.network.sets" in d and "the user set" in d for d in found), found
    assert any("$.network.hosts[0].interface" in d for d in found), found
    assert any("$.network.hosts[1].subnet" in d for d in found), found


def test_a_plan_saved_before_the_network_record_loads_with_none() -> None:
    plan = plan_of("-H", HOSTS, "--num-replicas", "2", "--backend", "ssh")
    import json

    data = json.loads(to_json(plan))
    del data["network"]

    assert from_json(json.dumps(data)).network == p.NO_NETWORK


def test_diff_shows_the_interfaces_read_at_launch() -> None:
    """`plan --diff` of the plan and the run's plan: each host's interface, and each instance's variables."""
    from poprun.render.diff import diff_plans, render_diff

    plan = plan_of("-H", HOSTS, "--num-replicas", "2", "--backend", "ssh")
    settled, _ = settle(plan, {"10.1.0.11": parse(h1(), "M"), "10.1.0.12": parse(h2("ens1"), "M")})
    text = render_diff(diff_plans(plan, settled), old_name="plan.json", new_name="RUN/plan.json")

    assert "host 10.1.0.12: at launch -> ens1 10.1.0.12" in text, text
    assert "GLOO_SOCKET_IFNAME" in text, text
