"""The port plan against real sockets of this machine: held ports are named, and never chosen."""

from __future__ import annotations

import os
import re
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from poprun.apply.ports import LOWEST, check_port, choose_port, read_ports
from poprun.backends.local import LocalBackend
from poprun.render.diagnostics import render_diagnostic
from tests.golden.harness import assert_golden

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]
GOLDEN = Path(__file__).parent / "ports_golden"


class Offered:
    """A random source that keeps the candidates it was offered and takes the first."""

    def choice(self, seq):
        self.offered = set(seq)
        return seq[0]


def free_pair() -> int:
    """Return a port P below the ephemeral range such that P and P+1 are free here now."""
    ports = read_ports(LocalBackend(), "localhost", environ=os.environ)
    assert not isinstance(ports, str), ports
    return choose_port(LocalBackend(), "localhost", environ=os.environ).port


@pytest.fixture
def listening() -> Iterator[socket.socket]:
    """Yield a socket of this process listening on a port of the plan's range."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", free_pair()))
        sock.listen()
        yield sock


def masked(text: str, port: int) -> str:
    """Return ``text`` with the port, this process's pid and its command name (pytest, python3) masked."""
    text = re.sub(rf"pid {os.getpid()} \([^)]*\)", "pid PID (NAME)", text)
    return text.replace(str(port + 1), "PORT+1").replace(str(port), "PORT")


def test_a_held_port_is_an_error_naming_its_process(listening):
    """PR440 names this process (pid and command name), exactly as the golden text says."""
    port = listening.getsockname()[1]

    found = check_port(LocalBackend(), "localhost", port, environ=os.environ)

    assert found is not None
    assert f"held by pid {os.getpid()} (" in found.detail
    golden = GOLDEN / "PR440_port_set_by_the_user_is_held_by_a_process"
    assert_golden(golden, masked(render_diagnostic(found), port))


def test_a_held_hub_port_is_a_warning(listening):
    """PR441 when MASTER_PORT is free but the port after it is held."""
    port = listening.getsockname()[1] - 1

    found = check_port(LocalBackend(), "localhost", port, environ=os.environ)

    assert found is not None
    golden = GOLDEN / "PR441_hub_port_after_the_users_port_is_held"
    assert_golden(golden, masked(render_diagnostic(found), port))


def test_choice_avoids_listening_established_and_time_wait_ports():
    """A listener, an established connection's port (listener gone) and a TIME_WAIT port are never offered."""
    # GIVEN a listener on A; on B an accepted connection left without its listener; on C one closed first here
    a, b, c = (socket.socket() for _ in range(3))
    kept = []
    try:
        for sock in (a, b, c):
            sock.bind(("127.0.0.1", free_pair()))
            sock.listen()
        for server in (b, c):
            client = socket.create_connection(server.getsockname())
            accepted, _ = server.accept()
            kept += [client, accepted]
            server.close()
        ports = {a.getsockname()[1], kept[1].getsockname()[1], kept[3].getsockname()[1]}
        kept[3].close()  # C's accepted side closes first, then its peer: port C goes to TIME_WAIT
        kept[2].close()
        time.sleep(0.05)  # the peer's FIN crosses the loopback
        states = read_ports(LocalBackend(), "localhost", environ=os.environ)
        rng = Offered()

        # WHEN
        choose_port(LocalBackend(), "localhost", environ=os.environ, rng=rng)

        # THEN
        assert {"LISTEN", "ESTABLISHED", "TIME_WAIT"} <= {s for p in ports for s, _ in states.sockets(p)}
        assert set() == {p - d for p in ports for d in (0, 1)} & rng.offered
        assert LOWEST <= min(rng.offered)
    finally:
        for sock in (a, b, c, *kept):
            sock.close()


def test_two_choices_at_once_differ_and_never_share_a_hub():
    """The second of two runs avoids the first's port and hub (what apply passes as avoid=)."""
    first = choose_port(LocalBackend(), "localhost", environ=os.environ)
    second = choose_port(LocalBackend(), "localhost", environ=os.environ, avoid=(first.port,))

    assert not {first.port, first.port + 1} & {second.port, second.port + 1}


def test_a_choice_here_tries_ports_by_binding_and_skips_held_ones(monkeypatch):
    """Without a given source, ports held in any state (listening, established, TIME_WAIT, IPv6) are passed over; no socket list is read."""
    from poprun.apply import ports as module

    # GIVEN a listener on A; B connected (listener gone); C in TIME_WAIT; D held by an IPv6 listener
    a, b, c = (socket.socket() for _ in range(3))
    d = socket.socket(socket.AF_INET6) if socket.has_ipv6 else socket.socket()
    kept = []
    try:
        for sock in (a, b, c):
            sock.bind(("127.0.0.1", free_pair()))
            sock.listen()
        d.bind(("::1" if d.family == socket.AF_INET6 else "127.0.0.1", free_pair()))
        d.listen()
        for server in (b, c):
            client = socket.create_connection(server.getsockname())
            accepted, _ = server.accept()
            kept += [client, accepted]
            server.close()
        held = [a.getsockname()[1], kept[1].getsockname()[1], kept[3].getsockname()[1], d.getsockname()[1]]
        kept[3].close()  # C's accepted side closes first, then its peer: port C goes to TIME_WAIT
        kept[2].close()
        time.sleep(0.05)
        free = free_pair()
        draws = iter([p - LOWEST for p in held] + [p - 1 - LOWEST for p in held] + [free - LOWEST])
        monkeypatch.setattr(module, "_urandom_below", lambda _n: next(draws))
        monkeypatch.setattr(module, "_read_here", lambda: pytest.fail("the socket list was read"))

        # WHEN
        choice = choose_port(LocalBackend(), "localhost", environ=os.environ)

        # THEN each held port, and the port before it (whose hub it is), was passed over
        assert (free, True) == (choice.port, choice.chosen)
        assert f"chosen at apply time: free on localhost with popdist's hub port {free + 1}" == choice.reason
        assert [False] * 4 == [module._bindable(p) for p in held]
    finally:
        for sock in (a, b, c, d, *kept):
            sock.close()
