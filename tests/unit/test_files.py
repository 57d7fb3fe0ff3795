"""The launch's file chores: which, private directories, removal."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from poprun.backends.files import private_directory, remove_directories, which


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

    assert os.path.join(".", "prog") == which("prog", ":/usr/bin")  # noqa: PTH118


def test_private_directory_is_new_owner_only_and_in_tmpdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two calls give two directories of mode 0700 under $TMPDIR, named with the prefix."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))

    one, two = private_directory("poprun-test-"), private_directory("poprun-test-")

    assert one != two
    for path in map(Path, (one, two)):
        assert (tmp_path, 0o700) == (path.parent, stat.S_IMODE(path.stat().st_mode))
        assert path.name.startswith("poprun-test-")


def test_remove_directories_removes_empty_full_and_missing_ones(tmp_path: Path) -> None:
    """An empty directory, one with files in subdirectories, and one that does not exist: no error, none left."""
    empty, full, missing = tmp_path / "empty", tmp_path / "full", tmp_path / "missing"
    empty.mkdir()
    (full / "sub").mkdir(parents=True)
    (full / "sub" / "file").write_text("x")

    remove_directories([str(empty), str(full), str(missing)])

    assert [] == list(tmp_path.iterdir())
