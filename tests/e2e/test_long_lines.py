"""
Lines of any length arrive whole and byte-exact: on the terminal, tagged, and in the run record, on every local backend.

(Before: a line over 1 MiB reached the terminal and the record cut into ~1 MiB pieces, each given
a newline.) A line too long to wait for is streamed through, so poprun's memory stays bounded.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

PY = sys.executable
# Writes a line of N bytes (every byte value but the newline, NUL included) in pieces of 100,000
# bytes, for each N of argv, each ended by a newline; then a last line without newline.
WRITER = ("import sys\n"
          "w = sys.stdout.buffer\n"
          "unit = bytes(range(256)).replace(b'\\n', b'\\0')\n"
          "for n in map(int, sys.argv[1:]):\n"
          "    data = (unit * (n // 256 + 1))[:n]\n"
          "    for at in range(0, n, 100_000):\n"
          "        w.write(data[at:at + 100_000]); w.flush()\n"
          "    w.write(b'\\n'); w.flush()\n"
          "w.write(b'last words'); w.flush()\n")
SIZES = (3 << 20, 40 << 20)


def line_of(size: int) -> bytes:
    """Return the line of ``size`` bytes WRITER writes (without its newline)."""
    unit = bytes(range(256)).replace(b"\n", b"\0")
    return (unit * (size // 256 + 1))[:size]


def expected(*sizes: int) -> bytes:
    return b"".join(line_of(n) + b"\n" for n in sizes) + b"last words\n"


def poprun(*args: str, cwd: Path, runs: Path) -> subprocess.CompletedProcess[bytes]:
    """Run the real CLI in a subprocess with its records under ``runs``; return what it did, as bytes."""
    return subprocess.run([PY, "-m", "poprun.cli.main", *args], cwd=cwd, capture_output=True, timeout=240,
                          check=False, env=os.environ | {"POPRUN_RUNS_DIR": str(runs)})


def record_log(runs: Path, index: int, stream: str = "stdout") -> bytes:
    """Return what the only run record under ``runs`` keeps of instance ``index``'s ``stream``."""
    (run,) = [p for p in runs.iterdir() if p.is_dir()]
    return (run / "logs" / f"{index}.{stream}").read_bytes()


def shape(data: bytes) -> list[int]:
    """Return the lengths of the lines of ``data``: what a failed comparison shows instead of 40 MiB."""
    return [len(line) for line in data.split(b"\n")]


@pytest.mark.parametrize("backend", ["local", "offline", "mpirun"])
def test_a_3_mib_and_a_40_mib_line_arrive_whole_on_stdout_and_in_the_record(tmp_path: Path, backend: str) -> None:
    """Lines of 3 MiB and 40 MiB (every byte value, NUL too), then a last line: byte-exact on stdout and in the record."""
    if backend == "mpirun" and shutil.which("mpirun") is None:
        pytest.skip("mpirun is not on PATH")
    want = expected(*SIZES)

    done = poprun("--backend", backend, PY, "-c", WRITER, *map(str, SIZES), cwd=tmp_path, runs=tmp_path / "runs")

    assert 0 == done.returncode, done.stderr[-2000:]
    assert shape(want) == shape(done.stdout)
    assert want == done.stdout
    assert want == record_log(tmp_path / "runs", 0)


def test_tagged_long_lines_of_two_instances_arrive_whole_each_tagged_once(tmp_path: Path) -> None:
    """Two instances each writing a 3 MiB line at once: two whole lines, each with one tag, none mixed into the other."""
    want = {b"[1,%d]<stdout>:" % i + line for i in range(2) for line in (line_of(3 << 20), b"last words")}

    done = poprun("--num-instances", "2", "--num-replicas", "2", "--mpi-global-args=--tag-output",
                  PY, "-c", WRITER, str(3 << 20), cwd=tmp_path, runs=tmp_path / "runs")

    assert 0 == done.returncode, done.stderr[-2000:]
    lines = done.stdout.split(b"\n")
    assert [b""] == lines[4:]
    assert want == set(lines[:4]), shape(done.stdout)
    assert [expected(3 << 20)] * 2 == [record_log(tmp_path / "runs", i) for i in range(2)]


def test_poprun_logs_gives_back_a_long_line_whole(tmp_path: Path) -> None:
    """``poprun logs`` of a run with a 3 MiB line prints it whole, as the run printed it."""
    runs = tmp_path / "runs"
    done = poprun(PY, "-c", WRITER, str(3 << 20), cwd=tmp_path, runs=runs)
    (run,) = [p.name for p in runs.iterdir() if p.is_dir()]

    logs = poprun("logs", run, cwd=tmp_path, runs=runs)
    tagged = poprun("logs", run, "--tag", cwd=tmp_path, runs=runs)

    assert (0, 0) == (done.returncode, logs.returncode)
    assert expected(3 << 20) == logs.stdout
    assert [b"[1,0]<stdout>:" + line_of(3 << 20), b"[1,0]<stdout>:last words", b""] == tagged.stdout.split(b"\n")


def test_a_200_mib_line_passes_whole_while_poprun_stays_small(tmp_path: Path) -> None:
    """A 200 MiB line without newline arrives as one line; poprun's peak RSS stays far below it (measured: about 18 MiB)."""
    writer = ("import sys\nw = sys.stdout.buffer\nb = b'x' * 65536\n"
              "for _ in range(3200): w.write(b)\nw.write(b'\\nend')\n")
    # poprun's own peak, measured by a small parent (a child's peak starts at its parent's, which pytest's is not)
    measure = ("import os, subprocess, sys\n"
               "with open(sys.argv[1], 'wb') as out:\n"
               "    proc = subprocess.Popen(sys.argv[2:], stdout=out, stderr=subprocess.DEVNULL)\n"
               "    _, status, usage = os.wait4(proc.pid, 0)\n"
               "    proc.returncode = os.waitstatus_to_exitcode(status)\n"
               "print(proc.returncode, usage.ru_maxrss)\n")

    done = subprocess.run([PY, "-c", measure, str(tmp_path / "out"), PY, "-m", "poprun.cli.main", PY, "-c", writer],
                          cwd=tmp_path, capture_output=True, text=True, timeout=240, check=True,
                          env=os.environ | {"POPRUN_RUNS_DIR": str(tmp_path / "runs")})
    status, peak_kib = map(int, done.stdout.split())

    assert 0 == status
    assert (3200 * 65536 + 5, 2) == ((tmp_path / "out").stat().st_size, (tmp_path / "out").read_bytes().count(b"\n"))
    assert peak_kib < 100 * 1024, f"peak RSS {peak_kib} KiB"


def test_poprun_logs_tail_gives_back_the_last_long_lines_whole(tmp_path: Path) -> None:
    """``poprun logs --tail 2`` of a run whose last lines are 3 MiB and 10 bytes: both whole (not the 3 MiB line's last MiB)."""
    runs = tmp_path / "runs"
    done = poprun(PY, "-c", WRITER, str(1 << 20), str(3 << 20), cwd=tmp_path, runs=runs)
    (run,) = [p.name for p in runs.iterdir() if p.is_dir()]

    tail = poprun("logs", run, "--tail", "2", cwd=tmp_path, runs=runs)

    assert (0, 0) == (done.returncode, tail.returncode)
    assert [3 << 20, 10, 0] == shape(tail.stdout)
    assert line_of(3 << 20) + b"\nlast words\n" == tail.stdout


def test_output_files_keep_a_long_line_exactly_as_written(tmp_path: Path) -> None:
    """--output-filename: the file holds the 3 MiB line and the last line exactly as written (no newline added)."""
    done = poprun("--mpi-global-args=--output-filename out", PY, "-c", WRITER, str(3 << 20), cwd=tmp_path,
                  runs=tmp_path / "runs")

    assert 0 == done.returncode, done.stderr[-2000:]
    assert expected(3 << 20) == done.stdout
    assert line_of(3 << 20) + b"\nlast words" == (tmp_path / "out/1/rank.0/stdout").read_bytes()
