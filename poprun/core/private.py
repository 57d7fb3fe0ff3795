"""
Making directories only their owner can use, whatever the umask.

Layer: ``poprun.core``; the standard library only.

``os.makedirs(path, mode)`` gives ``mode`` to ``path`` alone: each missing parent is made with
``0o777`` less the umask, so under ``umask 000`` the ``~/.local/state/poprun`` above a run
record was world-writable. :func:`make_directories` makes every missing one ``0o700``.
"""

from __future__ import annotations

import contextlib
import os


def make_directories(path: str, *, exist_ok: bool = False) -> None:
    """
    Make ``path`` and each missing parent, every one of them 0o700 whatever the umask; existing ones are left as they are.

    Raises:
        OSError: as ``os.makedirs`` does (``FileExistsError`` for an existing ``path`` unless ``exist_ok``).
    """
    head, tail = os.path.split(path)
    if not tail:
        head, tail = os.path.split(head)
    if head and tail and not os.path.lexists(head):
        with contextlib.suppress(FileExistsError):  # made in between by someone else
            make_directories(head, exist_ok=True)
    try:
        os.mkdir(path, 0o700)  # pathlib costs start-up
    except OSError:
        if not exist_ok or not os.path.isdir(path):
            raise
        return
    os.chmod(path, 0o700)  # a umask can take bits away from the owner too (0o277)
