"""
The file-system chores of a launch: finding a program, making and removing private directories.

Layer: ``poprun.process``; standard library only.

poprun removes only what it made. :func:`private_directory` records every directory it makes
in this process, and :func:`remove_directories` removes nothing else: a path that a plan
names, however it is spelt, is never removed unless this process made it (:func:`made_here`).

``shutil`` and ``tempfile`` do these jobs, but importing them costs poprun's start-up some
3 ms (``shutil`` loads three compression modules), a tenth of its whole budget
(``bench/apply_bench.py``). These are the few lines poprun needs; ``shutil.rmtree`` is still
used, imported only when a directory is not empty.
"""

from __future__ import annotations

import os

_PLAIN = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._/-")
_MADE: set[str] = set()  # the directories this process made and has not removed yet: the only ones it removes


def which(name: str, path: str) -> str | None:
    """Return the first executable file ``name`` in the directories of ``path`` (PATH syntax), or None."""
    for directory in path.split(os.pathsep):
        candidate = os.path.join(directory or ".", name)  # pathlib is slower here
        if os.access(candidate, os.X_OK) and not os.path.isdir(candidate):
            return candidate
    return None


def private_directory(prefix: str, *, max_length: int | None = None) -> str:
    """
    Make a new directory only its owner can use (0o700) in the temporary directory, as ``tempfile.mkdtemp``.

    The temporary directory is ``$TMPDIR``, else ``/tmp``; the name is ``prefix`` and 12 random hex
    digits. A ``$TMPDIR`` that is not a directory is passed over for ``/tmp``, as ``tempfile`` does;
    with ``max_length``, so is one that would make the path longer (a socket's path in it must fit
    the kernel's limit of about 100 bytes) or that holds characters other than letters, digits and
    ``._/-`` (ssh reads the path in its own syntax, where spaces, quotes and ``%`` mean something).
    """
    parent = os.environ.get("TMPDIR") or "/tmp"  # noqa: S108 - the name is random and the mode private
    if not os.path.isdir(parent) or (  # a TMPDIR that is gone: /tmp, as tempfile does
            max_length is not None and (len(os.path.abspath(parent)) + len(prefix) + 13 > max_length
                                        or not _PLAIN.issuperset(os.path.abspath(parent)))):
        parent = "/tmp"  # noqa: S108
    for _ in range(100):
        path = os.path.join(parent, prefix + os.urandom(6).hex())
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            continue
        path = os.path.abspath(path)
        _MADE.add(path)
        return path
    raise FileExistsError(f"no free name for a temporary directory in {parent}")


def made_here(path: str) -> bool:
    """Return whether :func:`private_directory` made ``path`` in this process (and it was not removed yet)."""
    return os.path.abspath(path) in _MADE


def remove_directories(paths: list[str] | tuple[str, ...]) -> None:
    """
    Remove each directory in ``paths`` that this process made, with everything in it; skip any other.

    A missing one is no error. A path that was not made by :func:`private_directory` here is left
    alone, whatever its name: poprun deletes only what it created, known by record.
    """
    for given in paths:
        path = os.path.abspath(given)
        if path not in _MADE:
            continue
        try:
            os.rmdir(path)  # the common case: the cache stayed empty
        except FileNotFoundError:
            pass
        except OSError:
            import shutil  # here, not at the top: see the module docstring

            shutil.rmtree(path, ignore_errors=True)
        if not os.path.lexists(path):
            _MADE.discard(path)
