"""Laws of reading a host's answer and choosing its interface (poprun.planner.netroute, poprun.planner.network)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from poprun.planner import plan as p
from poprun.planner.netroute import parse, valid_interface
from poprun.planner.network import choose

WORDS = st.sampled_from(["tool ip", "tool python3", "target 10.0.0.1", "target fd00::1", "target 127.0.1.1",
                         "route 10.0.0.1 dev eth0 src 10.0.0.2", "route local 10.0.0.1 dev lo src 10.0.0.1",
                         "route RTNETLINK answers: Network is unreachable", "route dev", "route src",
                         "addr 2: eth0    inet 10.0.0.2/24", "addr 3: e,x    inet 10.0.0.3/24", "addr x: y",
                         "addr 4: ib0    inet6 fd00::2/64", "addr 1: lo    inet 127.0.0.1/8"])
LINES = st.lists(st.one_of(WORDS, st.text(max_size=40)), max_size=12)


@settings(max_examples=300)
@given(LINES, st.sampled_from(["route", "host-subnet"]))
def test_any_answer_parses_and_chooses_without_raising_and_only_valid_names_are_set(lines: list[str],
                                                                                     source: str) -> None:
    """Whatever a host prints, parsing never raises; a chosen interface is always one Gloo and NCCL can take."""
    answer = parse("".join(f"M {line}\n" for line in lines), "M")
    record = p.Network(source=source, master_addr="10.0.0.1", subnet="10.0.0.0/8" if source == "host-subnet" else "",
                       sets=("GLOO_SOCKET_IFNAME",), hosts=(p.HostInterface(host="a"),))

    chosen, problems = choose(record, {"a": answer})

    (host,) = chosen.hosts
    assert not host.interface or valid_interface(host.interface)
    assert bool(host.interface) or problems or host.how  # a host without an interface always says why
    assert all(d.code in ("PR318", "PR474", "PR475", "PR476", "PR477", "PR478") for d in problems)
