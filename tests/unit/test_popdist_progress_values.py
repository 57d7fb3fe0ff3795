"""
popdist.progress with hostile values, keys and file descriptors, from many threads, to IPv6 and to names.

Every datagram is read by the strict parser of ``test_popdist_progress``; every call must return
None whatever it was given. The socket tricks (``dup2`` of a file or of another socket onto
popdist's descriptor) are done in this process, on real descriptors.
"""

from __future__ import annotations

import fractions
import os
import socket
import threading
import time
from collections.abc import Iterator
from decimal import Decimal

import numpy as np
import pytest
import torch

import popdist
from popdist import _contract, _progress
from tests.unit.test_popdist_progress import TOKEN, Clock, Receiver, fence, open_channel, strict_parse

HEAD = b"PRP1 " + TOKEN.encode() + b" "


@pytest.fixture
def channel(monkeypatch) -> Iterator[tuple[Receiver, Clock]]:
    """A receiver, popdist's variables naming it, a fresh sender in this process, and the test clock."""
    with open_channel(monkeypatch) as opened:
        yield opened


class Hostile:
    """Every conversion raises: ``__float__``, ``__index__``, ``__str__``, ``__repr__``, ``__eq__``, ``__bool__``."""

    def __float__(self) -> float:
        raise RuntimeError("float")

    def __index__(self) -> int:
        raise RuntimeError("index")

    def __str__(self) -> str:
        raise RuntimeError("str")

    def __repr__(self) -> str:
        raise RuntimeError("repr")

    def __eq__(self, other: object) -> bool:
        raise RuntimeError("eq")

    def __ne__(self, other: object) -> bool:
        raise RuntimeError("ne")

    def __bool__(self) -> bool:
        raise RuntimeError("bool")

    __hash__ = object.__hash__


class BadIndex:
    """``__index__`` returns a bool (an int subclass): popdist must still send a plain number."""

    def __index__(self) -> int:
        return True  # noqa: PLE0305 - the point: an int subclass


class HostileKey(str):
    """A key whose own ``__str__`` and slicing raise (the characters are what the key holds)."""

    __slots__ = ()

    def __str__(self) -> str:
        raise RuntimeError("str")

    def __getitem__(self, item: object) -> str:
        raise RuntimeError("getitem")


VALUES = [float("nan"), float("inf"), -float("inf"), -0.0, 10**400, -(10**400), 2**63, 2**62, True, False, Decimal("1.5"),
          Decimal("NaN"), Decimal("sNaN"), Decimal("1e999"), fractions.Fraction(1, 3), np.int64(5), np.float32(0.5),
          np.float64("nan"), np.bool_(1), np.array([1.0, 2.0]), torch.tensor(2.5), torch.tensor([1, 2]),
          torch.tensor(3), Hostile(), BadIndex(), "12", b"12", "x" * 10_000, None, complex(1, 2), [1, 2], object()]
IDS = [f"{type(v).__name__}-{i}" for i, v in enumerate(VALUES)]


def one(receiver: Receiver) -> dict[str, object]:
    """Return the one datagram the call before sent."""
    fence(receiver.port)
    got = receiver.until_fence()
    assert 1 == len(got), got
    return got[0]


@pytest.mark.parametrize("value", VALUES, ids=IDS)
def test_any_value_as_step_total_step_time_or_metric_sends_one_well_formed_datagram(channel, value):
    """Each hostile value in every place: the call returns None and its datagram is well formed."""
    receiver, clock = channel
    calls = [lambda: popdist.progress(value), lambda: popdist.progress(1, value), lambda: popdist.progress(1, 5, step_time=value),
             lambda: popdist.progress(1, 5, loss=value), lambda: popdist.progress(value, value, step_time=value, m=value)]
    for call in calls:
        clock.advance(0.2)
        assert call() is None
        one(receiver)


@pytest.mark.parametrize(("value", "expected"), [
    (float("nan"), None), (float("inf"), None), (-0.0, -0.0), (10**400, None), (2**63, float(2**63)), (True, 1),
    (Decimal("1.5"), 1.5), (Decimal("NaN"), None), (Decimal("sNaN"), None), (fractions.Fraction(1, 4), 0.25),
    (np.int64(5), 5), (np.float32(0.5), 0.5), (np.bool_(1), 1), (torch.tensor(2.5), 2.5), (torch.tensor(3), 3),
    (Hostile(), None), ("x" * 100, "x" * 64), ('a"\n\x00\u00e9\U0001f600', 'a"\n\x00\u00e9\U0001f600'),
    (None, None), ([1, 2], "<list of 2>"), (b"\x00ab", "b'\\x00ab'"), (bytearray(10**6), "b'" + "\\x00" * 15 + "\\x"),
])
def test_metric_values_become_numbers_null_or_short_strings(channel, value, expected):
    """A metric is a finite number, null (NaN, infinities, unprintable) or its text cut to 64 characters."""
    receiver, _ = channel

    popdist.progress(1, metric=value)

    assert {"metric": expected} == one(receiver)["m"]


def test_a_metric_of_ten_million_items_costs_what_a_small_one_does(channel):
    """A list, dict or string of 10**7 items as a metric: sent as a short text, without walking it."""
    receiver, clock = channel
    huge = list(range(10**7))
    values = [huge, dict.fromkeys(huge), set(huge), "y" * 10**7, bytes(10**7)]
    popdist.progress(0)
    one(receiver)
    for value in values:
        clock.advance(0.2)
        began = time.perf_counter()
        popdist.progress(1, big=value)
        assert time.perf_counter() - began < 0.05  # walking 10**7 items would take seconds
    fence(receiver.port)

    assert ["<list of 10000000>", "<dict of 10000000>", "<set of 10000000>", "y" * 64, "b'" + "\\x00" * 15 + "\\x"] == [
        d["m"]["big"] for d in receiver.until_fence()]


def test_a_call_that_comes_while_the_sender_is_being_made_is_dropped_not_a_second_sender(channel, monkeypatch):
    """A call from inside the sender's making (as a signal handler's would be): dropped; the first call's sender is kept."""
    receiver, _ = channel
    made, real = [], _progress._configure

    def configure(env):
        made.append(popdist.progress(99))  # re-entered: returns at once, makes nothing
        return real(env)

    monkeypatch.setattr(_progress, "_configure", configure)

    popdist.progress(1)

    assert [None] == made
    assert [1] == [d["s"] for d in receiver.receive(1)]
    assert _progress._SENDER and not _progress._STARTING.locked()


@pytest.mark.parametrize(("step", "total", "expected"), [
    (5, 10, (5, 10)), (5.5, 10.0, (5.5, 10)), (5, 10.5, (5, None)), (5, -1, (5, None)), (5, 2**31, (5, None)),
    (True, True, (1, 1)), (np.int32(3), np.int64(7), (3, 7)), (Decimal(2), Decimal("4.0"), (2.0, 4)), (5, "10", (5, None)),
    (2**64, 2**64, (float(2**64), None)), (-3, 0, (-3, 0)), (-0.0, None, (-0.0, None)),
])
def test_steps_and_totals_are_numbers_poprun_reads(channel, step, total, expected):
    """A step is an int or a finite float; a total a whole number from 0 to 2**31-1, else null."""
    receiver, _ = channel

    popdist.progress(step, total)

    got = one(receiver)
    assert expected == (got["s"], got["n"])
    assert type(expected[0]) is type(got["s"])


def test_a_hundred_thousand_metrics_fill_one_datagram_and_the_rest_are_counted(channel):
    """100,000 metrics: as many as fit in 1,400 bytes, in the order given, and ``x`` counts the rest."""
    receiver, _ = channel
    metrics = {f"metric_{i}": i * 0.5 for i in range(100_000)}

    popdist.progress(1, 2, **metrics)

    raw = receiver.raw(1)[0]
    got = strict_parse(raw)
    assert 1300 < len(raw) <= 1400
    assert list(got["m"]) == [f"metric_{i}" for i in range(len(got["m"]))]
    assert 100_000 == len(got["m"]) + got["x"]


def test_huge_repeated_and_strange_keys_are_cut_escaped_and_never_repeated(channel):
    """A key of a million characters is cut to 64; one that repeats another after the cut is left out (counted)."""
    receiver, _ = channel
    long_a, long_b = "k" * 1_000_000, "k" * 64 + "other"
    strange = 'q"\\\n\x00\u2028\U0001f600' + "$(id)"

    popdist.progress(1, **{long_a: 1, long_b: 2, strange: 3, HostileKey("hostile"): 4})

    got = one(receiver)
    assert {"k" * 64: 1, strange: 3, "hostile": 4} == got["m"]
    assert 1 == got["x"]


def test_keys_that_are_not_strings_are_made_strings_or_left_out():
    """The datagram builder given a mapping with non-string keys (``**metrics`` cannot carry them): str() or counted."""
    state = (1, 1.0, 1, None, None, {1: 1.0, (2, 3): "a", None: 2, Hostile(): 5, b"b": 6})

    got = strict_parse(_progress.datagram(HEAD, 0, 0, state, 1))

    assert ({"1": 1.0, "<tuple of 2>": "a", "None": 2, "b'b'": 6}, 1) == (got["m"], got["x"])


def test_the_sender_never_writes_into_a_file_the_program_put_on_its_descriptor(channel, tmp_path):
    """``dup2`` of a file onto popdist's socket descriptor: the file stays empty, popdist opens a socket of its own."""
    receiver, clock = channel
    popdist.progress(1)
    one(receiver)
    sender = _progress._SENDER
    assert sender and sender.sock is not None
    number = sender.sock.fileno()
    path = tmp_path / "program.log"
    with path.open("wb") as file:
        os.dup2(file.fileno(), number)
    clock.advance(0.2)

    popdist.progress(2)

    assert [2] == [d["s"] for d in receiver.receive(1)]
    assert sender.sock is not None and sender.sock.fileno() != number
    os.close(number)  # the program's (the test's) own descriptor: still open, and still the file
    assert b"" == path.read_bytes()


def test_the_sender_never_sends_through_a_socket_the_program_put_on_its_descriptor(channel):
    """``dup2`` of the program's own connected UDP socket onto popdist's descriptor: nothing reaches that socket's peer."""
    receiver, clock = channel
    popdist.progress(1)
    one(receiver)
    sender = _progress._SENDER
    assert sender and sender.sock is not None
    theirs, peer = socket.socket(socket.AF_INET, socket.SOCK_DGRAM), Receiver()
    theirs.connect(("127.0.0.1", peer.port))
    number = sender.sock.fileno()
    os.dup2(theirs.fileno(), number)
    clock.advance(0.2)

    popdist.progress(2)
    os.write(number, b"the program's own")  # through the descriptor popdist gave up: it still is the program's socket

    assert [2] == [d["s"] for d in receiver.receive(1)]
    assert [b"the program's own"] == peer.raw(2, within_s=1.0)
    os.close(number)
    theirs.close()
    peer.close()


def test_a_closed_descriptor_is_forgotten_and_a_new_socket_opened(channel):
    """The program closes popdist's descriptor: the next send opens another socket, never closing a stranger's."""
    receiver, clock = channel
    popdist.progress(1)
    sender = _progress._SENDER
    assert sender and sender.sock is not None
    os.close(sender.sock.fileno())
    clock.advance(0.2)

    popdist.progress(2)

    assert [1, 2] == [d["s"] for d in receiver.receive(2)]


def test_a_child_forked_without_exec_sends_its_own_calls_never_the_parents_waiting_state(channel):
    """fork() while the parent holds an unsent call: the child's first call goes at once with c=1; the parent's stays its own."""
    receiver, clock = channel
    popdist.progress(1, 10)
    clock.advance(0.05)
    popdist.progress(2, 10)  # waits, coalesced

    pid = os.fork()
    if pid == 0:  # the child: one call, then it exits through atexit (its own state only)
        code = 1
        try:
            popdist.progress(7, 10, child=1)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    clock.advance(0.2)
    popdist.progress(3, 10)

    assert 0 == status
    got = receiver.receive(3)
    assert [(1, 1), (7, 1), (3, 2)] == [(d["s"], d["c"]) for d in got]
    assert [{}, {"child": 1}, {}] == [d.get("m", {}) for d in got]


def test_thirty_two_threads_at_once_lose_no_call_and_send_within_the_rate(channel, monkeypatch):
    """32 threads x 2,000 calls on the real clock: every datagram well formed, the counts add up to every call."""
    receiver, _ = channel
    monkeypatch.setattr(_progress, "_time", _real_time())
    start = threading.Barrier(32)

    def work(index: int) -> None:
        start.wait()
        for step in range(2000):
            popdist.progress(step, 2000, thread=index)
            if step % 100 == 0:
                popdist.heartbeat()

    threads = [threading.Thread(target=work, args=(i,)) for i in range(32)]
    popdist.heartbeat()  # the sender is made first: calls that come while it is being made are dropped, by design
    began = _real_time()()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = _real_time()() - began
    _progress._SENDER.last = float("-inf")  # type: ignore[union-attr] # the next call sends, whatever the clock
    popdist.heartbeat()
    fence(receiver.port)

    got = receiver.until_fence()
    assert 1 + 32 * 2000 + 32 * 20 + 1 == sum(d["c"] for d in got)
    assert len(got) <= 10 * seconds + 3 + 32 + 1  # each thread's last step may be forced once


def _real_time():
    import time

    return time.time


def test_ipv6_addresses_in_brackets_are_reached(channel, monkeypatch):
    """``[::1]:PORT``: an IPv6 socket, the datagram arrives."""
    receiver = Receiver(socket.AF_INET6, "::1")
    monkeypatch.setenv(_contract.PROGRESS, f"[::1]:{receiver.port}")

    popdist.progress(3, 4)

    assert [(3, 4)] == [(d["s"], d["n"]) for d in receiver.receive(1)]
    receiver.close()


def test_a_host_name_is_resolved_once_off_the_caller_and_never_again(channel, monkeypatch):
    """``localhost:PORT`` with a resolver that hangs: calls return meanwhile; one look-up serves every later call."""
    receiver, clock = channel
    looked_up: list[tuple[object, ...]] = []
    real, answer, resolved = socket.getaddrinfo, threading.Event(), threading.Event()

    def slow_resolver(*args: object, **kwargs: object) -> object:  # the real resolver, held back until the test says
        looked_up.append(args[:2])
        if kwargs.get("flags", 0) & socket.AI_NUMERICHOST:
            return real(*args, **kwargs)  # type: ignore[arg-type]
        answer.wait(60)
        try:
            return real(*args, **kwargs)  # type: ignore[arg-type]
        finally:
            resolved.set()

    monkeypatch.setattr(socket, "getaddrinfo", slow_resolver)
    monkeypatch.setenv(_contract.PROGRESS, f"localhost:{receiver.port}")
    for step in range(10):  # all while the look-up hangs
        clock.advance(0.2)
        popdist.progress(step)
    answer.set()
    assert resolved.wait(60)
    for step in range(10, 200):
        clock.advance(0.2)
        popdist.progress(step)

    got = receiver.receive(190, within_s=20)
    assert [("localhost", receiver.port)] * 2 == looked_up  # the numeric try, then the name, once
    assert (list(range(10, 200)), 11) == ([d["s"] for d in got], got[0]["c"])


def test_a_name_that_does_not_resolve_turns_progress_off(channel, monkeypatch):
    """A host that does not resolve: progress is off for the process (no look-up on later calls)."""
    monkeypatch.setenv(_contract.PROGRESS, "no-such-host.invalid:4000")
    popdist.progress(0)
    sender = _progress._SENDER
    for _ in range(2000):
        if _progress._SENDER is False:
            break
        threading.Event().wait(0.01)

    popdist.progress(1)

    assert sender is not False and _progress._SENDER is False


def test_a_datagram_is_never_over_1400_bytes_with_the_longest_fields():
    """The longest numbers in every field and 64-character strings: at most 1,400 bytes, well formed."""
    metrics = {"\U0001f600" * 64 + str(i): "\U0001f600" * 64 for i in range(100)}
    state = (1, -1.2345678901234567e-300, -1.2345678901234567e+300, 2**31 - 1, 1.2345678901234567e+300, metrics)

    raw = _progress.datagram(HEAD, 2**31 - 1, 2**31 - 1, state, 2**40)

    got = strict_parse(raw)
    assert (2**31 - 1, 2**31 - 1, 2**31 - 1) == (got["i"], got["a"], got["c"])
    assert 100 == len(got.get("m", {})) + got["x"]
