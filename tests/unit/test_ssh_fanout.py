"""The ssh fan-out window (poprun.backends.ssh.fanout): bounded concurrency, repeated probes, final failures, slow hosts."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from poprun.backends.ssh import fanout
from poprun.backends.ssh.fanout import FANOUT, Connected, _attempts_for, _connected, default_window, open_connections

# A stand-in for `ssh ... -f -N HOST`: what it does is decided by the host's name, and it keeps a
# count of how many run at once (a directory entry per running one) and of its attempts per host.
FAKE = r"""#!/bin/sh
host=$1; dir=$2
: > "$dir/run.$$"
n=$(ls "$dir" | grep -c '^run\.')
echo "$n" >> "$dir/concurrency"
echo x >> "$dir/tries.$host"
tries=$(wc -l < "$dir/tries.$host")
finish() { rm -f "$dir/run.$$"; }
case $host in
  ok*) sleep 0.1; finish; exit 0;;
  refused*) finish; echo "ssh: connect to host $host port 22: Connection refused" >&2; exit 255;;
  reset-once*) if [ "$tries" -lt 2 ]; then finish; echo "kex_exchange_identification: read: Connection reset by peer" >&2; exit 255; fi; finish; exit 0;;
  reset*) finish; echo "kex_exchange_identification: Connection closed by remote host" >&2; exit 255;;
  banner*) finish; echo "Connection timed out during banner exchange" >&2; exit 255;;
  syn*) finish; echo "ssh: connect to host $host port 22: Connection timed out" >&2; exit 255;;
  mute*) finish; exec sleep 30;;
  weird*) finish; echo "something else" >&2; exit 255;;
esac
"""


@pytest.fixture
def fake(tmp_path: Path):
    script = tmp_path / "ssh"
    script.write_text(FAKE)
    script.chmod(0o755)
    state = tmp_path / "state"
    state.mkdir()

    def start(host: str, slot: int) -> subprocess.Popen[bytes]:
        return subprocess.Popen([str(script), host, str(state)], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)

    def tries(host: str) -> int:
        path = state / f"tries.{host}"
        return len(path.read_text().splitlines()) if path.exists() else 0

    def most_at_once() -> int:
        return max(int(line) for line in (state / "concurrency").read_text().split())

    start.tries = tries  # type: ignore[attr-defined]
    start.most_at_once = most_at_once  # type: ignore[attr-defined]
    return start


def test_no_more_connections_are_opened_at_once_than_the_window(fake) -> None:
    hosts = [(f"ok{i}", 0) for i in range(12)]
    failed, opened = open_connections(fake, hosts, window=3, timeout_s=10)

    assert ({}, 12) == (failed, len(opened))
    assert fake.most_at_once() <= 3


def test_every_connection_is_opened_at_once_with_a_window_as_large(fake) -> None:
    hosts = [(f"ok{i}", 0) for i in range(6)]
    _, opened = open_connections(fake, hosts, window=6, timeout_s=10)

    assert 6 == len(opened)
    assert fake.most_at_once() >= 2  # they overlapped


def test_a_refused_connection_is_final_at_once(fake) -> None:
    failed, opened = open_connections(fake, [("refused1", 0), ("ok1", 0)], window=4, timeout_s=10)

    assert ["refused1"] == list(failed)
    assert (255, 1) == (failed["refused1"][0], fake.tries("refused1"))
    assert "Connection refused" in failed["refused1"][1]
    assert ["ok1"] == list(opened)


def test_a_tcp_connect_time_out_is_final_at_once(fake) -> None:
    failed, _ = open_connections(fake, [("syn1", 0)], window=4, timeout_s=10)

    assert ("syn1" in failed, fake.tries("syn1")) == (True, 1)


def test_a_reset_during_the_key_exchange_is_tried_again_and_then_connects_as_slow(fake) -> None:
    failed, opened = open_connections(fake, [("reset-once1", 0)], window=4, timeout_s=10)

    assert {} == failed
    assert (2, 2, True) == (fake.tries("reset-once1"), opened["reset-once1"].attempts, opened["reset-once1"].slow)


def test_a_host_that_keeps_resetting_fails_after_its_attempts(fake) -> None:
    failed, _ = open_connections(fake, [("reset1", 0)], window=4, timeout_s=10)

    assert fanout.RESET_ATTEMPTS == fake.tries("reset1")
    assert "Connection closed" in failed["reset1"][1]


def test_a_banner_time_out_is_probed_once_more(fake) -> None:
    failed, _ = open_connections(fake, [("banner1", 0)], window=4, timeout_s=10)

    assert (fanout.TIMEOUT_ATTEMPTS, True) == (fake.tries("banner1"), "banner1" in failed)


def test_an_attempt_past_its_time_is_killed_probed_again_and_then_fails_with_minus_one(fake) -> None:
    failed, _ = open_connections(fake, [("mute1", 0), ("ok1", 0)], window=4, timeout_s=0.5)

    assert (-1, "no answer within 0.5 s") == failed["mute1"]
    assert fanout.TIMEOUT_ATTEMPTS == fake.tries("mute1")


def test_an_unknown_failure_is_not_repeated(fake) -> None:
    failed, _ = open_connections(fake, [("weird1", 0)], window=4, timeout_s=10)

    assert (1, "something else") == (fake.tries("weird1"), failed["weird1"][1].strip())


def test_a_host_with_several_connections_fails_as_a_whole(fake) -> None:
    failed, opened = open_connections(fake, [("ok1", 0), ("ok1", 1), ("refused1", 0), ("refused1", 1)],
                                      window=1, timeout_s=10)

    assert (["refused1"], ["ok1"]) == (list(failed), list(opened))
    assert 1 == fake.tries("refused1")  # its second connection is not tried once the host failed


def test_a_host_that_took_far_longer_than_the_median_is_slow() -> None:
    found = _connected({"a": (0.2, 1), "b": (0.3, 1), "c": (0.25, 1), "d": (4.0, 1)})

    assert {"d"} == {host for host, c in found.items() if c.slow}


def test_under_load_every_host_takes_long_and_none_is_slow() -> None:
    found = _connected({f"h{i}": (3.0 + i / 100, 1) for i in range(10)})

    assert not any(c.slow for c in found.values())


@settings(max_examples=50, deadline=None)
@given(st.dictionaries(st.text(min_size=1, max_size=4), st.tuples(st.floats(0, 100), st.integers(1, 4)), max_size=20))
def test_slow_hosts_are_those_retried_or_past_the_limit(times) -> None:
    found = _connected(times)
    ordered = sorted(s for s, _ in times.values())
    limit = max(fanout.SLOW_S, fanout.SLOW_FACTOR * ordered[len(ordered) // 2]) if ordered else 0

    assert set(found) == set(times)
    assert all(c.slow == (n > 1 or s > limit) for (s, n), c in zip(times.values(), found.values(), strict=True))


@pytest.mark.parametrize(("status", "err", "attempts"), [
    (255, "ssh: Could not resolve hostname nowhere: Name or service not known", 1),
    (255, "Permission denied (publickey).", 1),
    (255, "Host key verification failed.", 1),
    (255, "ssh: connect to host h port 22: No route to host", 1),
    (255, "ssh: connect to host h port 22: Connection timed out", 1),
    (255, "Connection timed out during banner exchange", fanout.TIMEOUT_ATTEMPTS),
    (-1, "no answer within 4.5 s", fanout.TIMEOUT_ATTEMPTS),
    (255, "kex_exchange_identification: read: Connection reset by peer", fanout.RESET_ATTEMPTS),
    (255, "Connection closed by 10.0.0.1 port 22", fanout.RESET_ATTEMPTS),
    (255, "", 1),
])
def test_which_failures_are_tried_again(status: int, err: str, attempts: int) -> None:
    assert attempts == _attempts_for(status, err)


def test_the_window_comes_from_the_environment_within_bounds(monkeypatch: pytest.MonkeyPatch) -> None:
    assert 5 == fanout.window({FANOUT: " 5 "})
    assert default_window() == fanout.window({})
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert fanout.MIN_WINDOW == default_window()
    monkeypatch.setattr(os, "cpu_count", lambda: 512)
    assert fanout.MAX_WINDOW == default_window()


@pytest.mark.parametrize("text", ["0", "-3", "1025", "eight", "1e3", "8 8"])
def test_a_window_out_of_range_says_so(text: str) -> None:
    with pytest.raises(ValueError, match=f"{FANOUT}=.* is not a whole number of connections from 1 to 1024"):
        fanout.window({FANOUT: text})


def test_connected_reads_as_its_fields() -> None:
    assert "Connected(seconds=1.500, attempts=2, slow=True)" == repr(Connected(1.5, 2, slow=True))
