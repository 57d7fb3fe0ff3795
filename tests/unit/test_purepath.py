"""poprun.core.purepath spells and checks paths as pathlib does (Python 3.11), without importing it."""

from __future__ import annotations

import itertools
import os
import pathlib
import subprocess
import sys

import pytest

from poprun.core.purepath import absolute, exists, expanduser, is_dir, pure

PARTS = ["", "/", "//", "///", ".", "..", "a", "b", "~", "~root", "./", "a/", "a//b", "/./c/"]


def _combinations() -> list[list[str]]:
    return [list(combo) for n in range(1, 4) for combo in itertools.product(PARTS, repeat=n)]


@pytest.mark.parametrize("parts", _combinations()[:: 7])
def test_pure_and_absolute_spell_paths_as_pathlib(parts: list[str]) -> None:
    assert pure(*parts) == str(pathlib.PurePosixPath(*parts))
    assert absolute(*parts) == str(pathlib.Path(*parts).absolute())


@pytest.mark.parametrize("home", ["/home/u", "/home/u/", "//net/u", "/a/./b", "/"])
def test_expanduser_as_pathlib(home: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", home)
    for name in ("~/.vipu/vipu-cli.hcl", "~", "/etc/vipu/vipu-cli.hcl", "a/~/b", "~root/x"):
        assert expanduser(name) == str(pathlib.Path(name).expanduser())


def test_exists_and_is_dir_as_pathlib(tmp_path: pathlib.Path) -> None:
    (tmp_path / "file").write_text("x")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    for name in ("file", "missing", "file/below", "loop", "."):
        path = str(tmp_path / name)
        assert (exists(path), is_dir(path)) == (pathlib.Path(path).exists(), pathlib.Path(path).is_dir())
    assert not exists("a\0b")
    assert not is_dir("a\0b")


@pytest.mark.skipif(os.geteuid() == 0, reason="root may read any directory")
def test_a_denied_stat_raises_as_pathlib(tmp_path: pathlib.Path) -> None:
    closed = tmp_path / "closed"
    closed.mkdir(mode=0)
    try:
        with pytest.raises(PermissionError):
            exists(str(closed / "x"))
    finally:
        closed.chmod(0o700)


def test_a_launch_imports_no_pathlib() -> None:
    """The modules a launch imports spell paths with os.path (style.md section 5)."""
    code = ("import sys; import poprun.cli.commands.launch, poprun.cli.run, poprun.backends.local; "
            "print(sorted({'pathlib', 'urllib.parse', 'ipaddress'} & set(sys.modules)))")
    found = subprocess.run([sys.executable, "-S", "-c", f"import sys; sys.path[:0] = {sys.path!r}; {code}"],
                           capture_output=True, text=True, check=True).stdout
    assert found == "[]\n"
