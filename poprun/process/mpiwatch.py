"""
Whether an instance loaded an MPI library: the run-time half of poprun's promise to MPI programs.

Layer: ``poprun.process``; the standard library only.

The planner sees a program that calls MPI when its own code says so (:mod:`poprun.planner.mpiuse`)
and runs it under ``mpirun``. A program that reaches MPI another way (``importlib``, a wrapper
script, a module of its own, mpi4py's ``test/main.py``) is not seen, and under a backend that is no
MPI launcher (local, offline) each of its instances becomes an MPI world of one, with no word.
:class:`MpiWatch` catches that while the instances run: now and then (soon after the start, then
less and less often) it reads the memory maps (``/proc/PID/maps``) of each instance's process and
of its descendants for an MPI library (Open MPI's or MPICH's ``libmpi``), and says the first
instance found, once. Linux only; elsewhere it finds nothing.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections.abc import Iterable, Iterator

# A mapped MPI library: Open MPI's libmpi.so.40, MPICH's and Intel MPI's libmpi.so.12 or libmpich.so.12
_LIBRARY = re.compile(rb"[ \t](/[^\n]*/lib(?:mpi|mpich)\.so[.0-9]*)$", re.MULTILINE)
_FIRST_S = 0.1  # the first look, after the start; each next one twice as late, up to _EVERY_S apart
_EVERY_S = 30.0
_MAPS_MAX = 16 << 20  # bytes of one process's maps read at most
_PROCESSES_MAX = 8  # processes of one instance looked at, at most (the instance's own first: sh, then python)


def mpi_library(pid: int) -> str | None:
    """Return the path of the MPI library that ``pid`` or one of its descendants has mapped, or None."""
    for process in _tree(pid):
        found = _mapped(process)
        if found is not None:
            return found
    return None


def _tree(pid: int) -> Iterator[int]:
    """Yield ``pid`` and its descendants (breadth first, at most :data:`_PROCESSES_MAX`)."""
    seen: list[int] = [pid]
    for process in seen:
        yield process
        if len(seen) < _PROCESSES_MAX:
            seen += [child for child in _children(process) if child not in seen][:_PROCESSES_MAX - len(seen)]


def _children(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.scandir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError), open(os.path.join(task.path, "children")) as file:
                found += [int(child) for child in file.read().split()]
    return found


def _mapped(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/maps", "rb") as maps:  # pathlib costs start-up
            data = maps.read(_MAPS_MAX)
    except OSError:  # gone, or not ours
        return None
    if b"/libmpi" not in data:  # the common case, at memchr's speed
        return None
    found = _LIBRARY.search(data)
    return found[1].decode(errors="replace") if found else None


class MpiWatch:
    """
    When to look next, and the looking: :meth:`due` says when, :meth:`look` looks at the instances given.

    Looks at 0.1 s, 0.3 s, 0.7 s, 1.5 s ... after the start, then every 30 s; after the first
    find, never again (one word per launch).
    """

    def __init__(self) -> None:
        self._step = _FIRST_S
        self._next: float | None = time.monotonic() + _FIRST_S

    def due(self) -> float | None:
        """Return when (monotonic) to look next, or None once something was found."""
        return self._next

    def look(self, instances: Iterable[tuple[int, int]]) -> tuple[int, str] | None:
        """Return the first ``(index, library)`` of ``instances`` (index, pid) that has MPI loaded, or None."""
        if self._next is None:
            return None
        self._step = min(self._step * 2, _EVERY_S)
        self._next = time.monotonic() + self._step
        for index, pid in instances:
            library = mpi_library(pid)
            if library is not None:
                self._next = None
                return index, library
        return None
