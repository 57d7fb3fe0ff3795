"""
Paths as pathlib spells and checks them, with ``os.path``'s import cost: for the launch path.

Layer: ``poprun.core``; the standard library only (``os`` and ``errno``; never ``pathlib``).

``pathlib`` costs a launch 3-4 ms to import (``re``, ``fnmatch``, ``urllib.parse``;
``style.md`` section 5), so the modules a launch imports spell their paths with ``os.path``. Where a
path is printed, or a check's failure is seen, these functions keep what ``pathlib`` did
(Python 3.11): :func:`pure` is ``str(PurePosixPath(*parts))`` (``.`` parts and repeated or
trailing slashes dropped, ``..`` kept, a leading ``//`` kept), and :func:`exists` and
:func:`is_dir` are ``Path.exists`` and ``Path.is_dir``, which raise an ``OSError`` other than
"no such file" (``EACCES`` say) where ``os.path``'s return False.
"""


from __future__ import annotations

import errno
import os
import stat

# The errors Path.exists and Path.is_dir take for "not there" (pathlib's _IGNORED_ERRNOS).
_ABSENT = (errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP)

__all__ = ["absolute", "exists", "expanduser", "is_dir", "pure"]


def pure(*parts: str) -> str:
    """Return ``str(PurePosixPath(*parts))``: the parts joined, an absolute one starting afresh."""
    root = ""
    names: list[str] = []
    for part in parts:
        if part.startswith("/"):
            root = "//" if part.startswith("//") and not part.startswith("///") else "/"
            names = []
        names += [name for name in part.split("/") if name and name != "."]
    return (root + "/".join(names)) or "."


def absolute(*parts: str) -> str:
    """Return ``str(Path(*parts).absolute())``: relative to the current directory unless absolute."""
    path = pure(*parts)
    return path if path.startswith("/") else pure(os.getcwd(), path)


def expanduser(path: str) -> str:
    """
    Return ``str(Path(path).expanduser())``.

    Raises:
        RuntimeError: as pathlib does, when the home directory cannot be determined.
    """
    path = pure(path)
    if not path.startswith("~"):
        return path
    first, _, rest = path.partition("/")
    home = os.path.expanduser(first)
    if home[:1] == "~":
        msg = "Could not determine home directory."
        raise RuntimeError(msg)
    return pure(home, rest)


def exists(path: str) -> bool:
    """Return ``Path(path).exists()``."""
    return _mode(path) is not None


def is_dir(path: str) -> bool:
    """Return ``Path(path).is_dir()``."""
    mode = _mode(path)
    return mode is not None and stat.S_ISDIR(mode)


def _mode(path: str) -> int | None:
    """Return ``path``'s mode (symbolic links followed), None where pathlib takes it for not there."""
    try:
        return os.stat(path).st_mode
    except OSError as exc:
        if exc.errno not in _ABSENT:
            raise
        return None
    except ValueError:
        return None
