"""
The output router: instance output to the sink in whole lines, tagged, filtered and filed.

Layer: ``poprun.backends``; imports :mod:`poprun.backends.base` and ``poprun.planner.plan``,
never the spec, and never prints (the sink does). It is fed raw chunks as they are read from an
instance's pipes and only ever passes on whole lines, so that the lines of two instances are
never cut or interleaved mid-line; a line without its newline at the end of a stream gets one.

Speed is the point here (``bench/apply_bench.py`` compares it with ``mpirun --tag-output``):
lines are never handled one by one. A chunk is cut at its last newline; tagging is one
``bytes.replace`` of the newlines of the whole part; the tail keeps only the last lines of a
chunk (``rsplit`` from the right); and what is ready is written to the sink in one call per
stream when the reader calls :meth:`Router.flush`. One thread feeds a router. It also tells
the sink when every instance has printed something (the ``first-output`` phase, counted from
:meth:`Router.started`).
"""

from __future__ import annotations

import collections
import contextlib
import errno
import os
import stat
import time

from poprun.backends.base import LaunchError, OutputSink, Stream
from poprun.core.events import PhaseEnded
from poprun.core.private import make_directories
from poprun.planner.plan import LaunchPlan

TAIL_LINES = 20  # lines of each instance's output kept for the failure report
MAX_LINE = 1 << 20  # a line longer than this is passed on in parts (each given a newline)
_FLUSH_AT = 1 << 20  # bytes waiting for the sink that make feed() flush at once
_STREAMS: tuple[Stream, ...] = ("stdout", "stderr")
_FULL = (errno.ENOSPC, errno.EDQUOT)  # making the output files failed for want of space: a warning


class Router:
    """
    Routes the output of every instance of a plan.

    Every whole line goes to its instance's tail, to the sink's ``instance_lines(index, stream,
    lines)`` when it has one (an :class:`~poprun.backends.base.InstanceSink`: the apply step's run
    record) and, unless ``only_from_instance`` names another instance, to the sink (prefixed ``[1,<index>]<stdout>:`` when the plan tags
    output, like ``mpirun --tag-output``). With ``output_filename DIR`` the bytes of each
    stream are also written, exactly as they came, to ``DIR/1/rank.<index>/stdout|stderr``
    (mpirun's layout). mpirun 4.1 still echoes output to the terminal with
    ``--output-filename``, and so does poprun.

    The files are made safely (:func:`_open_files`). Should the disk be full when they are
    made, or writing one fail later, every file is closed where it is and one warning line
    goes to the sink's stderr: the output still reaches the sink, and the launch goes on.

    Raises:
        LaunchError: (125) when an output file cannot be made; with a PR430 diagnostic when a
            path there is a symbolic link, not a regular file or directory, or another user's.
    """

    def __init__(self, plan: LaunchPlan, sink: OutputSink) -> None:
        self._sink = sink
        self._keep = getattr(sink, "instance_lines", None)  # a sink that keeps each instance's lines (a run record)
        self._alive = getattr(sink, "instance_output", None)  # a sink told of every read, whole lines or not (stalls)
        indices = [i.index for i in plan.instances]
        only = plan.output.only_from_instance
        self._shown = {i: only is None or only == i for i in indices}
        self._prefix = {(i, s): b"[1,%d]<%s>:" % (i, s.encode()) for i in indices for s in _STREAMS} \
            if plan.output.tag else {}
        self._pending: dict[tuple[int, Stream], bytes] = {}
        self._tails = {i: collections.deque[bytes](maxlen=TAIL_LINES) for i in indices}
        self._ready: dict[Stream, list[bytes | memoryview]] = {"stdout": [], "stderr": []}
        self._ready_bytes = 0
        self._directory = plan.output.output_filename
        self._tell = getattr(sink, "event", None)  # hears when every instance has printed (PhaseEnded first-output)
        self._unseen = set(indices)  # instances that have not printed yet
        self.began = time.monotonic()  # when the instances were told to start (started())
        try:
            self._files = _open_files(self._directory, indices)
        except OSError as exc:  # the disk is full already: a warning, as when it fills up later
            self._files = {}
            sink.write("stderr", (f"poprun: warning: cannot make the output files under {self._directory} "
                                  f"({exc.strerror}): the output still reaches the terminal\n").encode(errors="replace"))

    def started(self) -> None:
        """Take that every instance was just told to start: the first-output phase counts from now."""
        self.began = time.monotonic()

    def _first_output(self, index: int) -> None:
        """Take the first output of instance ``index``; once every instance has printed, tell the sink how long that took."""
        self._unseen.discard(index)
        if not self._unseen and self._tell is not None:
            self._tell(PhaseEnded(phase="first-output", ms=round((time.monotonic() - self.began) * 1000)))

    def feed(self, index: int, stream: Stream, chunk: bytes) -> None:
        """Take ``chunk``, just read from ``stream`` of instance ``index``."""
        if index in self._unseen and chunk:
            self._first_output(index)
        if self._alive is not None:  # a progress bar ('\r40%') is output, though no line ends
            self._alive(index)
        fd = self._files.get((index, stream))
        if fd is not None:
            try:
                _write_all(fd, chunk)
            except OSError as exc:
                self._file_failed(index, stream, exc)
        key = (index, stream)
        rest = self._pending.pop(key, b"")
        cut = chunk.rfind(b"\n") + 1
        if cut == 0:
            rest += chunk
            if len(rest) <= MAX_LINE:
                self._pending[key] = rest
            else:
                self._lines(index, stream, rest + b"\n")
            return
        if cut < len(chunk):
            self._pending[key] = chunk[cut:]
            chunk = chunk[:cut]
        self._lines(index, stream, rest + chunk if rest else chunk)

    def _file_failed(self, index: int, stream: Stream, exc: OSError) -> None:
        """Take a failed write of an output file (ENOSPC): close them all, say so once on stderr, go on."""
        self._close_files()
        self.flush()
        self._sink.write("stderr", (f"poprun: warning: cannot write {self._directory}/1/rank.{index}/{stream} "
                                    f"({exc.strerror or exc}): the output files stop here; the output still "
                                    "reaches the terminal\n").encode(errors="replace"))

    def _close_files(self) -> None:
        for fd in self._files.values():
            os.close(fd)
        self._files.clear()

    def end(self, index: int, stream: Stream) -> None:
        """
        Take the end of ``stream`` of instance ``index``: a last line without newline gets one.

        Its output file stays open until :meth:`close`: an instance started again
        (``--restart-scope instance``) goes on writing to it, after what it wrote before.
        """
        rest = self._pending.pop((index, stream), b"")
        if rest:
            self._lines(index, stream, rest + b"\n")

    def _lines(self, index: int, stream: Stream, lines: bytes) -> None:
        """Keep the tail of ``lines`` (whole lines, ending in a newline) and queue them for the sink."""
        last = lines.rsplit(b"\n", TAIL_LINES + 1)  # the last item is the b"" after the last newline
        self._tails[index].extend(last[1:-1] if len(last) > TAIL_LINES + 1 else last[:-1])
        if self._keep is not None:
            self._keep(index, stream, lines)
        if not self._shown[index]:
            return
        ready = self._ready[stream]
        prefix = self._prefix.get((index, stream))
        if prefix is None:
            ready.append(lines)
        else:  # every newline but the last is followed by the prefix; the first line gets it too
            tagged = lines.replace(b"\n", b"\n" + prefix)
            ready += (prefix, memoryview(tagged)[:-len(prefix)])
        self._ready_bytes += len(lines)
        if self._ready_bytes >= _FLUSH_AT:
            self.flush()

    def flush(self) -> None:
        """Write every queued line to the sink: one call per stream."""
        for stream, parts in self._ready.items():
            if parts:
                data = b"".join(parts)  # one part that is bytes comes back as it is, not copied
                parts.clear()
                self._sink.write(stream, data)
        self._ready_bytes = 0

    def tail(self, index: int) -> tuple[str, ...]:
        """Return the last lines of instance ``index``'s output (stdout and stderr as they came)."""
        return tuple(line.decode(errors="replace") for line in self._tails[index])

    def close(self) -> None:
        """Pass on what is left (last lines without newline), then close the output files."""
        for index, stream in list(self._pending):
            self.end(index, stream)
        self.flush()
        self._close_files()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _open_files(directory: str | None, indices: list[int]) -> dict[tuple[int, Stream], int]:
    """
    Return a file descriptor for each instance's stdout and stderr under ``directory`` (mpirun's layout).

    Nothing here is followed through a symbolic link or written in another user's place: the
    user's ``directory`` is made (0o700) if missing and must be this user's; ``1/`` and
    ``rank.N/`` below it are made fresh (0o700) or, left by an earlier run, must be real
    directories of this user; each file is opened ``O_NOFOLLOW`` (``O_EXCL`` in a fresh
    directory), must be this user's regular file with one link, and only then is truncated.
    """
    files: dict[tuple[int, Stream], int] = {}
    if directory is None:
        return files
    fds: list[int] = []
    try:
        top = _user_directory(directory)
        fds.append(top)
        one, _ = _own_directory(top, "1", directory)
        fds.append(one)
        for index in indices:
            rank, fresh = _own_directory(one, f"rank.{index}", f"{directory}/1")
            fds.append(rank)
            for stream in _STREAMS:
                files[index, stream] = _own_file(rank, stream, f"{directory}/1/rank.{index}", fresh=fresh)
    except (OSError, _UnsafeError) as exc:
        for fd in files.values():
            os.close(fd)
        if isinstance(exc, _UnsafeError):
            raise LaunchError(exc.diagnostic.detail, diagnostics=(exc.diagnostic,)) from None
        if exc.errno in _FULL:
            raise
        raise LaunchError(f"cannot write output files under '{directory}': {exc.strerror}") from exc
    finally:
        for fd in fds:
            os.close(fd)
    return files


class _UnsafeError(Exception):
    """A path of the output files is not safe to write (PR430)."""

    def __init__(self, path: str, what: str) -> None:
        from poprun.core.diagnostic import error
        from poprun.core.span import SourceSpan

        super().__init__(what)
        self.diagnostic = error(
            "PR430", "output files cannot be written safely", detail=f"'{path}' {what}",
            span=SourceSpan.environment(path),
            hint="poprun never writes output files through a symbolic link or in another user's directory: remove "
                 "it, or give --output-filename a directory of your own")


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


def _user_directory(path: str) -> int:
    """Return a descriptor of ``path`` (made 0o700 with its missing parents); it must belong to this user."""
    with contextlib.suppress(FileExistsError):
        make_directories(path)
    fd = os.open(path, _DIR_FLAGS)
    _check_owner(fd, path)
    return fd


def _own_directory(parent: int, name: str, where: str) -> tuple[int, bool]:
    """Return a descriptor of directory ``name`` in ``parent`` and whether it was made now (0o700)."""
    path = f"{where}/{name}"
    try:
        os.mkdir(name, 0o700, dir_fd=parent)
        fresh = True
    except FileExistsError:
        fresh = False
    try:
        fd = os.open(name, _DIR_FLAGS | os.O_NOFOLLOW, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise _UnsafeError(path, "is a symbolic link or not a directory") from exc
        raise
    _check_owner(fd, path)
    return fd, fresh


def _own_file(parent: int, name: str, where: str, *, fresh: bool) -> int:
    """Return ``name`` in ``parent`` opened for writing, never through a link; emptied if it was there."""
    path = f"{where}/{name}"
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_EXCL if fresh else 0)
    try:
        fd = os.open(name, flags, 0o644, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.EEXIST, errno.ENXIO):  # a link, a file planted in a fresh dir, a FIFO
            raise _UnsafeError(path, "is a symbolic link or not a regular file of its own") from exc
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1:
        os.close(fd)
        raise _UnsafeError(path, "is not a regular file of its own (a device, a FIFO or a hard link)")
    _check_owner(fd, path)
    os.set_blocking(fd, True)
    os.ftruncate(fd, 0)
    return fd


def _check_owner(fd: int, path: str) -> None:
    """Raise :class:`_UnsafeError` (closing ``fd``) when ``fd`` is not this user's."""
    owner = os.fstat(fd).st_uid
    if owner != os.geteuid():
        os.close(fd)
        raise _UnsafeError(path, f"belongs to another user (uid {owner})")
