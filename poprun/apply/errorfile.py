"""
torch's error files: where each instance's ``@record`` writes its uncaught exception, and what the failure report shows of it.

Layer: ``poprun.apply``; imports ``poprun.core`` and ``poprun.planner.plan``, and the
temporary-directory helpers of ``poprun.process`` (lazily).

As torchrun does, each instance gets ``TORCHELASTIC_ERROR_FILE``: a file of its own for each
attempt, ``<dir>/<attempt>/<instance>.json``, in a directory made here, owner-only: ``errors/``
in the run record (kept with it), else a temporary ``poprun-errors-*`` removed at the end, by
record. Only instances on this machine get one (an instance on another host could not write
it here). When an instance fails, its file is read as untrusted input: not followed if a link,
only a regular file, at most :data:`LIMIT` bytes, torch's JSON; its message becomes the
failure's ``error``, one printable line.
"""

from __future__ import annotations

import contextlib
import os
import stat

from popdist.env import TORCHELASTIC_ERROR_FILE
from poprun.core.localhost import is_this_machine
from poprun.core.outcome import ApplyResult
from poprun.core.record import evolve
from poprun.planner.plan import LaunchPlan

LIMIT = 64 << 10  # bytes of an error file read (torch's holds a message and a traceback)
SHOWN = 500  # characters of the message shown


class ErrorFiles:
    """The error files of one run: made for each attempt (or restarted instance), read after it, removed at the end."""

    def __init__(self, plan: LaunchPlan, record_path: str | None) -> None:
        self._here: set[int] = set()
        self.follow(plan)
        self._record_path = record_path
        self._root: str | None = None
        self._temporary = False
        self.latest: dict[int, str] = {}  # instance -> its current attempt's file
        self._folders: list[str] = []  # the attempts' folders made, in order

    def follow(self, plan: LaunchPlan) -> None:
        """Make the error files of ``plan``'s instances from now on (a re-planned attempt's, on other hosts)."""
        self._here = {i.index for i in plan.instances if plan.offline or plan.backend.traits.all_here
                      or is_this_machine(i.host)}

    def files(self, attempt: int, indices: list[int] | None = None) -> dict[int, dict[str, str]]:
        """Return ``{instance: {TORCHELASTIC_ERROR_FILE: path}}`` for attempt ``attempt`` ({} when no directory can be made)."""
        wanted = sorted(self._here if indices is None else self._here.intersection(indices))
        folder = self._folder(attempt) if wanted else None
        if folder is None:
            return {}
        paths = {index: os.path.join(folder, f"{index}.json") for index in wanted}
        self.latest.update(paths)
        return {index: {TORCHELASTIC_ERROR_FILE: path} for index, path in paths.items()}

    def read(self, result: ApplyResult) -> ApplyResult:
        """Return ``result`` with each failure's error (the message its instance's ``@record`` wrote), where there is one."""
        failures = tuple(evolve(f, error=message) if (message := read_error_file(self.latest.get(f.index))) else f
                         for f in result.failures)
        return evolve(result, failures=failures) if failures != result.failures else result

    def close(self) -> None:
        """Remove the temporary directory (by record); a run record keeps its own."""
        if self._temporary and self._root is not None:
            from poprun.process.files import remove_directories

            for folder in self._folders:  # the common case, no error written: empty folders, no rmtree to import
                with contextlib.suppress(OSError):
                    os.rmdir(folder)
            remove_directories([self._root])

    def _folder(self, attempt: int) -> str | None:
        """Return the new, owner-only directory of ``attempt``'s files, or None when it cannot be made."""
        try:
            if self._root is None:
                self._root = self._make_root()
            folder = os.path.join(self._root, str(attempt))
            with contextlib.suppress(FileExistsError):  # an instance restarted alone: its attempt's folder
                os.mkdir(folder, 0o700)
                self._folders.append(folder)
        except OSError:
            return None  # no error file: the instances' output still tells
        return folder

    def _make_root(self) -> str:
        if self._record_path is not None:
            root = os.path.join(self._record_path, "errors")
            os.mkdir(root, 0o700)
            return root
        from poprun.process.files import private_directory

        self._temporary = True
        return private_directory("poprun-errors-")


def read_error_file(path: str | None) -> str:
    """
    Return the message of torch's error file at ``path``, one printable line, or "" when there is none to show.

    Read as untrusted input: a link is not followed, only a regular file is read, at most
    :data:`LIMIT` bytes of it; anything but torch's JSON (``{"message": {"message": ...}}`` or
    ``{"message": "..."}``) is passed over.
    """
    if not path:
        return ""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return ""
        data = os.read(fd, LIMIT + 1)
    except OSError:
        return ""
    finally:
        os.close(fd)
    if len(data) > LIMIT:
        return f"(its error file is larger than {LIMIT >> 10} KiB: not shown)"
    import json  # here: only a failure reads one (start-up, see poprun.core.record)

    try:
        found = json.loads(data.decode("utf-8", errors="replace"))
    except (ValueError, RecursionError):  # not JSON, or nested deeper than the parser goes
        return ""
    message = found.get("message") if isinstance(found, dict) else None
    if isinstance(message, dict):
        message = message.get("message")
    if not isinstance(message, str):
        return ""
    line = " ".join("".join(c if c.isprintable() else " " for c in message).split())
    return line if len(line) <= SHOWN else line[:SHOWN] + " ..."
