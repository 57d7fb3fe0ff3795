"""
The output router: instance output to the sink in whole lines, tagged, filtered and filed.

Layer: ``poprun.process``; imports :mod:`poprun.core.launching` (and the rest of ``poprun.core``) and ``poprun.planner.plan``,
never the spec, and never prints (the sink does). It is fed raw chunks as they are read from an
instance's pipes and passes on whole lines, so that the lines of two instances are never cut or
interleaved mid-line; a line without its newline at the end of a stream gets one.

A line of any length arrives whole and byte-exact, in bounded memory: an unfinished line longer
than :data:`STREAM_AT` (1 MiB) is not held until its end but passed on as it comes (to the sink
and the record, without a newline until its end); meanwhile that stream of the sink belongs to
it, and what the other instances write to the same stream is held, in order, and passed on at
its end. Should more than :data:`HOLD_MAX` (64 MiB) be held, or any of it for :data:`HOLD_S` (5 s: a
progress bar of carriage returns may never end its line), the long line is ended on the sink
where it is, with a warning on stderr (once per instance), and the rest follows on a line of its own: the
record (each instance apart) and the ``--output-filename`` files keep it whole. A failure
report's tail keeps at most :data:`TAIL_LINE` bytes of a line, and says how long it was.

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

from poprun.core.diagnostic import LaunchError
from poprun.core.events import PhaseEnded
from poprun.core.launching import InstanceSink, OutputSink, Stream
from poprun.core.private import make_directories
from poprun.planner.plan import LaunchPlan

TAIL_LINES = 20  # lines of each instance's output kept for the failure report
TAIL_LINE = 4096  # bytes of one line kept in a tail; a longer line is kept cut, saying how long it was
STREAM_AT = 1 << 20  # an unfinished line longer than this is passed on as it comes, not held until its end
HOLD_MAX = 64 << 20  # bytes of other instances' output held per stream while one instance's long line passes
HOLD_S = 5.0  # and for how long at most (a progress bar of carriage returns may never end its line)
_FLUSH_AT = 1 << 20  # bytes waiting for the sink that make feed() flush at once
_STREAMS: tuple[Stream, ...] = ("stdout", "stderr")
_FULL = (errno.ENOSPC, errno.EDQUOT)  # making the output files failed for want of space: a warning
_MERGE_BELOW = 1 << 16  # a held chunk shorter than this takes the next one of its instance into it
_HELD_ITEM = 64  # bytes counted for each held chunk besides its own (small chunks cost memory too)


class Router:
    """
    Routes the output of every instance of a plan.

    Every whole line goes to its instance's tail, to the sink's ``instance_lines(index, stream,
    lines)`` when it has one (an :class:`~poprun.core.launching.InstanceSink`: the apply step's run
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
        # a sink that keeps each instance's lines (a run record): one that subclasses InstanceSink (nominal at run time)
        instances = sink if isinstance(sink, InstanceSink) else None  # type: ignore[misc]
        self._keep = instances.instance_lines if instances is not None else None
        self._alive = instances.instance_output if instances is not None else None  # every read, lines or not (stalls)
        indices = [i.index for i in plan.instances]
        only = plan.output.only_from_instance
        self._shown = {i: only is None or only == i for i in indices}
        self._prefix = {(i, s): b"[1,%d]<%s>:" % (i, s.encode()) for i in indices for s in _STREAMS} \
            if plan.output.tag else {}
        self._pending: dict[tuple[int, Stream], bytearray] = {}  # the start of a line, until its end or STREAM_AT
        self._owner: dict[Stream, tuple[int, Stream] | None] = {"stdout": None, "stderr": None}  # a long line passing
        self._held: dict[Stream, list[tuple[tuple[int, Stream], bytes | None]]] = {"stdout": [], "stderr": []}
        self._held_bytes = {"stdout": 0, "stderr": 0}
        self._held_since = {"stdout": 0.0, "stderr": 0.0}  # (monotonic) when output began to wait on each stream
        self._told: set[tuple[int, Stream]] = set()  # keys whose long line was cut on the sink, said once
        self._releasing = {"stdout": False, "stderr": False}
        self._open: set[tuple[int, Stream]] = set()  # keys whose line on the sink has begun and not ended
        self._tails = {i: collections.deque[bytes](maxlen=TAIL_LINES) for i in indices}
        self._head: dict[tuple[int, Stream], bytes] = {}  # the start of an unfinished line, for the tail
        self._length: dict[tuple[int, Stream], int] = {}  # and its length so far
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
        if chunk:
            self._take((index, stream), chunk)

    def _take(self, key: tuple[int, Stream], chunk: bytes | None) -> None:
        """
        Pass on what ``chunk`` completes of ``key``'s output, or hold it while another instance's long line passes.

        ``chunk`` None is the end of the stream: a last line without newline gets one.
        """
        stream = key[1]
        owner = self._owner[stream]
        if (owner is not None and owner != key) or (owner is None and self._held[stream]):
            self._hold(key, chunk)
            return
        if owner == key:  # this instance's long line is passing: its bytes go on as they come, up to its end
            if chunk is None:
                self._pass(key, b"\n")
                return
            cut = chunk.find(b"\n") + 1
            if not cut:
                self._pass(key, chunk)
                return
            self._pass(key, chunk[:cut])  # its end: what was held meanwhile goes on now
            chunk = chunk[cut:]
            if not chunk:
                return
            if self._owner[stream] is not None or self._held[stream]:
                self._hold(key, chunk)
                return
        pending = self._pending.get(key)
        if chunk is None:
            if pending:
                del self._pending[key]
                self._pass(key, bytes(pending) + b"\n")
            return
        cut = chunk.rfind(b"\n") + 1
        if cut:
            if pending is not None:
                del self._pending[key]
            self._pass(key, bytes(pending) + chunk[:cut] if pending else chunk[:cut])
            if cut == len(chunk):
                return
            chunk, pending = chunk[cut:], None
        if pending is None:
            pending = self._pending[key] = bytearray()
        pending += chunk
        if len(pending) > STREAM_AT:  # too long to wait for: it passes as it comes, the other instances' lines wait
            del self._pending[key]
            self._pass(key, bytes(pending))

    def _hold(self, key: tuple[int, Stream], chunk: bytes | None) -> None:
        """Keep ``chunk`` of ``key`` until the long line passing on its stream ends (or, held too much, is cut)."""
        stream = key[1]
        held = self._held[stream]
        if not held:
            self._held_since[stream] = time.monotonic()
        last = held[-1] if held else None
        if last is not None and last[0] == key and last[1] is not None and chunk is not None \
                and len(last[1]) < _MERGE_BELOW:
            held[-1] = (key, last[1] + chunk)
        else:
            held.append((key, chunk))
            self._held_bytes[stream] += _HELD_ITEM
        self._held_bytes[stream] += len(chunk or b"")
        self._waited_enough(stream)

    def _waited_enough(self, stream: Stream) -> None:
        """Cut the long line passing on ``stream`` when the others' output held behind it is too much, or too old."""
        if self._owner[stream] is not None and self._held[stream] and (
                self._held_bytes[stream] > HOLD_MAX or time.monotonic() - self._held_since[stream] > HOLD_S):
            self._cut(stream)

    def _cut(self, stream: Stream) -> None:
        """End the long line passing on ``stream`` where it is, on the sink only, saying so: too much output of others waits."""
        owner = self._owner[stream]
        assert owner is not None
        self._owner[stream] = None
        self._open.discard(owner)
        self._ready[stream].append(b"\n")
        self.flush()
        if owner not in self._told:
            self._told.add(owner)
            self._sink.write("stderr", (
                f"poprun: warning: instance {owner[0]}'s {stream} line was cut on the terminal after "
                f"{self._length.get(owner, 0)} bytes, to let the other instances' output through (it waits behind "
                f"a long line for {HOLD_S:g} s or {HOLD_MAX} bytes at most); its rest follows on lines of its own "
                "(the run record and output files keep it whole)\n").encode())
        self._release(stream)

    def _release(self, stream: Stream) -> None:
        """Pass on what was held on ``stream`` while a long line passed, in the order it came."""
        if self._releasing[stream]:
            return  # the outer call goes on with what is left
        self._releasing[stream] = True
        try:
            while self._owner[stream] is None and self._held[stream]:
                waiting, self._held[stream] = self._held[stream], []
                self._held_bytes[stream] = 0
                for key, chunk in waiting:  # what another long line makes wait again is held again, in order
                    self._take(key, chunk)
        finally:
            self._releasing[stream] = False

    def _pass(self, key: tuple[int, Stream], data: bytes) -> None:
        """
        Pass on ``data`` of ``key``: whole lines, or a part of a long line (then its stream waits for that line's end).

        An instance whose output is not shown never makes the others wait: its parts go to its tail and the record only.
        """
        index, stream = key
        self._keep_tail(key, data)
        if self._keep is not None:
            self._keep(index, stream, data)
        if not self._shown[index]:
            return
        prefix = self._prefix.get(key)
        ready = self._ready[stream]
        if prefix is None:
            ready.append(data)
        else:  # every newline but a last one is followed by the prefix; so is the start of a line
            tagged = data.replace(b"\n", b"\n" + prefix)
            if key not in self._open:
                ready.append(prefix)
            ready.append(memoryview(tagged)[:-len(prefix)] if data.endswith(b"\n") else tagged)
        self._ready_bytes += len(data)
        if data.endswith(b"\n"):
            self._open.discard(key)
            if self._owner[stream] == key:
                self._owner[stream] = None
                self._release(stream)
        else:
            self._open.add(key)
            self._owner[stream] = key
        if self._ready_bytes >= _FLUSH_AT:
            self.flush()

    def _keep_tail(self, key: tuple[int, Stream], data: bytes) -> None:
        """Keep the last lines of ``data`` in its instance's tail, each at most :data:`TAIL_LINE` bytes."""
        tails = self._tails[key[0]]
        head = self._head.pop(key, None)
        if head is not None:  # the start of a long line came before
            newline = data.find(b"\n")
            if newline < 0:
                self._head[key] = head + data[:TAIL_LINE - len(head)] if len(head) < TAIL_LINE else head
                self._length[key] += len(data)
                return
            length = self._length.pop(key) + newline
            tails.append(_cut_line(head + data[:max(0, min(newline, TAIL_LINE - len(head)))], length))
            data = data[newline + 1:]
        last = data.rsplit(b"\n", TAIL_LINES + 1)  # the last item is what follows the last newline
        if last[-1]:
            self._head[key] = last[-1][:TAIL_LINE]
            self._length[key] = len(last[-1])
        tails.extend(_cut_line(line, len(line)) for line in (last[1:-1] if len(last) > TAIL_LINES + 1 else last[:-1]))

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
        key = (index, stream)
        if key in self._pending or key in self._open or self._held[stream]:
            self._take(key, None)

    def flush(self) -> None:
        """Write every queued line to the sink: one call per stream."""
        for stream in _STREAMS:
            self._waited_enough(stream)
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
        while owners := [key for key in self._owner.values() if key is not None]:
            for key in owners:
                self._take(key, None)  # what was held behind it goes on, and may start another long line
        for key in list(self._pending):
            self._take(key, None)
        self.flush()
        self._close_files()


def _cut_line(line: bytes, length: int) -> bytes:
    """Return ``line`` (its first bytes, of ``length``) for a tail: cut at :data:`TAIL_LINE` bytes, saying so."""
    return line if length <= TAIL_LINE else line[:TAIL_LINE] + b" [... a line of %d bytes]" % length


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
        from poprun.core.diagnostic import launch_error
        from poprun.core.span import SourceSpan

        raise launch_error("PR435", "output files cannot be made",
                           detail=f"cannot write output files under '{directory}': {exc.strerror}",
                           span=SourceSpan.environment(directory),
                           hint="give --output-filename (in --mpi-global-args) a directory you can write in, or free "
                                "room there") from exc
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
