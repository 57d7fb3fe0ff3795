"""
poprun's stdout or stderr that nobody reads holds the instances up, never poprun's signals.

Each test runs the real CLI with one of its streams a pipe one page deep (F_SETPIPE_SZ) whose
reader never reads, instances writing without end to it, then sends a stop signal: poprun
exits with 128+N and no instance of the launch survives (the ``marked`` fixture). A reader that
is merely slow gets every line once.
"""

from __future__ import annotations

import fcntl
import json
import os
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from tests.conftest import LAUNCH_MARKER, Marked, carrying, survivors

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

F_SETPIPE_SZ = 1031  # fcntl.F_SETPIPE_SZ, spelled out for older type stubs
INSTANCES = 2
WRITER = "import sys\nwhile True:\n    sys.{stream}.write('x' * 99 + '\\n')\n"


def full_pipe() -> tuple[int, int]:
    """Return (read end, write end) of a pipe one page deep."""
    read_end, write_end = os.pipe()
    fcntl.fcntl(write_end, F_SETPIPE_SZ, 4096)
    return read_end, write_end


def unread(read_end: int) -> int:
    """Return how many bytes wait in the pipe (FIONREAD)."""
    return int.from_bytes(fcntl.ioctl(read_end, termios.FIONREAD, b"\0\0\0\0"), sys.byteorder)


def await_stalled(read_end: int, marked: Marked, *, within_s: float = 60) -> None:
    """Wait until every instance runs and a line waits in the pipe (poprun's next write waits for the reader)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        writers = [c for c in carrying(LAUNCH_MARKER, marked.value).values()
                   if c.startswith(f"{sys.executable} -c")]  # the instances, not poprun (-m)
        if len(writers) == INSTANCES and unread(read_end) >= 100:
            return
        time.sleep(0.05)
    pytest.fail("the instances did not fill the pipe within the time allowed")


def stop_with_stalled(stream: str, sig: signal.Signals, marked: Marked, tmp_path: Path) -> tuple[int, str]:
    """Run instances writing to ``stream``, a pipe nobody reads; send ``sig``; return (status, the other stream)."""
    read_end, write_end = full_pipe()
    other = subprocess.PIPE
    streams = {"stdout": write_end, "stderr": other} if stream == "stdout" else {"stdout": other, "stderr": write_end}
    try:
        proc = subprocess.Popen([sys.executable, "-m", "poprun.cli.main", "--offline-mode=1",
                                 "--num-instances", str(INSTANCES), "--num-replicas", str(INSTANCES),
                                 sys.executable, "-c", WRITER.format(stream=stream)], cwd=tmp_path, text=True,
                                env=marked.env | {"POPRUN_RUNS_DIR": str(tmp_path / "runs")}, **streams)
        os.close(write_end)
        try:
            await_stalled(read_end, marked)
            proc.send_signal(sig)
            out, err = proc.communicate(timeout=90)
        except (subprocess.TimeoutExpired, pytest.fail.Exception):
            proc.kill()
            proc.communicate()
            pytest.fail(f"poprun did not end within 90 s of {sig.name} while its {stream} stalled")
    finally:
        os.close(read_end)
    return proc.returncode, out if stream == "stderr" else err


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
@pytest.mark.parametrize(("sig", "expected"), [(signal.SIGTERM, 143), (signal.SIGINT, 130), (signal.SIGHUP, 129)])
def test_a_stop_signal_works_while_nobody_reads_the_output(tmp_path: Path, marked: Marked, stream: str,
                                                           sig: signal.Signals, expected: int) -> None:
    """A stop while poprun's write to a full pipe waits: poprun exits 128+N, and no instance survives."""
    status, other = stop_with_stalled(stream, sig, marked, tmp_path)

    assert expected == status, other
    assert {} == survivors(LAUNCH_MARKER, marked.value, within_s=30)


def test_stdout_abandoned_after_a_stop_is_one_warning_on_stderr(tmp_path: Path, marked: Marked) -> None:
    """stdout that took nothing after SIGTERM: stderr says its output was dropped, then how poprun ended."""
    status, err = stop_with_stalled("stdout", signal.SIGTERM, marked, tmp_path)

    assert 143 == status, err
    assert ("poprun: warning: stdout took nothing for 5 s after the stop: the rest of the instances' output to it "
            "is dropped\n") in err
    assert err.endswith("poprun: stopped by SIGTERM\n"), err


def test_a_slow_reader_gets_every_line_once(tmp_path: Path) -> None:
    """A reader of a one-page pipe that reads a little at a time gets every instance's every line, once."""
    read_end, write_end = full_pipe()
    program = "import os\nfor i in range(20000):\n    print(os.environ['POPDIST_INSTANCE_INDEX'], i)\n"
    proc = subprocess.Popen([sys.executable, "-m", "poprun.cli.main", "--offline-mode=1", "--num-instances", "2",
                             "--num-replicas", "2", sys.executable, "-c", program], cwd=tmp_path, stdout=write_end,
                            stderr=subprocess.PIPE, env={**os.environ, "POPRUN_RUNS_DIR": str(tmp_path / "runs")})
    os.close(write_end)
    got = bytearray()
    with os.fdopen(read_end, "rb", buffering=0) as reader:
        while chunk := reader.read(512):
            got += chunk
            time.sleep(0.0005)
    _, err = proc.communicate(timeout=60)

    assert (0, b"") == (proc.returncode, err)
    assert sorted(f"{i} {n}" for i in range(2) for n in range(20000)) == sorted(got.decode().splitlines())


@pytest.mark.parametrize("command", ["logs -f", "attach"])
def test_following_a_run_into_a_stdout_nobody_reads_ends_on_sigterm(tmp_path: Path, marked: Marked,
                                                                    command: str) -> None:
    """poprun logs -f / attach, its stdout a full pipe nobody reads: SIGTERM ends it (143), the run goes on."""
    env = marked.env | {"POPRUN_RUNS_DIR": str(tmp_path / "runs")}
    detached = subprocess.run([sys.executable, "-m", "poprun.cli.main", "--detach", "--offline-mode=1",
                               sys.executable, "-c", WRITER.format(stream="stdout")], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=60, check=True)
    run = detached.stdout.strip()
    read_end, write_end = full_pipe()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "poprun.cli.main", *command.split(), run], cwd=tmp_path,
                                env=env, stdout=write_end, stderr=subprocess.PIPE, text=True)
        os.close(write_end)
        deadline = time.monotonic() + 60
        while unread(read_end) < 100 and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        os.close(read_end)
        subprocess.run([sys.executable, "-m", "poprun.cli.main", "stop", run], env=env, capture_output=True,
                       timeout=60, check=False)

    assert proc.returncode in (-signal.SIGTERM, 128 + signal.SIGTERM), err


def test_a_stop_works_while_nobody_reads_the_events_on_stdout(tmp_path: Path, marked: Marked) -> None:
    """--events - into a pipe nobody reads, full before the first event: SIGTERM ends poprun with 143, no traceback."""
    read_end, write_end = full_pipe()
    os.write(write_end, b"\n" * 4096)  # full before poprun starts: its first event waits
    try:
        proc = subprocess.Popen([sys.executable, "-m", "poprun.cli.main", "--events", "-", "--offline-mode=1",
                                 "--num-instances", "8", "--num-replicas", "8", "sleep", "600"], cwd=tmp_path,
                                env=marked.env | {"POPRUN_RUNS_DIR": str(tmp_path / "runs")}, stdout=write_end,
                                stderr=subprocess.PIPE, text=True)
        os.close(write_end)
        deadline = time.monotonic() + 60
        while not any('"run-started"' in f.read_text() for f in (tmp_path / "runs").glob("*/events.jsonl")) and \
                time.monotonic() < deadline:  # recorded, then written to stdout: that write waits
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            pytest.fail("poprun did not end within 90 s of SIGTERM while nobody read its events")
    finally:
        os.close(read_end)

    assert 143 == proc.returncode, err
    assert {} == survivors(LAUNCH_MARKER, marked.value, within_s=30)


def test_events_on_a_stdout_nobody_reads_are_dropped_and_the_run_ends(tmp_path: Path) -> None:
    """`--events -` into a pipe nobody reads, the instances writing nothing: the events stop with one warning, exit 0."""
    read_end, write_end = full_pipe()
    try:
        proc = subprocess.Popen([sys.executable, "-m", "poprun.cli.main", "--events", "-", "--offline-mode=1",
                                 "--num-instances", "240", "--num-replicas", "240", "true"], cwd=tmp_path,
                                env=os.environ | {"POPRUN_RUNS_DIR": str(tmp_path / "runs")}, stdout=write_end,
                                stderr=subprocess.PIPE, text=True)
        os.close(write_end)
        try:
            _, err = proc.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            pytest.fail("poprun did not end within 90 s while the events on its stdout stalled")
    finally:
        os.close(read_end)

    assert (0, ["poprun: warning: stdout took nothing for 5 s: the events on it stop there"]) \
        == (proc.returncode, err.splitlines())


def test_events_on_stdout_never_land_inside_an_instances_long_line(tmp_path: Path) -> None:
    """`--events -` while instances write 3 MiB lines: every line out is one of theirs whole, or a whole event."""
    line = b'{"a": "' + b"x" * (3 << 20) + b'"}\n'
    (tmp_path / "big.json").write_bytes(line)
    done = subprocess.run([sys.executable, "-m", "poprun.cli.main", "--events", "-", "--num-instances", "4",
                           "--num-replicas", "4", "sh", "-c", "cat big.json; cat big.json"], cwd=tmp_path,
                          env=os.environ | {"POPRUN_RUNS_DIR": str(tmp_path / "runs")}, capture_output=True,
                          timeout=90, check=False)

    lines = done.stdout.splitlines(keepends=True)
    assert 0 == done.returncode, done.stderr
    assert 8 == sum(out == line for out in lines)
    assert all(out == line or json.loads(out)["v"] == 1 for out in lines)
    assert "instance-ended" in {json.loads(out)["event"] for out in lines if out != line}
