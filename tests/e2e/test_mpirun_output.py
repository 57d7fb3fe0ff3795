"""
The mpirun backend's output on this machine, with real mpirun: every line once, whole and attributed.

(OpenMPI 4.1.4's ``--tag-output`` loses bulk output of short lines; the backend's relay must not.)
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120),
              pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun is not on PATH")]

TAG = re.compile(rb"^\[1,(\d+)\]<(stdout|stderr)>:(.*)$")


def poprun(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    """Run the real CLI with the mpirun backend; return what it did (bytes)."""
    return subprocess.run([sys.executable, "-m", "poprun.cli.main", "--backend", "mpirun", *args], cwd=cwd,
                          capture_output=True, timeout=90, check=False, env=os.environ | (env or {}))


def by_instance(text: bytes) -> dict[tuple[int, str], list[bytes]]:
    """Return the lines of tagged output by (instance, stream); an untagged line is a test failure."""
    found: dict[tuple[int, str], list[bytes]] = {}
    for line in text.splitlines():
        match = TAG.match(line)
        assert match is not None, line
        found.setdefault((int(match[1]), match[2].decode()), []).append(match[3])
    return found


def test_10000_short_lines_of_each_instance_arrive_once_on_each_stream(tmp_path: Path) -> None:
    """4 instances x (seq 1 10000 on stdout and on stderr): every line exactly once, in order, by the right instance."""
    program = "seq 1 10000; seq 1 10000 >&2"

    done = poprun("--num-instances=4", "--num-replicas=4", "--mpi-global-args=--tag-output", "sh", "-c", program,
                  cwd=tmp_path)

    assert 0 == done.returncode, done.stderr[-2000:]
    lines = by_instance(done.stdout) | by_instance(done.stderr)
    numbers = [str(n).encode() for n in range(1, 10001)]
    assert {(i, s): numbers for i in range(4) for s in ("stdout", "stderr")} == lines


def test_untagged_output_is_whole_lines_without_loss(tmp_path: Path) -> None:
    """Untagged (the default), 2 instances x seq 1 10000: 20,000 whole lines, each number twice."""
    done = poprun("--num-instances=2", "--num-replicas=2", "seq", "1", "10000", cwd=tmp_path)

    assert 0 == done.returncode, done.stderr[-2000:]
    assert sorted(2 * [str(n).encode() for n in range(1, 10001)]) == sorted(done.stdout.splitlines())


def test_invalid_utf8_and_a_last_line_without_newline_arrive_as_written(tmp_path: Path) -> None:
    """Bytes that are not UTF-8 pass unchanged; a last line without newline arrives, with one added."""
    program = r"printf 'a\377\376b\n\000nul\nlast'; printf 'err without newline' >&2"

    done = poprun("--num-instances=2", "--num-replicas=2", "--mpi-global-args=--tag-output", "sh", "-c", program,
                  cwd=tmp_path)

    assert 0 == done.returncode, done.stderr[-2000:]
    out, err = by_instance(done.stdout), by_instance(done.stderr)
    assert {(i, "stdout"): [b"a\xff\xfeb", b"\x00nul", b"last"] for i in range(2)} == out
    assert {(i, "stderr"): [b"err without newline"] for i in range(2)} == err


def test_output_filename_gets_every_line_in_mpiruns_layout(tmp_path: Path) -> None:
    """--output-filename DIR: DIR/1/rank.N/stdout and stderr hold all of each instance's output."""
    folder = tmp_path / "out"

    done = poprun("--num-instances=2", "--num-replicas=2", f"--mpi-global-args=--output-filename {folder}", "sh",
                  "-c", "seq 1 5000; echo oops >&2", cwd=tmp_path)

    assert 0 == done.returncode, done.stderr[-2000:]
    numbers = "".join(f"{n}\n" for n in range(1, 5001))
    for index in range(2):
        assert numbers == (folder / "1" / f"rank.{index}" / "stdout").read_text()
        assert "oops\n" == (folder / "1" / f"rank.{index}" / "stderr").read_text()


def test_merge_stderr_to_stdout_keeps_the_instances_order(tmp_path: Path) -> None:
    """--merge-stderr-to-stdout: an instance's stderr comes on its stdout, in the order written."""
    done = poprun("--num-instances=1", "--num-replicas=1", "--mpi-global-args=--merge-stderr-to-stdout --tag-output",
                  "sh", "-c", "echo one; echo two >&2; echo three", cwd=tmp_path)

    assert 0 == done.returncode, done.stderr[-2000:]
    assert {(0, "stdout"): [b"one", b"two", b"three"]} == by_instance(done.stdout)


def test_the_relay_token_is_on_no_command_line(tmp_path: Path) -> None:
    """The instances see no relay variable, and their command lines hold no token."""
    probe = "import os, sys; print(sorted(k for k in os.environ if 'RELAY' in k), open('/proc/self/cmdline').read())"

    done = poprun("--num-instances=1", "--num-replicas=1", sys.executable, "-c", probe, cwd=tmp_path)

    assert 0 == done.returncode, done.stderr[-2000:]
    assert done.stdout.startswith(b"[] "), done.stdout


def test_stdout_and_stderr_are_pipes_that_dev_stdout_opens(tmp_path: Path) -> None:
    """As under plain mpirun, an instance's stdout and stderr are pipes: /dev/stdout and /dev/stderr can be opened."""
    program = "[ -p /dev/stdout ] && [ -p /dev/stderr ] && echo pipes; echo out > /dev/stdout; echo err > /dev/stderr"

    done = poprun("--num-instances=2", "--num-replicas=2", "--mpi-global-args=--tag-output", "sh", "-c", program,
                  cwd=tmp_path)

    assert 0 == done.returncode, done.stderr[-2000:]
    assert {(i, "stdout"): [b"pipes", b"out"] for i in range(2)} == by_instance(done.stdout)
    assert {(i, "stderr"): [b"err"] for i in range(2)} == by_instance(done.stderr)


def test_a_shell_that_waits_for_all_its_children_is_not_held_by_the_relay(tmp_path: Path) -> None:
    """``wait`` without arguments returns once the shell's own children end (the relay is no child of the program)."""
    done = poprun("--num-instances=1", "--num-replicas=1", "sh", "-c", "sleep 0.1 & wait; echo done", cwd=tmp_path)

    assert 0 == done.returncode, done.stderr[-2000:]
    assert b"done\n" == done.stdout
