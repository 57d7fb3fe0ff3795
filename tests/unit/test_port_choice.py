"""The port plan on what a host reports: parsing /proc/net/tcp, choosing a free port, checking the user's."""
# ruff: noqa: S311 - seeded random sources stand in for the system's, to make choices repeatable

from __future__ import annotations

import random
from collections.abc import Mapping

from hypothesis import given
from hypothesis import strategies as st

from poprun.apply.ports import DEFAULT_PORT, HIGHEST, LOWEST, check_port, choose_port, parse_ports
from poprun.backends.base import LaunchError
from poprun.core.diagnostic import Severity

HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode"


def line(port: int, state: str = "0A", inode: int = 1000, *, v6: bool = False) -> str:
    address = "00000000000000000000000001000000" if v6 else "0100007F"
    return (f"   0: {address}:{port:04X} {address}:0000 {state} 00000000:00000000 00:00000000 00000000  1000"
            f"        0 {inode} 1 0000000000000000 100 0 0 10 0")


def report(*lines: str, v6: tuple[str, ...] = (), ephemeral: str = "32768\t60999") -> str:
    return "\n".join(["@tcp", HEADER, *lines, "@tcp6", HEADER, *v6, "@range", ephemeral, "@end", ""])


class Host:
    """A backend whose one host answers with ``text`` (its run_on_host), counting the scripts it ran."""

    name = "fake"

    def __init__(self, text: str, *, status: int = 0, fail: str | None = None) -> None:
        self.text, self.status, self.fail, self.scripts = text, status, fail, []

    def run_on_host(self, host: str, script: str, *, environ: Mapping[str, str],  # noqa: ARG002
                    timeout_s: float) -> tuple[int, bytes]:  # noqa: ARG002 - the protocol's
        self.scripts.append(script)
        if self.fail is not None:
            raise LaunchError(self.fail)
        return self.status, self.text.encode()


class First:
    """A random source that takes the first candidate, and keeps the candidates it was offered."""

    def choice(self, seq):
        self.offered = list(seq)
        return seq[0]


def test_every_state_counts_as_taken_in_tcp_and_tcp6():
    """Listening, established and TIME_WAIT sockets (v4 and v6) all bind their port."""
    # GIVEN
    text = report(line(20001, "0A"), line(20002, "01"), line(20003, "06"), v6=(line(20004, "08", v6=True),))

    # WHEN
    ports = parse_ports(text)

    # THEN
    assert [20001, 20002, 20003, 20004] == [port for port, _ in ports.bound]
    assert (("TIME_WAIT", 1000),) == ports.sockets(20003)
    assert (32768, 60999) == ports.ephemeral


def test_choice_skips_taken_ports_their_predecessors_and_avoided_ones():
    """P is never taken, nor P+1 (the hub), nor an avoided port or the one after it (its hub)."""
    host = Host(report(line(LOWEST), line(LOWEST + 3, "06")))
    rng = First()

    choice = choose_port(host, "h1", environ={}, avoid=(LOWEST + 5,), rng=rng)

    assert (True, "h1") == (choice.chosen, choice.host)
    assert {LOWEST, LOWEST + 2, LOWEST + 3, LOWEST + 4, LOWEST + 5, LOWEST + 6} & set(rng.offered) == set()
    assert LOWEST + 1 == choice.port
    assert "chosen at apply time" in choice.reason


def test_choice_stays_outside_the_ephemeral_range():
    """Neither P nor P+1 is in the kernel's ephemeral range."""
    rng = First()

    choose_port(Host(report(ephemeral="20000\t60000")), "h1", environ={}, rng=rng)

    assert 60001 == min(rng.offered)
    assert HIGHEST == max(rng.offered)


@given(st.sets(st.integers(LOWEST, HIGHEST + 1), max_size=50), st.integers(0, 2**32))
def test_a_choice_never_meets_a_taken_or_avoided_port(taken, seed):
    """Whatever is taken and avoided, P and P+1 are neither (two runs that avoid each other's ports differ)."""
    first = choose_port(Host(report(*(line(p) for p in sorted(taken)))), "h1", environ={}, rng=random.Random(seed))
    second = choose_port(Host(report(*(line(p) for p in sorted(taken)))), "h1", environ={}, avoid=(first.port,),
                         rng=random.Random(seed))

    assert not {first.port, first.port + 1} & taken
    assert not {second.port, second.port + 1} & ({first.port, first.port + 1} | taken)


def test_the_same_seed_gives_the_same_port_and_different_seeds_spread():
    """The choice is random among the free ports: a seeded source repeats it, and 20 seeds give 20 ports."""
    host = Host(report())

    ports = [choose_port(host, "h1", environ={}, rng=random.Random(seed)).port for seed in range(20)]

    assert ports[0] == choose_port(host, "h1", environ={}, rng=random.Random(0)).port
    assert 20 == len(set(ports))


def test_an_unreadable_host_keeps_the_default_and_says_why():
    """A host that cannot be reached, a report that is not one, or a backend without host commands: 29500 and why."""
    unreachable = choose_port(Host("", fail="PR406: host 'h1' cannot be reached: ssh: connect refused"), "h1",
                              environ={})
    garbled = choose_port(Host("$(rm -rf ~)\n@tcp\n"), "h1", environ={})
    plugin = choose_port(object(), "h1", environ={})

    assert (DEFAULT_PORT, False) == (unreachable.port, unreachable.chosen)
    assert "cannot be reached" in unreachable.reason
    assert "did not list its TCP ports" in garbled.reason
    assert "offers no run_on_host" in plugin.reason


def test_check_names_a_taken_port_and_warns_of_a_taken_hub():
    """PR440 (an error) for the port itself, PR441 (a warning) for P+1 only, nothing when both are free."""
    host = Host(report(line(29500, "0A", inode=0), line(29601, "06", inode=0)))

    taken = check_port(host, "h1", 29500, environ={})
    hub = check_port(host, "h1", 29600, environ={})

    assert ("PR440", Severity.ERROR) == (taken.code, taken.severity)
    assert "MASTER_PORT 29500: a socket is bound to it (LISTEN)" == taken.detail
    assert ("PR441", Severity.WARNING) == (hub.code, hub.severity)
    assert check_port(host, "h1", 29700, environ={}) is None


def test_a_hostile_process_name_cannot_forge_the_holder():
    """The holder's name arrives as hex: newlines and shell text in it are shown, not obeyed or parsed."""
    name = b"evil\npid 1 (init)\n$(reboot)".hex()
    host = Host(report(line(29500)))
    host.text = report(line(29500))
    answers = iter([report(line(29500)), f"pid 4242 {name}\npid x\ngarbage\n"])
    host.run_on_host = lambda *_a, **_k: (0, next(answers).encode())  # type: ignore[method-assign]

    found = check_port(host, "h1", 29500, environ={})

    assert "MASTER_PORT 29500: held by pid 4242 (evil?pid 1 (init)?$(reboot)), socket LISTEN" == found.detail
