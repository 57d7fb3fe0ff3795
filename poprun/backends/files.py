"""
The file-system chores of a launch: finding a program, making and removing private directories.

Layer: ``poprun.backends``; standard library only.

``shutil`` and ``tempfile`` do these jobs, but importing them costs poprun's start-up some
3 ms (``shutil`` loads three compression modules), a tenth of its whole budget
(``bench/apply_bench.py``). These are the few lines poprun needs; ``shutil.rmtree`` is still
used, imported only when a directory is not empty.
"""

from __future__ import annotations

import os


def which(name: str, path: str) -> str | None:
    """Return the first executable file ``name`` in the directories of ``path`` (PATH syntax), or None."""
    for directory in path.split(os.pathsep):
        candidate = os.path.join(directory or ".", name)  # noqa: PTH118 - pathlib is slower here
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):  # noqa: PTH112
            return candidate
    return None


def private_directory(prefix: str) -> str:
    """
    Make a new directory only its owner can use (0o700) in the temporary directory, as ``tempfile.mkdtemp``.

    The temporary directory is ``$TMPDIR``, else ``/tmp``; the name is ``prefix`` and 12 random hex digits.
    """
    parent = os.environ.get("TMPDIR") or "/tmp"  # noqa: S108 - the name is random and the mode private
    for _ in range(100):
        path = os.path.join(parent, prefix + os.urandom(6).hex())  # noqa: PTH118
        try:
            os.mkdir(path, 0o700)  # noqa: PTH102
        except FileExistsError:
            continue
        return os.path.abspath(path)  # noqa: PTH100
    raise FileExistsError(f"no free name for a temporary directory in {parent}")


def remove_directories(paths: list[str] | tuple[str, ...]) -> None:
    """Remove each directory in ``paths`` with everything in it; a missing one is no error."""
    for path in paths:
        try:
            os.rmdir(path)  # noqa: PTH106 - the common case: the cache stayed empty
        except FileNotFoundError:
            continue
        except OSError:
            import shutil  # here, not at the top: see the module docstring

            shutil.rmtree(path, ignore_errors=True)
