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
stream when the reader calls :meth:`Router.flush`. One thread feeds a router.
"""

from __future__ import annotations

import collections
import os
from pathlib import Path

from poprun.backends.base import LaunchError, OutputSink, Stream
from poprun.planner.plan import LaunchPlan

TAIL_LINES = 20  # lines of each instance's output kept for the failure report
MAX_LINE = 1 << 20  # a line longer than this is passed on in parts (each given a newline)
_FLUSH_AT = 1 << 20  # bytes waiting for the sink that make feed() flush at once
_STREAMS: tuple[Stream, ...] = ("stdout", "stderr")


class Router:
    """
    Routes the output of every instance of a plan.

    Every whole line goes to its instance's tail and, unless ``only_from_instance`` names
    another instance, to the sink (prefixed ``[1,<index>]<stdout>:`` when the plan tags
    output, like ``mpirun --tag-output``). With ``output_filename DIR`` the bytes of each
    stream are also written, exactly as they came, to ``DIR/1/rank.<index>/stdout|stderr``
    (mpirun's layout). mpirun 4.1 still echoes output to the terminal with
    ``--output-filename``, and so does poprun.

    Raises:
        LaunchError: (125) when an output file cannot be made.
    """

    def __init__(self, plan: LaunchPlan, sink: OutputSink) -> None:
        self._sink = sink
        indices = [i.index for i in plan.instances]
        only = plan.output.only_from_instance
        self._shown = {i: only is None or only == i for i in indices}
        self._prefix = {(i, s): b"[1,%d]<%s>:" % (i, s.encode()) for i in indices for s in _STREAMS} \
            if plan.output.tag else {}
        self._pending: dict[tuple[int, Stream], bytes] = {}
        self._tails = {i: collections.deque[bytes](maxlen=TAIL_LINES) for i in indices}
        self._ready: dict[Stream, list[bytes | memoryview]] = {"stdout": [], "stderr": []}
        self._ready_bytes = 0
        self._files = _open_files(plan.output.output_filename, indices)

    def feed(self, index: int, stream: Stream, chunk: bytes) -> None:
        """Take ``chunk``, just read from ``stream`` of instance ``index``."""
        fd = self._files.get((index, stream))
        if fd is not None:
            _write_all(fd, chunk)
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

    def end(self, index: int, stream: Stream) -> None:
        """Take the end of ``stream`` of instance ``index``: a last line without newline gets one."""
        rest = self._pending.pop((index, stream), b"")
        if rest:
            self._lines(index, stream, rest + b"\n")
        fd = self._files.pop((index, stream), None)
        if fd is not None:
            os.close(fd)

    def _lines(self, index: int, stream: Stream, lines: bytes) -> None:
        """Keep the tail of ``lines`` (whole lines, ending in a newline) and queue them for the sink."""
        last = lines.rsplit(b"\n", TAIL_LINES + 1)  # the last item is the b"" after the last newline
        self._tails[index].extend(last[1:-1] if len(last) > TAIL_LINES + 1 else last[:-1])
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
        for fd in self._files.values():
            os.close(fd)
        self._files.clear()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _open_files(directory: str | None, indices: list[int]) -> dict[tuple[int, Stream], int]:
    """Return a file descriptor for each instance's stdout and stderr under ``directory`` (mpirun's layout)."""
    files: dict[tuple[int, Stream], int] = {}
    if directory is None:
        return files
    try:
        for index in indices:
            folder = Path(directory) / "1" / f"rank.{index}"
            folder.mkdir(parents=True, exist_ok=True)
            for stream in _STREAMS:
                files[index, stream] = os.open(folder / stream, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC,
                                               0o644)
    except OSError as exc:
        for fd in files.values():
            os.close(fd)
        raise LaunchError(f"cannot write output files under '{directory}': {exc.strerror}") from exc
    return files
