"""
``--events`` against readers and targets that misbehave: a stalled reader, none at all, one that leaves, a full disk.

Each launch is the real CLI with real FIFOs, pipes and file systems. A reader that stops
reading is a process that holds the FIFO open (shrunk to one page, so that a few events fill
it) and never reads: the run must end as it would without ``--events``, its signals must work,
and the stream stops with one warning.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from poprun.cli import eventstream
from poprun.core.events import InstanceStarted, LaunchRunning

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ (Python 3.10+ on Linux); spelled out for older type stubs
# Opens the FIFO without blocking (O_RDWR), shrinks it to one page, says so, then never reads.
STALLED_READER = ("import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR); "
                  f"fcntl.fcntl(fd, {F_SETPIPE_SZ}, 4096); print('holding', flush=True); time.sleep(600)")
STALLED = re.compile(r"poprun: warning: the reader of (\S+) took nothing for 5 s: "
                     r"the last \d+ bytes of events were dropped\n")


def launch(*args: str, cwd: Path, **kwargs: object) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "poprun.cli.main", *args], cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "POPRUN_RUNS_DIR": str(cwd / "runs")}, **kwargs)  # type: ignore[call-overload]


def finish(proc: subprocess.Popen[str], *, within_s: float = 60) -> tuple[int, str, str]:
    """Return (status, stdout, stderr) once ``proc`` ends; SIGKILL it (and fail) when it does not within ``within_s``."""
    try:
        out, err = proc.communicate(timeout=within_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail(f"poprun did not end within {within_s} s")
    return proc.returncode, out, err


@contextlib.contextmanager
def stalled_reader(fifo: Path) -> Iterator[None]:
    """A process that holds ``fifo`` open, one page deep, and never reads it."""
    os.mkfifo(fifo)
    reader = subprocess.Popen([sys.executable, "-c", STALLED_READER, str(fifo)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert reader.stdout is not None
        assert "holding\n" == reader.stdout.readline()
        yield
    finally:
        reader.kill()
        reader.communicate()


def await_running(runs: Path, *, within_s: float = 60) -> None:
    """Wait until the run's record says every instance has started (launch-running)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        for events in runs.glob("*/events.jsonl"):
            if f'"event":"{LaunchRunning.kind}"' in events.read_text():
                return
        time.sleep(0.05)
    pytest.fail("the run did not start within the time allowed")


def test_a_reader_that_stops_reading_is_dropped_and_the_run_ends(tmp_path: Path) -> None:
    """16 instances' events fill a one-page FIFO nobody reads: the run ends with its status and one warning."""
    with stalled_reader(tmp_path / "F"):
        status, out, err = finish(launch("--events", "F", "--offline-mode=1", "--num-instances", "16",
                                          "--num-replicas", "16", sys.executable, "-c", "print('ran')", cwd=tmp_path))

    assert (0, ["ran"] * 16) == (status, out.splitlines()), err
    assert STALLED.fullmatch(err), err


def test_a_failing_run_keeps_its_status_when_the_reader_stalls(tmp_path: Path) -> None:
    """The root cause's exit status comes through a stalled reader, with the failure report and the warning."""
    with stalled_reader(tmp_path / "F"):
        status, _, err = finish(launch("--events", "F", "--offline-mode=1", "--num-instances", "16",
                                       "--num-replicas", "16", sys.executable, "-c",
                                       "import os, sys; sys.exit(3 if os.environ['POPDIST_INSTANCE_INDEX'] == '5' "
                                       "else 0)", cwd=tmp_path))

    assert 3 == status, err
    assert STALLED.match(err), err


@pytest.mark.parametrize(("sig", "expected"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_stop_signal_works_while_the_reader_stalls(tmp_path: Path, sig: signal.Signals, expected: int) -> None:
    """SIGTERM or SIGINT while the events wait on a stalled reader: every instance stops, poprun exits 128+N."""
    with stalled_reader(tmp_path / "F"):
        proc = launch("--events", "F", "--offline-mode=1", "--num-instances", "32", "--num-replicas", "32",
                      "sleep", "100", cwd=tmp_path)
        await_running(tmp_path / "runs")
        proc.send_signal(sig)
        status, _, err = finish(proc)

    assert expected == status, err
    assert err.endswith(f"poprun: stopped by {sig.name}\n"), err
    assert 1 == err.count("poprun: warning: "), err


def test_an_inherited_descriptor_that_stalls_does_not_hold_the_run(tmp_path: Path) -> None:
    """--events fd:N on a pipe one page deep that nobody reads: the run ends, with one warning."""
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, F_SETPIPE_SZ, 4096)
    try:
        status, _, err = finish(launch("--events", f"fd:{write_end}", "--offline-mode=1", "--num-instances", "16",
                                       "--num-replicas", "16", "true", cwd=tmp_path, pass_fds=(write_end,)))
    finally:
        os.close(read_end)
        os.close(write_end)

    assert 0 == status, err
    assert (f"fd:{write_end}",) == STALLED.fullmatch(err).groups(), err  # type: ignore[union-attr]


def test_a_slow_reader_gets_every_event(tmp_path: Path) -> None:
    """A reader that reads only after the run has ended (within the grace) gets every event, and no warning."""
    fifo = tmp_path / "F"
    os.mkfifo(fifo)
    holder = os.open(fifo, os.O_RDWR)  # the reader, not reading until poprun has written everything it could
    try:
        fcntl.fcntl(holder, F_SETPIPE_SZ, 4096)
        proc = launch("--events", "F", "--offline-mode=1", "--num-instances", "16", "--num-replicas", "16", "true",
                      cwd=tmp_path)
        await_running(tmp_path / "runs")
        got, deadline = b"", time.monotonic() + 60
        os.set_blocking(holder, False)
        while (proc.poll() is None or got.count(b"\n") < len(recorded(tmp_path / "runs"))) and \
                time.monotonic() < deadline:
            with contextlib.suppress(BlockingIOError):
                got += os.read(holder, 65536)
            time.sleep(0.2)
        status, _, err = finish(proc)
    finally:
        os.close(holder)

    assert (0, "") == (status, err)
    assert recorded(tmp_path / "runs") == [json.loads(line)["event"] for line in got.splitlines()]


def recorded(runs: Path) -> list[str]:
    return [json.loads(line)["event"] for events in runs.glob("*/events.jsonl")
            for line in events.read_text().splitlines()]


def test_a_reader_that_leaves_mid_run_ends_the_stream_not_the_run(tmp_path: Path) -> None:
    """The reader reads one event and closes the FIFO: the run goes on to its end, silently, with every line."""
    fifo = tmp_path / "F"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # there before poprun opens it: not refused
    proc = launch("--events", "F", "--offline-mode=1", "--num-instances", "4", "--num-replicas", "4",
                  sys.executable, "-c", "import time; time.sleep(1); print('ran')", cwd=tmp_path)
    first = b""
    try:
        deadline = time.monotonic() + 60
        while b"\n" not in first and time.monotonic() < deadline:  # b"" until poprun has opened it
            with contextlib.suppress(BlockingIOError):
                first += os.read(reader, 1)
            time.sleep(0 if first else 0.05)
    finally:
        os.close(reader)
    status, out, err = finish(proc)

    assert first.startswith(b'{"v":1,"event":"run-started"')
    assert (0, "ran\n" * 4, "") == (status, out, err)


def test_a_fifo_with_no_reader_is_refused_at_once(tmp_path: Path) -> None:
    """Opening a FIFO nobody reads never blocks: PR113 before anything starts, exit 2."""
    os.mkfifo(tmp_path / "F")

    status, out, err = finish(launch("--events", "F", "--offline-mode=1", "echo", "ran", cwd=tmp_path), within_s=30)

    assert (2, "") == (status, out)
    assert err.startswith("error[PR113]: cannot write the events to 'F'\n"), err
    assert "a FIFO with no reader" in err


@pytest.mark.parametrize("where", ["/dev/full", "full disk"])
def test_a_target_that_cannot_be_written_is_one_warning(tmp_path: Path, where: str) -> None:
    """/dev/full, or a file on a full file system: one warning, the run and its output go on."""
    target = where
    if where == "full disk":
        disk = tmp_path / "disk"
        disk.mkdir()
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8k", "tmpfs", str(disk)], check=False).returncode:
            pytest.skip("cannot mount a small tmpfs here")
        with contextlib.suppress(OSError), (disk / "filler").open("wb") as filler:  # fill it up
            filler.write(b"x" * 65536)
        target = str(disk / "events.jsonl")
    try:
        status, out, err = finish(launch("--events", target, "--offline-mode=1", "--num-instances", "2",
                                         "--num-replicas", "2", "echo", "ran", cwd=tmp_path))
    finally:
        if where == "full disk":
            subprocess.run(["umount", "-l", str(tmp_path / "disk")], check=False)

    assert (0, "ran\nran\n") == (status, out)
    assert f"poprun: warning: cannot write the events to {target} (No space left on device): they stop there\n" == err


def test_a_reader_too_far_behind_is_dropped_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """More than BUFFER bytes waiting for a reader: nothing more is queued, the warning says so, the caller never waits."""
    # GIVEN a pipe nobody reads, and a buffer of 4 KiB
    monkeypatch.setattr(eventstream, "BUFFER", 4096)
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, F_SETPIPE_SZ, 4096)
    stream = eventstream.EventStream(write_end, "the pipe", owned=True)
    # WHEN far more events than the pipe and the buffer hold are told
    started = time.monotonic()
    for _ in range(500):
        stream.event(LaunchRunning())
    stream.close()
    # THEN
    try:
        assert time.monotonic() - started < 30
        assert "the reader of the pipe fell more than 4096 bytes behind: the events stop there" == stream.warning
    finally:
        os.close(read_end)


def test_a_socket_is_refused_as_what_it_is(tmp_path: Path) -> None:
    """--events naming a Unix socket: PR113 says it is a socket, not 'a FIFO with no reader'."""
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(tmp_path / "sock"))

        status, _, err = finish(launch("--events", "sock", "--offline-mode=1", "true", cwd=tmp_path))

    assert 2 == status, err
    assert "^^^^ a socket: events go to a file, a FIFO or a descriptor (fd:N)\n" in err, err


@pytest.mark.parametrize(("target", "why"), [
    ("fd:99999999999999999999", "descriptor 99999999999999999999 is not open"),
    ("fd:READ", "descriptor {fd} is open for reading only"),
])
def test_a_descriptor_that_cannot_take_events_is_pr113(tmp_path: Path, target: str, why: str) -> None:
    """fd:N too large to be a descriptor, or open for reading only: PR113 before anything starts, never a traceback."""
    readable = os.open(tmp_path, os.O_RDONLY)  # a directory: open, and for reading only
    try:
        target = target.replace("READ", str(readable))
        status, out, err = finish(launch("--events", target, "--offline-mode=1", "echo", "ran", cwd=tmp_path,
                                         pass_fds=(readable,)))
    finally:
        os.close(readable)

    assert (2, "") == (status, out), err
    assert err.startswith(f"error[PR113]: cannot write the events to '{target}'\n"), err
    assert why.format(fd=readable) in err


def test_a_reader_that_trickles_is_dropped_after_the_longest_drain(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader taking a byte now and then is never idle for DRAIN_S, yet the drain ends at DRAIN_MAX_S."""
    # GIVEN a one-page pipe full of events, read a byte every 0.1 s, and a longest drain of 1 s
    monkeypatch.setattr(eventstream, "DRAIN_MAX_S", 1.0)
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, F_SETPIPE_SZ, 4096)
    stream = eventstream.EventStream(write_end, "the pipe", owned=True)
    for _ in range(200):
        stream.event(LaunchRunning())
    done = threading.Event()

    def trickle() -> None:
        while not done.wait(0.1):
            os.read(read_end, 1)

    reader = threading.Thread(target=trickle)
    reader.start()
    try:
        # WHEN the run has ended and poprun drains the stream
        started = time.monotonic()
        stream.drain()
        stream.close()
        # THEN it gave up after about a second, with the warning
        assert time.monotonic() - started < 30  # a generous bound; the warning says which limit ended it
        assert stream.warning is not None
        assert stream.warning.startswith("the reader of the pipe was still ")
        assert stream.warning.endswith(" bytes behind 1 s after the run ended: those events were dropped")
    finally:
        done.set()
        reader.join()
        os.close(read_end)


def test_a_descriptor_numbered_past_1023_gets_every_event(tmp_path: Path) -> None:
    """--events fd:1500 (a shell's 1500>events.jsonl): every event is written, as on a low number."""
    target = os.open(tmp_path / "events.jsonl", os.O_WRONLY | os.O_CREAT, 0o600)
    os.dup2(target, 1500)
    os.close(target)
    try:
        status, _, err = finish(launch("--events", "fd:1500", "--offline-mode=1", "--num-instances", "2",
                                       "--num-replicas", "2", "true", cwd=tmp_path, pass_fds=(1500,)))
    finally:
        os.close(1500)

    assert (0, "") == (status, err)
    assert recorded(tmp_path / "runs") == [json.loads(line)["event"]
                                           for line in (tmp_path / "events.jsonl").read_text().splitlines()]


def test_each_write_holds_whole_lines() -> None:
    """Events written to a pipe others may write to too (fd:N, 3>&1): every write ends a line, so none is cut."""
    # GIVEN a pipe in packet mode (each read returns one write), and far more events than one write takes
    read_end, write_end = os.pipe2(os.O_DIRECT)
    stream = eventstream.EventStream(write_end, "the pipe", owned=True)
    for index in range(100):
        stream.event(InstanceStarted(index=index, pid=1000 + index, host="a-host-with-a-long-name-" * 3))
    # WHEN every line has been written
    stream.drain()
    stream.close()
    packets = []
    with contextlib.suppress(BlockingIOError):
        os.set_blocking(read_end, False)
        while packet := os.read(read_end, 65536):
            packets.append(packet)
    os.close(read_end)
    # THEN
    assert (None, 100) == (stream.warning, sum(p.count(b"\n") for p in packets))
    assert [] == [p[-40:] for p in packets if not p.endswith(b"\n")]


def test_a_stop_during_the_drain_ends_it_at_once() -> None:
    """poprun told to stop (a signal) while a stalled reader is behind: the drain ends at once, with the warning."""
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, F_SETPIPE_SZ, 4096)
    stream = eventstream.EventStream(write_end, "the pipe", owned=True)
    for _ in range(200):
        stream.event(LaunchRunning())

    stream.drain(stop=lambda: True)
    stream.close()
    os.close(read_end)

    assert stream.warning is not None
    assert stream.warning.startswith("poprun was stopped while the reader of the pipe was "), stream.warning


def test_a_poprun_inside_an_instance_does_not_reuse_the_events_file(tmp_path: Path) -> None:
    """POPRUN_EVENTS is poprun's own: a nested poprun in an instance neither truncates nor writes the outer stream."""
    nested = (sys.executable, "-m", "poprun.cli.main", "--offline-mode=1", "sh", "-c",
              'echo "inner:${POPRUN_EVENTS-unset}"')
    status, out, err = finish(subprocess.Popen(
        [sys.executable, "-m", "poprun.cli.main", "--offline-mode=1", *nested], cwd=tmp_path, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env={**os.environ, "POPRUN_RUNS_DIR": str(tmp_path / "runs"), "POPRUN_EVENTS": str(tmp_path / "events.jsonl")}))
    kinds = [json.loads(line)["event"] for line in (tmp_path / "events.jsonl").read_text().splitlines()]

    assert (0, "inner:unset\n", "") == (status, out, err)
    assert (1, 1, "run-started", "run-ended") == (kinds.count("run-started"), kinds.count("run-ended"), kinds[0],
                                                  kinds[-1]), kinds
