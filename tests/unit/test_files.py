"""The launch's file chores: which, private directories, removal."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from poprun.process.files import private_directory, remove_directories, which


def test_which_finds_the_first_executable_file_and_skips_the_rest(tmp_path: Path) -> None:
    """Non-executable files and directories of the name are passed over, in PATH order."""
    first, second, third = (tmp_path / name for name in ("a", "b", "c"))
    for directory in (first, second, third):
        directory.mkdir()
    (first / "prog").write_text("")  # not executable
    (second / "prog").mkdir()  # a directory
    (third / "prog").write_text("#!/bin/sh\n")
    (third / "prog").chmod(0o755)

    assert str(third / "prog") == which("prog", os.pathsep.join(map(str, (first, second, third))))
    assert which("missing", str(third)) is None


def test_which_reads_an_empty_path_entry_as_the_current_directory(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """PATH=':/usr/bin' finds ./prog first, as a shell does."""
    (tmp_path / "prog").write_text("")
    (tmp_path / "prog").chmod(0o700)
    monkeypatch.chdir(tmp_path)

    assert os.path.join(".", "prog") == which("prog", ":/usr/bin")


def test_private_directory_is_new_owner_only_and_in_tmpdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two calls give two directories of mode 0700 under $TMPDIR, named with the prefix."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))

    one, two = private_directory("poprun-test-"), private_directory("poprun-test-")

    assert one != two
    for path in map(Path, (one, two)):
        assert (tmp_path, 0o700) == (path.parent, stat.S_IMODE(path.stat().st_mode))
        assert path.name.startswith("poprun-test-")


def test_remove_directories_removes_empty_full_and_missing_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Directories made here, empty, with files in subdirectories, or already gone: no error, none left."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    empty, full, missing = (Path(private_directory(f"poprun-{name}-")) for name in ("empty", "full", "missing"))
    (full / "sub").mkdir(parents=True)
    (full / "sub" / "file").write_text("x")
    missing.rmdir()

    remove_directories([str(empty), str(full), str(missing)])

    assert [] == list(tmp_path.iterdir())


@pytest.mark.parametrize("name", ["poprun-cache-0123456789ab", "poprun-ssh-x", "anything"])
def test_remove_directories_never_removes_what_this_process_did_not_make(tmp_path: Path, name: str) -> None:
    """A directory that private_directory did not make here is kept, whatever its name says."""
    mine = tmp_path / name
    mine.mkdir()
    (mine / "precious").write_text("keep")

    remove_directories([str(mine), str(tmp_path / name / ".." / name)])

    assert "keep" == (mine / "precious").read_text()


def test_a_directory_is_removed_once_even_if_remade_under_its_name(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Once removed, the record is gone: a directory made again at that path by someone else is not removed."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    path = Path(private_directory("poprun-cache-"))
    remove_directories([str(path)])
    path.mkdir()  # someone else's now
    (path / "theirs").write_text("keep")

    remove_directories([str(path)])

    assert (path / "theirs").exists()


def test_private_directory_passes_over_a_tmpdir_too_long_for_its_purpose(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """With max_length, a $TMPDIR deep enough to make the path longer gives way to /tmp; a short one is kept."""
    deep = tmp_path / ("d" * 60)
    deep.mkdir()
    monkeypatch.setenv("TMPDIR", str(deep))
    made = Path(private_directory("poprun-test-", max_length=49))
    monkeypatch.setenv("TMPDIR", "/tmp")
    short = Path(private_directory("poprun-test-", max_length=49))
    try:
        assert (Path("/tmp"), Path("/tmp")) == (made.parent, short.parent)
    finally:
        remove_directories([str(made), str(short)])
