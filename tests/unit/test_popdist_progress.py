"""
popdist.progress and popdist.heartbeat in this process: the environment, the coalescing, the socket.

Every datagram is received on a real UDP socket and read by :func:`strict_parse`, a parser of
wire format 1 written from the contract (not from popdist's code) that refuses anything loose:
non-canonical JSON, unknown or missing keys, out-of-range values. The clock popdist reads is a
test clock (``_progress._time``), so that coalescing is tested without timing; a *fence* (a
datagram sent through popdist's own socket after the calls) tells when everything sent before
has arrived. The other test modules of popdist's progress import these helpers.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

import popdist
from popdist import _contract, _progress

TOKEN = "0123456789abcdef0123456789abcdef"  # noqa: S105 - a test run's token
MAX_COUNT = 2**31 - 1
FENCE = b"FENCE"
KEYS = {"i", "a", "k", "s", "n", "t", "c", "d", "m", "x"}


def strict_parse(datagram: bytes, token: str = TOKEN) -> dict[str, object]:
    """Return the JSON object of a wire-format-1 datagram; raise AssertionError on any departure from the format."""
    head = b"PRP1 " + token.encode() + b" "
    assert len(datagram) <= 1400, len(datagram)
    assert datagram.startswith(head), datagram[:40]
    body = datagram[len(head):].decode("ascii")
    assert all(" " < ch <= "~" or ch == " " for ch in body), body
    data = json.loads(body, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    assert isinstance(data, dict)
    assert body == json.dumps(data, separators=(",", ":"), ensure_ascii=True, allow_nan=False), body
    assert set(data) <= KEYS, data
    for key in ("i", "a"):
        assert _is_int(data[key], 0), data
    assert data["k"] in {"p", "h"}, data
    if data["k"] == "p":
        assert _is_number(data["s"]), data
        assert data["n"] is None or _is_int(data["n"], 0), data
    else:
        assert "s" not in data and "n" not in data, data
    assert type(data["t"]) is float and math.isfinite(data["t"]), data
    assert _is_int(data["c"], 1), data
    if "d" in data:
        assert type(data["d"]) is float and math.isfinite(data["d"]) and data["d"] >= 0, data
    if "m" in data:
        metrics = data["m"]
        assert isinstance(metrics, dict) and metrics, data
        for name, value in metrics.items():
            assert isinstance(name, str) and len(name) <= 64, name
            assert value is None or _is_number(value) or (type(value) is str and len(value) <= 64), (name, value)
    if "x" in data:
        assert _is_int(data["x"], 1), data
    return data


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    keys = [key for key, _ in pairs]
    assert len(keys) == len(set(keys)), keys
    return dict(pairs)


def _no_constant(name: str) -> object:
    raise AssertionError(f"{name} in a datagram")


def _is_int(value: object, least: int) -> bool:
    return type(value) is int and least <= value <= MAX_COUNT


def _is_number(value: object) -> bool:
    return (type(value) is int and abs(value) <= 2**63) or (type(value) is float and math.isfinite(value))


class Clock:
    """The time popdist reads: advanced by the test, never by the machine."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class Receiver:
    """A real UDP socket that receives what popdist sends, and reads it strictly."""

    def __init__(self, family: int = socket.AF_INET, host: str = "127.0.0.1") -> None:
        self.sock = socket.socket(family, socket.SOCK_DGRAM)
        self.sock.bind((host, 0))
        self.port = int(self.sock.getsockname()[1])

    def receive(self, count: int, *, within_s: float = 20.0) -> list[dict[str, object]]:
        """Return the next ``count`` datagrams, parsed (waiting up to ``within_s`` for them)."""
        return [strict_parse(raw) for raw in self.raw(count, within_s=within_s)]

    def raw(self, count: int, *, within_s: float = 20.0) -> list[bytes]:
        """Return the next ``count`` datagrams as they came."""
        got: list[bytes] = []
        deadline = time.monotonic() + within_s
        while len(got) < count:
            self.sock.settimeout(max(deadline - time.monotonic(), 0.001))
            try:
                got.append(self.sock.recv(65536))
            except TimeoutError:
                break
        return got

    def until_fence(self, *, within_s: float = 20.0) -> list[dict[str, object]]:
        """Return every datagram that came before the fence (see :func:`fence`), parsed."""
        got: list[dict[str, object]] = []
        deadline = time.monotonic() + within_s
        while True:
            self.sock.settimeout(max(deadline - time.monotonic(), 0.001))
            raw = self.sock.recv(65536)  # TimeoutError: the fence never came
            if raw == FENCE:
                return got
            got.append(strict_parse(raw))

    def close(self) -> None:
        self.sock.close()


def fence(port: int) -> None:
    """Send the fence through popdist's own socket: it arrives after everything popdist sent before it."""
    sender = _progress._SENDER
    assert sender and sender.sock is not None and sender.address is not None
    sender.sock.sendto(FENCE, sender.address)


@pytest.fixture
def channel(monkeypatch) -> Iterator[tuple[Receiver, Clock]]:
    """A receiver, popdist's variables naming it, a fresh sender in this process, and the test clock."""
    with open_channel(monkeypatch) as opened:
        yield opened


@contextlib.contextmanager
def open_channel(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Receiver, Clock]]:
    """Make what :func:`channel` gives (the other modules' fixtures call this)."""
    receiver, clock = Receiver(), Clock()
    for name in (_contract.INSTANCE_INDEX, _contract.RESTART_COUNT, "OMPI_COMM_WORLD_RANK", "SLURM_SRUN_COMM_HOST",
                 "SSH_CONNECTION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(_contract.PROGRESS, f"127.0.0.1:{receiver.port}")
    monkeypatch.setenv(_contract.PROGRESS_TOKEN, TOKEN)
    monkeypatch.setenv(_contract.INSTANCE_INDEX, "2")
    monkeypatch.setenv(_contract.RESTART_COUNT, "1")
    monkeypatch.setattr(_progress, "_time", clock)
    monkeypatch.setattr(_progress, "_SENDER", None)
    monkeypatch.setattr(_progress, "_OWN", False)
    yield receiver, clock
    if _progress._SENDER:
        _progress._SENDER.release()
    receiver.close()


def test_the_names_are_exported_and_imported_on_first_use():
    """``progress`` and ``heartbeat`` are in popdist's pinned ``__all__`` and come from popdist._progress."""
    assert {"progress", "heartbeat"} <= set(popdist.__all__)
    assert (_progress.progress, _progress.heartbeat) == (popdist.progress, popdist.heartbeat)
    assert {"progress", "heartbeat"} <= set(dir(popdist))


def test_import_popdist_loads_nothing_of_progress_and_a_call_without_poprun_no_socket():
    """``import popdist`` does not import popdist._progress; calls without POPRUN_PROGRESS import no socket or json."""
    code = ("import sys, popdist; before = '_progress' in sys.modules or 'popdist._progress' in sys.modules\n"
            "popdist.progress(1, 2, loss=0.5); popdist.heartbeat()\n"
            "print(before, [m for m in ('socket', 'json', 'threading') if m in sys.modules])")
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("POPRUN_", "POPDIST_"))}

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=environ)

    assert "False []\n" == done.stdout


def test_without_poprun_every_call_is_a_no_op(monkeypatch):
    """Without POPRUN_PROGRESS the sender is off after the first call, and calls return None."""
    monkeypatch.delenv(_contract.PROGRESS, raising=False)
    monkeypatch.setattr(_progress, "_SENDER", None)

    results = [popdist.progress(1, 10), popdist.heartbeat(), popdist.progress(2)]

    assert [None, None, None] == results
    assert _progress._SENDER is False


@pytest.mark.parametrize("value", [
    "", "host", "127.0.0.1", "127.0.0.1:", ":0", ":65536", ":99999999", "::1:5000", "[::1]", "[::1]5000", "[]:5000",
    "[::1]:x", "127.0.0.1:+80", "127.0.0.1: 80", "127.0.0.1:8_0", ":\uff18\uff10", "a]:80", "[a:80", "[[::1]]:80",
])
def test_a_malformed_address_turns_progress_off(channel, monkeypatch, value):
    """A POPRUN_PROGRESS that is not HOST:PORT, [ADDR]:PORT or :PORT is no progress, never an error."""
    monkeypatch.setenv(_contract.PROGRESS, value)

    popdist.progress(1, 2)

    assert _progress._SENDER is False


@pytest.mark.parametrize(("variable", "value"), [
    (_contract.PROGRESS_TOKEN, ""), (_contract.PROGRESS_TOKEN, TOKEN.upper()), (_contract.PROGRESS_TOKEN, TOKEN[:-1]),
    (_contract.PROGRESS_TOKEN, TOKEN + "0"), (_contract.PROGRESS_TOKEN, "g" * 32), (_contract.PROGRESS_TOKEN, "$(id)" * 7),
    (_contract.INSTANCE_INDEX, "-1"), (_contract.INSTANCE_INDEX, str(2**31)), (_contract.RESTART_COUNT, str(2**31)),
])
def test_a_bad_token_index_or_attempt_turns_progress_off(channel, monkeypatch, variable, value):
    """A token that is not 32 lowercase hex characters, or an index or attempt poprun would refuse: no progress."""
    monkeypatch.setenv(variable, value)

    popdist.progress(1, 2)

    assert _progress._SENDER is False


@pytest.mark.parametrize(("value", "env", "expected"), [
    ("10.1.2.3:4000", {}, ("10.1.2.3", 4000)),
    ("[fe80::1%eth0]:65535", {}, ("fe80::1%eth0", 65535)),
    (" host-a:1 ", {}, ("host-a", 1)),
    (":4000", {"SLURM_SRUN_COMM_HOST": "10.9.9.9", "SSH_CONNECTION": "10.0.0.1 5 10.0.0.2 22"}, ("10.9.9.9", 4000)),
    (":4000", {"SSH_CONNECTION": "10.0.0.1 5 10.0.0.2 22"}, ("10.0.0.1", 4000)),
    (":4000", {"SSH_CONNECTION": "::1 5 ::1 22"}, ("::1", 4000)),
    (":4000", {"SSH_CONNECTION": " "}, ("127.0.0.1", 4000)),
    (":4000", {}, ("127.0.0.1", 4000)),
])
def test_the_address_and_where_poprun_is_when_it_did_not_say(value, env, expected):
    """``:PORT`` is sent to $SLURM_SRUN_COMM_HOST, else $SSH_CONNECTION's client, else 127.0.0.1."""
    assert expected == _progress.parse_address(value, env)


def test_the_first_call_sends_at_once_and_names_the_instance_and_attempt(channel):
    """The first call is one datagram: instance 2, attempt 1, its step, total, time, one call and metrics."""
    receiver, clock = channel

    popdist.progress(7, 200, step_time=0.25, loss=0.5, name="run-a", ok=True)

    assert [{"i": 2, "a": 1, "k": "p", "s": 7, "n": 200, "t": clock.now, "c": 1, "d": 0.25,
             "m": {"loss": 0.5, "name": "run-a", "ok": 1}}] == receiver.receive(1)


def test_calls_within_a_tenth_of_a_second_are_coalesced_into_the_next_send(channel):
    """1,000 calls within 0.1 s after a send wait; the next call after 0.1 s sends the latest, counting all."""
    receiver, clock = channel
    popdist.progress(0, 2000)
    for step in range(1, 1001):
        clock.advance(0.00005)
        popdist.progress(step, 2000, loss=step)
    latest = clock.now
    clock.advance(0.1)

    popdist.progress(1001, 2000, loss=1001)
    fence(receiver.port)

    got = receiver.until_fence()
    assert [(0, 1), (1001, 1001)] == [(d["s"], d["c"]) for d in got]
    assert (clock.now, {"loss": 1001}) == (got[1]["t"], got[1]["m"])
    assert latest < clock.now


def test_the_state_waiting_is_the_latest_call_and_exit_sends_it(channel):
    """A call that waits replaces the one before it; the exit handler sends the last one with its count."""
    receiver, clock = channel
    popdist.progress(1, 10)
    clock.advance(0.01)
    popdist.progress(2, 10, loss=2.0)
    clock.advance(0.01)
    popdist.progress(3, 10, loss=3.0)
    when = clock.now

    clock.advance(5.0)

    _progress._at_exit()

    assert [(1, 1, None), (3, 2, {"loss": 3.0}, when)] == [
        (d["s"], d["c"], d.get("m"), d["t"])[:3 if d["s"] == 1 else 4] for d in receiver.receive(2)]


def test_the_last_step_is_sent_at_once_but_at_most_once_a_second(channel):
    """``step == total`` sends without waiting for 0.1 s, once a second at most: ``progress(n, n)`` in a loop is no flood."""
    receiver, clock = channel
    popdist.progress(9, 10)
    clock.advance(0.01)
    popdist.progress(10, 10)
    for _ in range(50):  # within 0.1 s of the forced send: none of these sends
        clock.advance(0.001)
        popdist.progress(10, 10)
    clock.advance(0.5)
    popdist.progress(10, 10)  # a regular send (0.1 s passed)
    clock.advance(0.01)
    popdist.progress(11, 11)  # its own last step, but within a second of the forced one: waits
    clock.advance(1.0)
    popdist.progress(12, 12)
    fence(receiver.port)

    assert [(9, 1), (10, 1), (10, 51), (12, 2)] == [(d["s"], d["c"]) for d in receiver.until_fence()]


def test_at_most_ten_datagrams_a_second_whatever_the_calls(channel):
    """Calls every millisecond for 10 s of the test clock: about 100 datagrams, and their counts add up to the calls."""
    receiver, clock = channel
    for step in range(10_000):
        popdist.progress(step, None if step % 2 else step)  # every other call is its own last step
        popdist.heartbeat()
        clock.advance(0.001)
    _progress._at_exit()

    got = receiver.receive(1000, within_s=2.0)
    assert 100 <= len(got) <= 10 * 10 + 10 + 2
    assert 20_000 == sum(d["c"] for d in got)


def test_a_heartbeat_never_hides_progress_waiting_to_be_sent(channel):
    """A heartbeat after a coalesced progress call keeps that step (and its time) and adds its own count."""
    receiver, clock = channel
    popdist.heartbeat()
    clock.advance(0.01)
    popdist.progress(5, 10, loss=1.5)
    when = clock.now
    clock.advance(0.05)
    popdist.heartbeat()
    clock.advance(0.11)
    popdist.heartbeat()
    clock.advance(0.11)
    popdist.heartbeat()
    fence(receiver.port)

    got = receiver.until_fence()
    assert [("h", 1), ("p", 3), ("h", 1)] == [(d["k"], d["c"]) for d in got]
    assert (5, 10, when, {"loss": 1.5}) == (got[1]["s"], got[1]["n"], got[1]["t"], got[1]["m"])
    assert {"i", "a", "k", "t", "c"} == set(got[0])


def test_a_step_that_is_no_number_is_sent_as_a_heartbeat_with_its_metrics(channel):
    """NaN as the step: the instance is alive, its step unknown; its metrics still go."""
    receiver, _ = channel

    popdist.progress(float("nan"), 10, loss=0.25)

    assert [{"i": 2, "a": 1, "k": "h", "t": 1_000_000.0, "c": 1, "m": {"loss": 0.25}}] == receiver.receive(1)


def test_a_clock_that_jumps_back_does_not_stop_the_sends(channel):
    """The wall clock set back an hour: the next call sends (it is not 'within 0.1 s' of the last send)."""
    receiver, clock = channel
    popdist.progress(1)
    clock.advance(-3600.0)

    popdist.progress(2)
    clock.advance(0.01)
    popdist.progress(3)
    fence(receiver.port)

    assert [1, 2] == [d["s"] for d in receiver.until_fence()]


def test_poprun_gone_is_dropped_datagrams_and_the_next_receiver_gets_them(channel, monkeypatch):
    """The receiver closes (ICMP port unreachable comes back): calls go on; a receiver on the same port hears again."""
    receiver, clock = channel
    port = receiver.port
    popdist.progress(0)
    receiver.close()
    for step in range(1, 51):
        clock.advance(0.2)
        popdist.progress(step)  # each one sends, into a closed port
    again = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    again.bind(("127.0.0.1", port))
    monkeypatch.setattr(channel[0], "sock", again)
    clock.advance(0.2)

    popdist.progress(51)

    assert [51] == [d["s"] for d in channel[0].receive(1)]
