"""
The progress channel's receiving end: a UDP socket and the thread that reads it into the run's :class:`~poprun.apply.progress.Board`.

Layer: ``poprun.apply``; imports :mod:`poprun.apply.progress`, :mod:`poprun.core.progress`,
:mod:`poprun.core.events`, ``popdist.env``'s names and the standard library (``_socket``, ``select``, ``hmac``
and ``json`` in its own thread, never on the launch path; ``ctypes`` and ``struct`` once strangers send to it,
``poprun.core.diagnostic`` when it warns); never the relay, the attempts or
:func:`~poprun.apply.apply`, which hand it what it needs (``emit``, ``write``). Imported only by a
run that listens (a run record, or a feature that reads the board; docs/progress.md).

:class:`Channel` opens its socket in its own thread, as the launch prepares (so its cost
overlaps the partition step and the MASTER_PORT), on 127.0.0.1 when every instance runs on
this machine, else dual-stack on ``::`` (IPv4 too, ``IPV6_V6ONLY`` off; 0.0.0.0 where the
kernel has no IPv6), on a port the kernel picks. :meth:`Channel.variables` gives each
instance's ``POPRUN_PROGRESS`` and the run's ``POPRUN_PROGRESS_TOKEN`` (:func:`addresses`).

The thread reads in batches; every datagram costs a bounded amount (at most 1,400 bytes are
looked at, a forged one only up to its token), and the thread keeps its own CPU time under
:data:`BUDGET` of the wall clock: past it, it sleeps to the end of the period while the kernel
drops what does not fit the socket's buffer. After :data:`FILTER_AFTER` datagrams of strangers
the socket gets a filter (classic BPF) that drops every datagram without the run's token in the
kernel, before it is queued: a flood then costs poprun nothing and crowds out none of the run's
own. What is dropped here (forged, malformed, stale, an index beyond the plan) is counted, and
the strangers' told once at the end (PR448).

About once a second (:data:`TICK_S`) it tells an ``instance-progress`` event for each instance
heard from since its last (its latest state: at most one a second per instance) and hands
``progress.json``'s data to ``write``; :meth:`Channel.attempt_ended` reads what is left in the
socket and tells every instance's last state of the attempt.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time

from popdist import env as names
from poprun.apply.progress import Board, StepSummary
from poprun.core.events import InstanceProgressed
from poprun.core.progress import MAGIC, MAX_DATAGRAM, InstanceProgress, parse
from poprun.core.threads import start_thread

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    import _socket
    from collections.abc import Callable, Mapping, Sequence

    from poprun.core.diagnostic import Diagnostic
    from poprun.core.events import Event
    from poprun.planner.plan import LaunchPlan

__all__ = ["BUDGET", "TICK_S", "Channel", "addresses", "forged", "here", "jumped", "progress_data", "unopened"]

TICK_S = 1.0  # events and progress.json at most this often
BUDGET = 0.1  # the share of one core the reading thread may take (over each PERIOD_S)
PERIOD_S = 0.1
BATCH = 256  # datagrams read before the budget and the clock are looked at again
RECEIVE_BUFFER = 4 << 20  # bytes asked of the kernel for the socket's buffer (bursts of many instances)
READY_S = 5.0  # the longest the launch waits for the socket to be made
_NAMED = 4  # hosts a warning names (then: and N more)
FILTER_AFTER = 64  # datagrams of strangers after which the socket gets a filter that drops theirs in the kernel
PROXIES = 256  # hosts whose ssh configuration is read for a jump host (ssh -G each), the first of the plan
_LOOPBACK = "127.0.0.1"


def addresses(here: Sequence[bool], port: int) -> dict[int, str]:
    """
    Return each instance's ``POPRUN_PROGRESS``: ``127.0.0.1:PORT`` for one on this machine, ``:PORT`` elsewhere.

    ``:PORT``: poprun cannot know by which address another host reaches it; the instance's side
    finds it (``$SLURM_SRUN_COMM_HOST``, the first field of ``$SSH_CONNECTION``; a host reached
    through an ssh relay is told the address its relay saw: docs/progress.md).
    """
    return {index: f"{_LOOPBACK}:{port}" if local else f":{port}" for index, local in enumerate(here)}


def here(plan: LaunchPlan) -> tuple[bool, ...]:
    """Return, by index, whether each instance of ``plan`` runs on this machine (as the error files say it: apply.errorfile)."""
    from poprun.core.localhost import is_this_machine

    everywhere = plan.offline or plan.backend.traits.all_here
    return tuple(everywhere or is_this_machine(i.host) for i in plan.instances)


def progress_data(snapshot: Sequence[InstanceProgress], attempt: int, now: float) -> dict[str, object]:
    """Return ``progress.json``'s data: ``{"v":1,"time":T,"attempt":A,"instances":[...]}`` (docs/runs.md)."""
    return {"v": 1, "time": round(now, 3), "attempt": attempt, "instances": [{
        "index": p.index, "host": p.host, "step": _number(p.step), "total": p.total,
        "step_time_ms": _ms(p.step_time_s), "eta_ms": None if p.eta_s is None else round(p.eta_s * 1000),
        "heard_ms": round(p.heard_s * 1000), "straggler_ratio": p.straggler_ratio} for p in snapshot]}


def summary_data(summaries: Sequence[StepSummary]) -> list[dict[str, object]]:
    """Return report.json's ``progress.instances``: per instance its steps, calls, step times (ms), last step and total."""
    return [{"index": s.index, "host": s.host, "attempt": s.attempt, "steps": s.steps, "calls": s.calls,
             "last_step": _number(s.last_step), "total": s.total,
             "step_time_ms": {"min": _round(s.min_ms), "median": _round(s.median_ms), "p90": _round(s.p90_ms),
                              "max": _round(s.max_ms)},
             "straggler_ratio": s.straggler_ratio} for s in summaries]


def event_of(progress: InstanceProgress) -> InstanceProgressed:
    """Return the ``instance-progress`` event of one instance's state."""
    return InstanceProgressed(index=progress.index, host=progress.host, attempt=progress.attempt,
                              step=_number(progress.step), total=progress.total,
                              step_time_ms=_ms(progress.step_time_s),
                              eta_ms=None if progress.eta_s is None else round(progress.eta_s * 1000),
                              metrics=progress.metrics)


def _untold(_event: Event) -> None:
    """Tell nothing: what the channel's thread tells once its sink raised."""


def _joined(*variables: Mapping[int, Mapping[str, str]]) -> dict[int, dict[str, str]]:
    """Return the variables of each instance, from all of ``variables`` (later ones win)."""
    joined: dict[int, dict[str, str]] = {}
    for each in variables:
        for index, values in each.items():
            joined.setdefault(index, {}).update(values)
    return joined


def _number(value: float | None) -> float | None:
    """Return a step as JSON shows it best: an int when it is whole."""
    if value is None or type(value) is int:  # a whole step sent as one stays exact
        return value
    return int(value) if value.is_integer() and abs(value) < 2**53 else value


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 3)


def _round(ms: float | None) -> float | None:
    return None if ms is None else round(ms, 3)


class Channel:
    """
    The run's receiving end (see the module docstring): made by :meth:`start`, ended by :meth:`close`.

    ``board``: where updates go; ``remote``: whether some instance runs on another host (the
    socket listens beyond loopback); ``emit``: tells an event (the relay's, from this thread);
    ``write``: keeps ``progress.json``'s data (the run record's), or None.
    """

    def __init__(self, board: Board, *, remote: bool, emit: Callable[[Event], None],
                 write: Callable[[Mapping[str, object]], None] | None = None,
                 proxy: Callable[[str], str | None] | None = None, proxied: Sequence[str] = ()) -> None:
        self.board, self._remote, self._emit, self._write = board, remote, emit, write
        self._proxy, self._proxied = proxy, tuple(proxied)[:PROXIES]
        self.proxied: dict[str, str] = {}  # host -> how ssh reaches it through another (ProxyJump, ProxyCommand): PR449
        self.hosts_heard: set[str] = set()  # the hosts of the instances heard from
        self.token = os.urandom(16).hex()
        self.port = 0
        self.error: OSError | None = None  # why the socket could not be made (the run goes on without progress)
        self.forged = 0  # datagrams dropped as not the run's: another token, malformed (PR448)
        self.dropped = 0  # the run's datagrams dropped: an older attempt's, an index beyond the plan
        self.received = 0  # datagrams kept
        self.filtered = False  # the kernel drops datagrams without the token (a filter on the socket, after strangers)
        self._socket: _socket.socket | None = None
        self._wake: tuple[int, int] | None = None  # a pipe that wakes the thread to end
        self._ready = threading.Event()
        self._closing = threading.Event()
        self._lock = threading.Lock()  # the socket's reader: the thread, or attempt_ended
        self._told: dict[int, float] = {}  # instance -> when its last event was told (monotonic)
        self._changed: dict[int, InstanceProgress] = {}  # instance -> its latest state not told yet
        self._attempt = 0
        self._kept = False  # progress.json was written
        self._thread = threading.Thread(target=self._main, name="poprun-progress", daemon=True)
        board.listen(self._heard)

    def start(self) -> None:
        """Begin making the socket and reading it (in the channel's thread); :meth:`ready` waits for it."""
        try:
            start_thread(self._thread)
        except RuntimeError as exc:  # no thread can be had (a process limit): the run goes on without progress
            self.error = OSError(11, f"no thread for the progress channel ({exc})")  # EAGAIN, as clone(2) says it
            self._ready.set()

    def ready(self) -> bool:
        """Wait until the socket is made; return whether it was (else :attr:`error` says why)."""
        if not self._ready.wait(READY_S) and self.error is None:
            self.error = TimeoutError(f"the progress socket was not made within {READY_S:g} s")
        return self._socket is not None and self.error is None

    def begin(self, number: int, plan: LaunchPlan, others: Mapping[int, Mapping[str, str]]) -> tuple[
            dict[int, dict[str, str]], dict[int, dict[str, str]]]:
        """
        Begin attempt ``number`` of ``plan`` (its hosts); return each instance's variables, without and with the token.

        ``others``: the instance variables the attempt adds besides (they come first). The board
        starts afresh, and older attempts' datagrams are dropped. Without a socket
        (:attr:`error`), no variables of the channel: popdist's calls are then no-ops.
        """
        with self._lock:
            self._attempt = number
            self.board.hosts([i.host for i in plan.instances])
            self.board.attempt(number)
            self._changed.clear()
            self._told.clear()
        if not self.ready():
            return _joined(others), _joined(others)
        where = {index: {names.PROGRESS: address} for index, address in addresses(here(plan), self.port).items()}
        token = {index: {names.PROGRESS_TOKEN: self.token} for index in where}
        return _joined(others, where), _joined(others, where, token)

    def attempt_ended(self) -> None:
        """Read what is left in the socket, then tell every instance's last state of the attempt (and write it)."""
        if self._socket is None:
            return
        with self._lock:
            self._drain(now=time.monotonic())
            if self._remote and self.received:  # another host's last datagram may still be on its way
                deadline = time.monotonic() + 0.1
                while time.monotonic() < deadline:
                    time.sleep(0.02)
                    self._drain(now=time.monotonic())
            self._changed.clear()
            snapshot = self.board.snapshot()
        for progress in snapshot:
            self._emit(event_of(progress))
        self._keep(snapshot)

    def report(self) -> dict[str, object]:
        """Return report.json's ``progress``: each instance's summary of the last attempt, and the datagrams counted."""
        return {"instances": summary_data(self.board.summaries()), "received": self.received,
                "dropped": self.dropped, "forged": self.forged, "filtered": self.filtered}

    def close(self) -> None:
        """Stop the thread (woken at once) and close the socket (idempotent)."""
        self._closing.set()
        wake = self._wake
        if wake is not None:
            with contextlib.suppress(OSError):
                os.write(wake[1], b"x")
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(5)
        sock, self._socket, self._wake = self._socket, None, None
        if sock is not None:
            sock.close()
        for fd in wake or ():
            with contextlib.suppress(OSError):
                os.close(fd)

    # -- the thread -----------------------------------------------------------------------
    def _main(self) -> None:
        try:
            self._wake = wake = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)  # close() writes to it: select ends at once
            self._socket = _open(remote=self._remote)
            self.port = self._socket.getsockname()[1]
            _probe(self._socket, self.port)
        except OSError as exc:
            self.error = exc
            return
        finally:
            self._ready.set()
        import select

        sock = self._socket
        ticked = period = time.monotonic()
        spent = time.thread_time()
        while not self._closing.is_set():
            now = time.monotonic()
            if now - period >= PERIOD_S:
                period, spent = now, time.thread_time()
            elif time.thread_time() - spent > BUDGET * PERIOD_S:  # over the budget: the kernel drops the rest
                self._closing.wait(period + PERIOD_S - now)
                continue
            if now - ticked >= TICK_S:
                ticked = now
                self._tick()
                self._look_for_proxies()
            try:
                readable, _, _ = select.select([sock.fileno(), wake[0]], [], [], min(TICK_S, 0.25))
            except (OSError, ValueError):  # closed meanwhile
                return
            if wake[0] not in readable:
                with self._lock:
                    self._drain(now=time.monotonic(), limit=BATCH)

    def _drain(self, *, now: float, limit: int = BATCH * 64) -> None:
        """Read up to ``limit`` datagrams waiting on the socket into the board (with :attr:`_lock` held)."""
        sock, token = self._socket, self.token.encode()
        if sock is None:
            return
        for _ in range(limit):
            try:
                datagram = sock.recv(MAX_DATAGRAM + 1)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # an ICMP error queued on the socket, a closed socket: nothing to read now
                return
            update = parse(datagram, token)
            if update is None:
                self.forged += 1
                if self.forged == FILTER_AFTER:  # strangers: the kernel drops theirs from now on
                    self.filtered = _filter(sock, token)
            elif self.board.feed(update, now):
                self.received += 1
            else:
                self.dropped += 1

    def _look_for_proxies(self) -> None:
        """Find the hosts ssh reaches through another (once, a second into the run: never during its start)."""
        hosts, self._proxied = self._proxied, ()
        for host in hosts:
            if self._closing.is_set() or self._proxy is None:
                return
            how = self._proxy(host)
            if how is not None:
                self.proxied[host] = how

    def _heard(self, progress: InstanceProgress) -> None:
        """Keep the instance's latest state until the next tick tells it (the board's listener)."""
        self._changed[progress.index] = progress
        self.hosts_heard.add(progress.host)

    def unreachable(self) -> dict[str, str]:
        """
        Return the hosts ssh reaches through another whose instances were never heard, while others' were (for PR449).

        Nothing when no instance was heard at all: a program that reports no progress loses none.
        """
        if not self.received:
            return {}
        return {host: how for host, how in self.proxied.items() if host not in self.hosts_heard}

    def _tick(self) -> None:
        """Tell the instances heard from since their last event (one each), and write progress.json."""
        now = time.monotonic()
        with self._lock:
            due = [p for i, p in sorted(self._changed.items()) if now - self._told.get(i, -TICK_S) >= TICK_S]
            for progress in due:
                del self._changed[progress.index]
                self._told[progress.index] = now
            snapshot = self.board.snapshot() if due else ()
        try:
            for progress in due:
                self._emit(event_of(progress))
        except Exception:  # noqa: BLE001 - a sink that raised: the main thread meets it at its own next event
            self._emit = _untold
        if due:
            self._keep(snapshot)

    def _keep(self, snapshot: Sequence[InstanceProgress]) -> None:
        """Hand progress.json's data to the record (not before anything was heard: a run without progress has none)."""
        if self._write is not None and (snapshot or self._kept):
            self._kept = True
            self._write(progress_data(snapshot, self._attempt, time.time()))


def _open(*, remote: bool) -> _socket.socket:
    """
    Return a bound, non-blocking UDP socket: 127.0.0.1, or dual-stack ``::`` for remote hosts (0.0.0.0 without IPv6).

    Made with ``_socket``, the C module under :mod:`socket`: importing ``socket`` itself builds
    its enums (some 3 ms of one core, the GIL held), which every launch with a record would pay.
    """
    import _socket as socket  # in the channel's thread, off the launch path

    if remote and socket.has_ipv6:
        try:
            sock = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        except OSError:
            sock = None
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                _setup(sock)
                sock.bind(("::", 0))
            except OSError:
                sock.close()
            else:
                return sock
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        _setup(sock)
        sock.bind(("0.0.0.0" if remote else _LOOPBACK, 0))  # noqa: S104 - instances on other hosts send here
    except OSError:
        sock.close()
        raise
    return sock


def _probe(sock: _socket.socket, port: int) -> None:
    """
    Send an empty datagram to ``sock`` over loopback and read it back: raise OSError when this machine cannot.

    Binding 127.0.0.1 works even while the loopback interface is down (a network namespace
    of its own); sending there does not, and neither would the instances of this machine.
    """
    import _socket as socket  # see _open

    sock.sendto(b"", ("::ffff:127.0.0.1" if sock.family == socket.AF_INET6 else _LOOPBACK, port))
    with contextlib.suppress(BlockingIOError):
        sock.recv(1)  # loopback delivers within sendto: it never counts as a datagram of a stranger


def _filter(sock: _socket.socket, token: bytes) -> bool:
    """
    Attach a socket filter that keeps only datagrams beginning ``PRP1 TOKEN``; return whether the kernel took it.

    A classic BPF program (``SO_ATTACH_FILTER``), run by the kernel on each datagram before it is
    queued: a stranger's datagram then costs poprun nothing and takes no room in the socket's
    buffer, so a flood neither burns poprun's time nor crowds out the run's own. The program
    compares the datagram's first 37 bytes (after the 8 bytes of UDP header the filter sees) with
    ``PRP1 `` and the token, and the parser still checks every datagram it keeps.
    """
    import ctypes
    import struct

    wanted = MAGIC + token
    words = [(8 + at, int.from_bytes(wanted[at:at + 4], "big")) for at in range(0, len(wanted) - 3, 4)]
    program: list[tuple[int, int, int, int]] = []
    drop = 2 * len(words) + 3  # the index of the last instruction, from the first
    for at, value in words:
        program += [(_BPF_LD_W_ABS, 0, 0, at), (_BPF_JEQ_K, 0, drop - len(program) - 2, value)]
    program += [(_BPF_LD_B_ABS, 0, 0, 8 + len(wanted) - 1), (_BPF_JEQ_K, 0, 1, wanted[-1])]
    program += [(_BPF_RET_K, 0, 0, 0xFFFFFFFF), (_BPF_RET_K, 0, 0, 0)]
    code = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *each) for each in program))
    try:
        sock.setsockopt(_SOL_SOCKET, _SO_ATTACH_FILTER, struct.pack("HL", len(program), ctypes.addressof(code)))
    except OSError:
        return False
    return True


_SOL_SOCKET, _SO_ATTACH_FILTER = 1, 26  # Linux
_BPF_LD_W_ABS, _BPF_LD_B_ABS, _BPF_JEQ_K, _BPF_RET_K = 0x20, 0x30, 0x15, 0x06


def _setup(sock: _socket.socket) -> None:
    import _socket as socket  # see _open

    sock.setblocking(False)  # noqa: FBT003 - the socket module's own signature
    with contextlib.suppress(OSError):  # else the kernel's default buffer: bursts lose more
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RECEIVE_BUFFER)


def unopened(error: OSError) -> Diagnostic:
    """Return PR447: the channel's socket could not be made; the run goes on without progress."""
    from poprun.core.diagnostic import warning
    from poprun.core.span import SourceSpan

    return warning("PR447", "progress channel could not be opened",
                   detail=f"poprun could not listen for the instances' progress ({error.strerror or error}): "
                          "the run goes on without it (popdist.progress calls are no-ops; no instance-progress "
                          "events, progress.json, ETA or heartbeat limit)",
                   span=SourceSpan.environment("progress channel"),
                   hint="look at the open-file limit (ulimit -n) and whether this machine has a loopback interface "
                        "(ip link show lo); docs/progress.md")


def forged(count: int, received: int) -> Diagnostic:
    """Return PR448: ``count`` datagrams that were not the run's reached its progress port."""
    from poprun.core.diagnostic import warning
    from poprun.core.span import SourceSpan

    plural = "datagram" if count == 1 else "datagrams"
    return warning("PR448", "progress datagrams that were not the run's were dropped",
                   detail=f"{count} {plural} reached the run's progress port without its token or not in "
                          f"the progress format, and were dropped ({received} of the run's were kept)",
                   span=SourceSpan.environment("progress channel"),
                   hint="another program sends to the port, or an instance runs a popdist of another version "
                        "than poprun's; docs/progress.md")


def jumped(proxied: Mapping[str, str]) -> Diagnostic:
    """Return PR449: the instances on hosts that ssh reaches through another host send their progress where poprun is not."""
    from poprun.core.diagnostic import warning
    from poprun.core.span import SourceSpan

    shown = sorted(proxied.items())
    named = ", ".join(f"{host} ({how})" for host, how in shown[:_NAMED]) + (
        f" and {len(shown) - _NAMED} more" if len(shown) > _NAMED else "")
    return warning("PR449", "progress cannot reach poprun from hosts reached through a jump host",
                   detail=f"ssh reaches {named} through another host, and none of their instances was heard while "
                          "others were: their SSH_CONNECTION names that host, not poprun, so their progress went there",
                   span=SourceSpan.environment("ssh configuration"),
                   hint="run poprun on a machine that reaches the hosts directly, or use --backend mpirun (its "
                        "instances send their progress to the address that reached poprun); docs/progress.md")
