"""The console: the live status line on a terminal (and never elsewhere), and -v / -vv log lines."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import tty
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

PY = sys.executable
STATUS = re.compile(rb"\r([^\r\n\x1b]*)\x1b\[K")  # a draw (text) or a clear (no text) of the status line
LOG = re.compile(r"(\d\d:\d\d:\d\d\.\d{3}) (\d+) POPRUN \[([ID])\] (.*)")
SLOW = ["--num-instances", "2", "--num-replicas", "2", "sh", "-c",
        'echo "one $POPDIST_INSTANCE_INDEX"; sleep 0.6; echo "two $POPDIST_INSTANCE_INDEX"']


def poprun(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a subprocess, stdout and stderr piped."""
    return subprocess.run([PY, "-m", "poprun.cli.main", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=30, check=False)


def poprun_on_a_terminal(*args: str, cwd: Path) -> tuple[int, bytes]:
    """Run the real CLI with stdout and stderr on one raw 80x24 pty; return its status and all it wrote there."""
    master, slave = pty.openpty()
    tty.setraw(slave)  # no newline translation: the bytes are exactly what poprun wrote
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    proc = subprocess.Popen([PY, "-m", "poprun.cli.main", *args], cwd=cwd, stdout=slave, stderr=slave,
                            env=os.environ | {"TERM": "xterm"})
    os.close(slave)
    chunks = []
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # EIO: every writer has gone
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(master)
    return proc.wait(timeout=30), b"".join(chunks)


def test_status_line_on_a_terminal_is_drawn_and_cleared_before_any_output(tmp_path: Path) -> None:
    """On a tty: 'running 2 instances for N s' shows, is cleared before each output line, and at the end."""
    # GIVEN / WHEN
    status, raw = poprun_on_a_terminal(*SLOW, cwd=tmp_path)
    texts = [m[1] for m in STATUS.finditer(raw)]
    rest = STATUS.sub(b"", raw)

    # THEN
    assert 0 == status
    assert b"poprun: running 2 instances for 0 s" in texts
    shown = [t for t in texts if t]
    phases = [b"poprun: planning", b"poprun: starting 2 instances", b"poprun: running 2 instances for 0 s"]
    assert b"poprun: planning" == shown[0]
    assert [t for t in dict.fromkeys(shown) if t in phases] == [p for p in phases if p in shown], "phases in order"
    assert [b"one 0", b"one 1", b"two 0", b"two 1"] == sorted(rest.split(b"\n")[:-1])
    assert not re.search(rb"\r[^\r\n\x1b]+\x1b\[K[^\r]", raw), "output written right after a drawn status line"
    assert raw.endswith(b"\r\x1b[K") or not raw.rsplit(b"\n", 1)[-1], "the status line is left on the screen"
    assert all(len(t) < 80 for t in texts)


def test_failed_planning_on_a_terminal_clears_the_status_line_before_the_diagnostic(tmp_path: Path) -> None:
    """PR300 on a tty: 'planning' is drawn, then cleared, then the diagnostic starts on a clean line."""
    status, raw = poprun_on_a_terminal("--num-instances", "3", "--num-replicas", "4", "true", cwd=tmp_path)

    assert 2 == status
    assert raw.startswith(b"\rpoprun: planning\x1b[K\r\x1b[Kerror[PR300]"), raw[:80]


def test_topology_on_a_terminal_is_not_written_after_the_status_line(tmp_path: Path) -> None:
    """--print-topology=yes while 'planning' shows: the table starts on a cleared line."""
    status, raw = poprun_on_a_terminal("--print-topology=yes", "--num-instances", "2", "--num-replicas", "2",
                                       "--offline-mode=1", "true", cwd=tmp_path)

    assert 0 == status
    assert not re.search(rb"\r[^\r\n\x1b]+\x1b\[K[^\r]", raw), "output written right after a drawn status line"
    assert STATUS.sub(b"", raw).startswith(b" ===================\n|  poprun topology  |\n")


def test_no_status_line_when_stderr_is_not_a_terminal(tmp_path: Path) -> None:
    """Through pipes: no carriage return, no escape sequence, nothing but the instances' output."""
    done = poprun(*SLOW, cwd=tmp_path)

    assert (0, "") == (done.returncode, done.stderr)
    assert ["one 0", "one 1", "two 0", "two 1"] == sorted(done.stdout.splitlines())


def test_verbose_logs_each_instance_in_poprun_format(tmp_path: Path) -> None:
    """-v: [I] lines 'HH:MM:SS.mmm PID POPRUN [I] ...' for the launch, each instance's start and end."""
    done = poprun("-v", "--num-instances", "2", "--num-replicas", "2", "sh", "-c", "exit 0", cwd=tmp_path)
    logs = [LOG.fullmatch(line) for line in done.stderr.splitlines()]
    messages = [re.sub(r"PID \d+", "PID n", m[4]) for m in logs if m]

    assert (0, [], {"I"}) == (done.returncode, [line for line, m in zip(done.stderr.splitlines(), logs, strict=True)
                                                 if not m], {m[3] for m in logs if m})
    assert 1 == len({m[2] for m in logs if m})  # poprun's own PID on every line
    assert re.fullmatch(r"Run \d{8}-\d{6}-[0-9a-f]{6}", messages.pop(0))  # the run's id, first
    phases = [m for m in messages if re.fullmatch(r"[A-Z][a-z-]+ took \d+\.\d\d s", m)]
    messages = [m for m in messages if m not in phases]
    assert ["Start"] == [p.split()[0] for p in phases]  # nothing printed: no first output
    assert messages[:4] == ["Running 2 instances with the local backend",
                            "Instance 0 (PID n) on localhost: sh -c 'exit 0'",
                            "Instance 1 (PID n) on localhost: sh -c 'exit 0'", "Waiting for instances"]
    assert {"Instance 0 (PID n) terminated with exit code 0",
            "Instance 1 (PID n) terminated with exit code 0"} == set(messages[4:])


def test_very_verbose_shows_each_environment_with_secrets_masked(tmp_path: Path) -> None:
    """-vv adds [D] lines with each instance's environment; a variable named like a secret shows as ****."""
    done = poprun("-vv", "--mpi-global-args=-x MY_API_TOKEN=hunter2", "--num-instances", "2", "--num-replicas", "2",
                  "sh", "-c", 'echo "$MY_API_TOKEN"', cwd=tmp_path)
    debug = [m[4] for m in map(LOG.fullmatch, done.stderr.splitlines()) if m and m[3] == "D"]

    assert (0, "hunter2\nhunter2\n") == (done.returncode, done.stdout)
    assert "hunter2" not in done.stderr
    assert 2 == len([d for d in debug if d.startswith("Instance ") and " MY_API_TOKEN=**** " in d])
    assert any(d.startswith("Instance 1 environment: ") and " POPDIST_INSTANCE_INDEX=1 " in d for d in debug)


def test_a_long_line_passing_on_a_terminal_is_not_overwritten_by_the_status_line(tmp_path: Path) -> None:
    """While a 3 MiB line passes in parts (slowly), the status line is not drawn into it: the line arrives whole."""
    program = ("import sys, time\n"
               "w = sys.stdout.buffer\n"
               "w.write(b'a' * (3 << 20)); w.flush(); time.sleep(1.2)\n"  # passed on, unfinished, for a while
               "w.write(b'b\\n'); w.flush()\n")

    status, written = poprun_on_a_terminal(PY, "-c", program, cwd=tmp_path)

    assert 0 == status
    assert b"a" * (3 << 20) + b"b\n" in written
