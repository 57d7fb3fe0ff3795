"""
Opening many hosts' shared ssh connections: a bounded window, repeated probes, and each host's own clock.

Layer: ``poprun.backends``; standard library only (the ssh backend hands it the command that opens a connection).

What a connection costs is mostly CPU: OpenSSH 9's default key exchange (``sntrup761x25519``)
takes some 70 ms of the launching machine's CPU per connection and as much of the host's (see
docs/scale.md). Opened all at once, N connections share those cores, so each takes as long as
all of them together, and a fixed timeout turns a busy launcher into "unreachable" hosts. So:

- at most ``window`` connections are being opened at once (pdsh's ``fanout``; ``POPRUN_SSH_FANOUT``,
  by default four per core of this machine, from 8 to 64: past that the key exchanges only queue
  for the same cores, and each host waits longer);
- each host's timeout counts from the moment its own connection was opened, not from the start;
- a failure that says nothing about the host, a connection whose SSH greeting or key exchange timed
  out, or that was reset or closed during the key exchange (sshd drops connections past its
  ``MaxStartups``; a host may be busy), is tried again after a short pause: :data:`TIMEOUT_ATTEMPTS`
  attempts for a time-out, :data:`RESET_ATTEMPTS` for a reset. A refused connection, no route, an
  unknown name, a host key or permission problem is final at once, and so is a TCP connection
  that timed out (ssh's ``ConnectTimeout``: the kernel sent its SYN again meanwhile, and no host
  that is up leaves a SYN unanswered because its launcher or its sshd is busy). So a host is
  unreachable only when it truly does not answer.

A host that took much longer than the others, or more than one attempt, is *slow*: it is not a
failure, and the caller reports it with its time (:class:`Connected`).
"""

from __future__ import annotations

import heapq
import os
import random
import selectors
import subprocess
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence

FANOUT = "POPRUN_SSH_FANOUT"  # how many connections are being opened at once
MIN_WINDOW, PER_CORE, MAX_WINDOW = 8, 4, 64  # the default window: PER_CORE per core, within these bounds
TIMEOUT_ATTEMPTS = 2  # a connection that timed out is tried once more ("no answer to repeated probes")
RESET_ATTEMPTS = 4  # one reset or closed during the key exchange (sshd's MaxStartups), three times more
SLOW_S = 1.0  # a host is slow when it took longer than this and than SLOW_FACTOR times the median
SLOW_FACTOR = 3.0
_POLL_S = 0.05  # how often a connection whose error output stays open (a ProxyCommand's) is checked
_FINAL = ("could not resolve hostname", "name or service not known", "connection refused", "no route to host",
          "network is unreachable", "permission denied", "host key verification failed",
          "host identification has changed", "bad configuration", "no such file")
_RESET = ("connection reset", "connection closed", "kex_exchange_identification", "broken pipe")

__all__ = ["FANOUT", "Connected", "default_window", "open_connections", "window"]


class Connected:
    """How a host's connection was opened: ``seconds`` from its first attempt to success, ``attempts``, and whether it was ``slow``."""

    __slots__ = ("attempts", "seconds", "slow")

    def __init__(self, seconds: float, attempts: int, *, slow: bool = False) -> None:
        self.seconds, self.attempts, self.slow = seconds, attempts, slow

    def __repr__(self) -> str:
        return f"Connected(seconds={self.seconds:.3f}, attempts={self.attempts}, slow={self.slow})"


def default_window() -> int:
    """Return the window this machine gets by default: :data:`PER_CORE` per core, from :data:`MIN_WINDOW` to :data:`MAX_WINDOW`."""
    return min(MAX_WINDOW, max(MIN_WINDOW, PER_CORE * (os.cpu_count() or 1)))


def window(env: Mapping[str, str]) -> int:
    """
    Return how many connections are opened at once: ``POPRUN_SSH_FANOUT``, else :func:`default_window`.

    Raises:
        ValueError: when the variable is not a whole number from 1 to 1024 (the message says so).
    """
    text = env.get(FANOUT, "").strip()
    if not text:
        return default_window()
    if not (text.isascii() and text.isdigit() and len(text) <= 4) or not 1 <= int(text) <= 1024:  # noqa: PLR2004
        raise ValueError(f"{FANOUT}={text!r} is not a whole number of connections from 1 to 1024")
    return int(text)


def _attempts_for(status: int, err: str) -> int:
    """Return how many attempts a connection that failed so gets in all (1: final at once)."""
    text = err.lower()
    if any(word in text for word in _FINAL) or ("connect to host" in text and "timed out" in text):
        return 1  # a TCP connection that timed out was probed again already: the kernel sent its SYN again
    if status == -1 or "timed out" in text:
        return TIMEOUT_ATTEMPTS
    if any(word in text for word in _RESET):
        return RESET_ATTEMPTS
    return 1


class _Attempt:
    __slots__ = ("attempt", "err", "host", "open", "proc", "slot", "started")

    def __init__(self, host: str, slot: int, attempt: int, proc: subprocess.Popen[bytes]) -> None:
        self.host, self.slot, self.attempt, self.proc = host, slot, attempt, proc
        self.started, self.err, self.open = time.monotonic(), bytearray(), True  # open: its stderr has not ended


def open_connections(start: Callable[[str, int], subprocess.Popen[bytes]], connections: Sequence[tuple[str, int]], *,
                     window: int, timeout_s: float) -> tuple[dict[str, tuple[int, str]], dict[str, Connected]]:
    """
    Open the (host, slot) ``connections``, ``window`` at a time; return the failures and how each host that connected did.

    ``start(host, slot)`` starts the ssh command that opens one (its standard error a pipe; it
    exits 0 once connected). An attempt that has not ended ``timeout_s`` after it began is killed
    and counts as a time-out. The failures are ``{host: (ssh's status or -1, its error text)}``
    (the first failure of a host, once its attempts are spent); the rest is ``{host: Connected}``;
    both in the order of ``connections``.
    """
    with selectors.DefaultSelector() as selector:
        fan = _Fanout(start, selector, window=window, timeout_s=timeout_s)
        fan.queue.extend((host, slot, 1) for host, slot in dict.fromkeys(connections))
        while fan.queue or fan.later or fan.running:
            fan.step()
    hosts = list(dict.fromkeys(host for host, _ in connections))  # the answers in this order, whatever came first
    failed = {host: fan.failed[host] for host in hosts if host in fan.failed}
    return failed, _connected({host: (fan.done[host][0] - fan.first[host], fan.done[host][1])
                               for host in hosts if host in fan.done and host not in failed})


class _Fanout:
    """The state of :func:`open_connections`: what waits, what runs, what is done."""

    def __init__(self, start: Callable[[str, int], subprocess.Popen[bytes]], selector: selectors.BaseSelector, *,
                 window: int, timeout_s: float) -> None:
        self._start, self._selector, self._window, self._timeout_s = start, selector, window, timeout_s
        self.queue: deque[tuple[str, int, int]] = deque()  # (host, slot, attempt)
        self.later: list[tuple[float, int, str, int, int]] = []  # (when, order, host, slot, attempt): after a pause
        self.running: dict[int, _Attempt] = {}  # by the fd of its stderr
        self.first: dict[str, float] = {}  # host -> when its first connection was opened
        self.done: dict[str, tuple[float, int]] = {}  # host -> (when its last connection was up, most attempts)
        self.failed: dict[str, tuple[int, str]] = {}
        self._order = 0

    def step(self) -> None:
        """Start what the window has room for, wait a little for an end, and take the ends."""
        now = time.monotonic()
        while self.later and self.later[0][0] <= now:
            _, _, host, slot, attempt = heapq.heappop(self.later)
            self.queue.append((host, slot, attempt))
        while self.queue and len(self.running) < self._window:
            host, slot, attempt = self.queue.popleft()
            if host not in self.failed:
                self._open(host, slot, attempt)
        wait = min([_POLL_S, *(a.started + self._timeout_s - now for a in self.running.values()),
                    *((self.later[0][0] - now,) if self.later else ())])
        for key, _ in self._selector.select(max(0.0, wait)) if self.running else ():
            if not _read(self.running[key.fd]):
                self._selector.unregister(key.fd)
                self.running[key.fd].open = False
        if not self.running and self.later:
            time.sleep(max(0.0, min(_POLL_S, self.later[0][0] - time.monotonic())))
        for fd, att in list(self.running.items()):
            self._end(fd, att)

    def _open(self, host: str, slot: int, attempt: int) -> None:
        proc = self._start(host, slot)
        assert proc.stderr is not None
        os.set_blocking(proc.stderr.fileno(), False)
        self.running[proc.stderr.fileno()] = _Attempt(host, slot, attempt, proc)
        self.first.setdefault(host, time.monotonic())
        self._selector.register(proc.stderr.fileno(), selectors.EVENT_READ)

    def _end(self, fd: int, att: _Attempt) -> None:
        """Take the end of an attempt that ended or ran out of time (else leave it running)."""
        now = time.monotonic()
        status = att.proc.poll()
        if status is None:
            if now - att.started < self._timeout_s:
                return
            att.proc.kill()
            att.proc.wait()
            att.err += f"no answer within {self._timeout_s:g} s".encode()
            status = -1
        if att.open:
            _read(att)
            self._selector.unregister(fd)
        del self.running[fd]
        assert att.proc.stderr is not None
        att.proc.stderr.close()
        err = att.err.decode(errors="replace")
        if status == 0:
            was = self.done.get(att.host, (0.0, 0))
            self.done[att.host] = (max(was[0], now), max(was[1], att.attempt))
        elif att.attempt < _attempts_for(status, err):
            self._order += 1
            pause = 0.2 * 2 ** (att.attempt - 1) + random.uniform(0, 0.2)  # noqa: S311 - a spread, not a secret
            heapq.heappush(self.later, (now + pause, self._order, att.host, att.slot, att.attempt + 1))
        else:
            self.failed.setdefault(att.host, (status, err))


def _read(att: _Attempt) -> bool:
    """Read what the attempt's ssh wrote to its standard error so far (its reason, when it fails); return False at its end."""
    assert att.proc.stderr is not None
    try:
        while chunk := os.read(att.proc.stderr.fileno(), 65536):
            att.err += chunk[: max(0, 65536 - len(att.err))]
    except BlockingIOError:
        return True
    except OSError:
        return False
    return False


def _connected(times: Mapping[str, tuple[float, int]]) -> dict[str, Connected]:
    """Return each host's :class:`Connected`: slow when it took a retry, or over :data:`SLOW_S` and :data:`SLOW_FACTOR` times the median."""
    if not times:
        return {}
    ordered = sorted(seconds for seconds, _ in times.values())
    median = ordered[len(ordered) // 2]
    limit = max(SLOW_S, SLOW_FACTOR * median)
    return {host: Connected(seconds, attempts, slow=attempts > 1 or seconds > limit)
            for host, (seconds, attempts) in times.items()}
