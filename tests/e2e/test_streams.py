"""
poprun's streams through the real CLI: a closed stdout or stderr, a full disk, stdin, output files.

Every launch runs in a ``marked`` environment, so that each of its processes can be found by
its marker in the process table.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import Marked

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

PY = sys.executable
TWO = ["--num-instances", "2", "--num-replicas", "2"]
LAST_FAILS = 'echo hi; [ "$POPDIST_INSTANCE_INDEX" = 1 ] && sleep 0.2 && exit 3; exit 0'  # of two instances


def poprun(*args: str) -> list[str]:
    """Return the command line of the real CLI with ``args``."""
    return [PY, "-m", "poprun.cli.main", *args]


def test_closed_stdout_stops_the_run_like_sigpipe_and_leaves_nothing(tmp_path: Path, marked: Marked) -> None:
    """``poprun yes | head -1``: once the reader is gone the instances are stopped and poprun exits 141."""
    proc = subprocess.Popen(poprun(*TWO, "yes"), cwd=tmp_path, env=marked.env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None
    first = proc.stdout.readline()

    proc.stdout.close()
    _, err = proc.communicate(timeout=20)

    assert (b"y\n", 141, b"", {}) == (first, proc.returncode, err, marked.alive())


def test_closed_stderr_stops_the_run_like_sigpipe(tmp_path: Path, marked: Marked) -> None:
    """An instance writing to stderr without end, read by ``head -1``: poprun stops it and exits 141."""
    proc = subprocess.Popen(poprun(*TWO, "sh", "-c", "yes >&2"), cwd=tmp_path, env=marked.env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert proc.stderr is not None
    proc.stderr.readline()

    proc.stderr.close()
    proc.communicate(timeout=20)

    assert (141, {}) == (proc.returncode, marked.alive())


def test_stdout_on_a_full_device_is_one_warning_and_exit_1(tmp_path: Path) -> None:
    """``poprun ... > /dev/full``: one warning line on stderr, no internal error, and exit 1 like ``cat``."""
    with Path("/dev/full").open("wb") as full:
        done = subprocess.run(poprun(*TWO, "echo", "hi"), cwd=tmp_path, stdout=full, stderr=subprocess.PIPE,
                              text=True, timeout=30, check=False)

    warning = ("poprun: warning: cannot write to stdout (No space left on device): the rest of the instances' "
               "output to it is lost")
    assert (1, [warning]) == (done.returncode, done.stderr.splitlines())


def test_piped_stdin_reaches_instance_0_only_and_its_end_too(tmp_path: Path) -> None:
    """``echo hi | poprun -n 2 cat``: instance 0 reads hi and the end of input; instance 1 reads /dev/null."""
    script = 'echo "$POPDIST_INSTANCE_INDEX: $(cat) $(readlink /proc/$$/fd/0)"'
    done = subprocess.run(poprun(*TWO, "sh", "-c", script), cwd=tmp_path, input="hi\n", capture_output=True,
                          text=True, timeout=30, check=False)

    lines = sorted(done.stdout.splitlines())
    assert (0, "0: hi", "1:  /dev/null") == (done.returncode, lines[0].rsplit(" ", 1)[0], lines[1])


def test_stdin_that_is_a_terminal_is_not_read(tmp_path: Path) -> None:
    """With a terminal as stdin every instance reads /dev/null: the terminal stays the shell's."""
    leader, follower = os.openpty()
    try:
        done = subprocess.run(poprun(*TWO, "sh", "-c", "readlink /proc/$$/fd/0"), cwd=tmp_path, stdin=follower,
                              capture_output=True, text=True, timeout=30, check=False)
    finally:
        os.close(leader)
        os.close(follower)

    assert (0, ["/dev/null", "/dev/null"]) == (done.returncode, done.stdout.splitlines())


def test_closed_stdin_and_stdout_are_read_and_written_as_dev_null(tmp_path: Path) -> None:
    """``poprun ... <&- >&-``: instance 0 reads /dev/null (no pipe of poprun's), and nothing fails."""
    report = tmp_path / "fd0"
    script = f"readlink /proc/$$/fd/0 >> {report}; echo hi"
    command = shlex.join(poprun(*TWO, "sh", "-c", script))
    done = subprocess.run(["sh", "-c", f"exec {command} <&- >&-"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=30, check=False)

    assert (0, "", ["/dev/null", "/dev/null"]) == (done.returncode, done.stderr, report.read_text().splitlines())


def output_to(directory: str) -> list[str]:
    """Return the options that write the instances' output under ``directory`` (mpirun's option)."""
    return [f"--mpi-global-args=--output-filename {directory}"]


def test_output_file_that_is_a_planted_symlink_is_never_written(tmp_path: Path) -> None:
    """A symlink planted at DIR/1/rank.0/stdout: poprun refuses with PR430 (125) and the target is untouched."""
    # GIVEN
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / "logs/1/rank.0").mkdir(parents=True)
    (tmp_path / "logs/1/rank.0/stdout").symlink_to(victim)

    # WHEN
    done = subprocess.run(poprun(*TWO, *output_to("logs"), "echo", "overwritten"), cwd=tmp_path,
                          capture_output=True, text=True, timeout=30, check=False)

    # THEN
    assert (125, "precious\n") == (done.returncode, victim.read_text())
    assert "error[PR430]: output files cannot be written safely" in done.stderr
    assert "Traceback" not in done.stderr


def test_output_directory_that_is_a_planted_symlink_is_never_followed(tmp_path: Path) -> None:
    """DIR/1 planted as a symlink to another directory: refused (PR430), nothing is made there."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs/1").symlink_to(elsewhere)

    done = subprocess.run(poprun(*TWO, *output_to("logs"), "echo", "hi"), cwd=tmp_path, capture_output=True,
                          text=True, timeout=30, check=False)

    assert (125, []) == (done.returncode, list(elsewhere.iterdir()))
    assert "[PR430]" in done.stderr


def test_output_directories_are_made_private_and_reruns_overwrite(tmp_path: Path) -> None:
    """The run's directories are made 0700; a second run into the same directory replaces the files."""
    for word in ("first run, longer", "second"):
        done = subprocess.run(poprun(*TWO, *output_to("logs"), "echo", word), cwd=tmp_path, capture_output=True,
                              text=True, timeout=30, check=False)

    modes = {oct(p.stat().st_mode & 0o777) for p in (tmp_path / "logs").glob("**") if p.is_dir()}
    assert (0, {"0o700"}) == (done.returncode, modes)
    assert "second\n" == (tmp_path / "logs/1/rank.1/stdout").read_text()


def test_output_directory_of_another_user_is_refused(tmp_path: Path) -> None:
    """An existing output directory owned by someone else (planted in a shared place) is refused: PR430."""
    if os.geteuid() != 0:
        pytest.skip("making a directory of another user needs root")
    (tmp_path / "logs").mkdir()
    os.chown(tmp_path / "logs", 65534, 65534)

    done = subprocess.run(poprun(*TWO, *output_to("logs"), "echo", "hi"), cwd=tmp_path, capture_output=True,
                          text=True, timeout=30, check=False)

    assert (125, []) == (done.returncode, list((tmp_path / "logs").iterdir()))
    assert "belongs to another user (uid 65534)" in done.stderr


def mounted_tmpfs(where: Path, options: str) -> Iterator[Path]:
    """Yield ``where`` with a tmpfs of ``options`` mounted on it (root only), unmounted at the end."""
    where.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
                                           capture_output=True, check=False).returncode != 0:
        pytest.skip("mounting a small tmpfs needs root (and a kernel that lets us)")
    try:
        yield where
    finally:
        with contextlib.suppress(OSError):
            subprocess.run(["umount", str(where)], check=False)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """Return a directory on a 64 KiB tmpfs (root only)."""
    yield from mounted_tmpfs(tmp_path / "disk", "size=64k")


@pytest.fixture
def no_room(tmp_path: Path) -> Iterator[Path]:
    """Return a directory on a tmpfs that has no inode left for anything new (root only)."""
    yield from mounted_tmpfs(tmp_path / "disk", "size=64k,nr_inodes=1")


def test_full_disk_under_output_filename_is_a_warning_and_the_output_still_arrives(small_disk: Path) -> None:
    """Output files on a full disk: one warning, every line still on stdout, and the instances' status."""
    done = subprocess.run(poprun(*TWO, *output_to(str(small_disk / "logs")), "seq", "1", "50000"),
                          cwd=small_disk.parent, capture_output=True, text=True, timeout=30, check=False)

    warnings = [line for line in done.stderr.splitlines() if line.startswith("poprun: warning:")]
    assert (0, 100000, 1) == (done.returncode, len(done.stdout.splitlines()), len(warnings))
    assert "No space left on device" in warnings[0]
    assert "internal error" not in done.stderr


def test_disk_full_before_the_output_files_are_made_is_a_warning_too(no_room: Path) -> None:
    """No room even for the output directories: one warning, the output on stdout, the instances' status."""
    done = subprocess.run(poprun(*TWO, *output_to(str(no_room / "logs")), "sh", "-c", LAST_FAILS),
                          cwd=no_room.parent, capture_output=True, text=True, timeout=30, check=False)

    warnings = [line for line in done.stderr.splitlines() if line.startswith("poprun: warning:")]
    assert (3, ["hi", "hi"], 1) == (done.returncode, done.stdout.splitlines(), len(warnings))
    assert "No space left on device" in warnings[0]
