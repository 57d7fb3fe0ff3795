"""
Reading ``mpirun``'s output: which instance wrote each line, and which instance failed first.

Layer: ``poprun.backends``; the standard library only. The mpirun backend runs the command of
:mod:`poprun.backends.mpirun.command`, always with ``--tag-output``, and feeds what it reads from
mpirun's stdout and stderr pipes to one :class:`TagSplitter` each; :func:`parse_failure`
reads mpirun's own messages after a failure.

What OpenMPI 4.1 writes (``orte_iof_base_write_output``, checked against mpirun 4.1.4): each
read from an instance's pipe, up to 4 KiB, becomes one *frame*: the tag
``[<job>,<rank>]<stdout>:`` (``<stderr>``, ``<stddiag>``), the bytes read, and the tag again
after every newline but a last one. Reads do not stop at line ends, so a frame can end
mid-line and the next frame, of any instance, starts right there::

    [1,0]<stdout>:partial[1,1]<stdout>:out1
    [1,1]<stdout>:partial

A frame is never empty, so a tag directly after a tag is text the program wrote. mpirun's own
messages are untagged lines. Text that looks exactly like a tag after other text on a line
cannot be told from a frame boundary; it is taken for one. The job number of a tag is not
looked at (processes spawned by the program would share indices with the instances).

OpenMPI 4.1 loses output that nothing here can recover: it tags a frame into an 8 KiB buffer
and drops what does not fit, so a 4 KiB read of lines shorter than about 14 bytes loses its
end, sometimes in the middle of a tag (``mpirun --tag-output seq 2000`` prints 1347 lines).
The splitter then sees a line cut short, or a cut tag, which is text. That is why the mpirun
backend relays the instances' output itself (:mod:`poprun.backends.mpirun.mpirelay`); what still
comes here is mpirun's own messages and the output of an instance whose wrapper could not
reach poprun.
"""

from __future__ import annotations

import re

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from poprun.backends.base import Stream

    Piece = tuple[int | None, Stream, bytes]
    """An instance index (None: mpirun's own text), the stream it wrote to, and the bytes."""

MAX_LINE = 1 << 20  # an unfinished line longer than this is passed on in parts, as the Router does
_MAX_TAG = 40  # "[" + 10 digits + "," + 10 digits + "]<stddiag>:" is 35 bytes
_TAG = re.compile(rb"\[\d{1,10},(\d{1,10})\]<(stdout|stderr|stddiag)>:")
_TAG_ENDS = (b"<stdout>:", b"<stderr>:", b"<stddiag>:")
_STREAMS: dict[bytes, Stream] = {b"stdout": "stdout", b"stderr": "stderr", b"stddiag": "stderr"}
_MARK = b"]<std"  # in every tag: what a search for tags inside a line looks for


class TagSplitter:
    """
    Splits what mpirun writes to one pipe into the output of each instance, in whole lines.

    :meth:`feed` takes chunks as they are read and returns pieces ``(index, stream, data)``:
    ``index`` is the instance (the MPI rank: one app context per instance makes them equal)
    and ``stream`` the tag's (``<stddiag>`` counts as ``stderr``); untagged text, mpirun's
    own, comes as ``(None, <this pipe's stream>, data)``. ``data`` is one or more whole
    lines, tags removed and newlines kept. Consecutive lines of one instance come as one
    piece, so that a burst of output costs one item. An unfinished line waits, per instance,
    for its end, however the chunks and frames cut it; only a line longer than ``max_line``
    is passed on in parts without a newline. :meth:`end` returns what is left, each
    unfinished line as it is (without a newline).

    Speed: lines are not handled one by one. A run of one instance's lines is found with one
    regular-expression search (its first line not starting with the instance's tag), its
    tags are removed with one ``bytes.replace``, and Python looks only at the tags left inside
    lines (frame boundaries, one per 4 KiB or per write of the instance).
    """

    __slots__ = ("_carry", "_fresh", "_keys", "_max_line", "_pending", "_runs", "_tag")

    def __init__(self, stream: Stream, *, max_line: int = MAX_LINE) -> None:
        self._max_line = max_line
        self._tag: bytes | None = None  # tag of the frame being read (b"": untagged text); None at a line start
        self._fresh = False  # the frame has no byte yet: a tag here is text
        self._carry = b""  # the end of the last chunk, when it may be the start of a tag
        self._pending: dict[bytes, bytearray] = {}  # by tag: the start of an unfinished line
        self._keys: dict[bytes, tuple[int | None, Stream]] = {b"": (None, stream)}
        self._runs: dict[bytes, re.Pattern[bytes]] = {}

    def feed(self, chunk: bytes) -> list[Piece]:
        """Take ``chunk``, just read from the pipe; return the lines it completes."""
        data = self._carry + chunk if self._carry else chunk
        out: list[Piece] = []
        self._carry = data[self._read(data, _safe_end(data), out, final=False):]
        return out

    def end(self) -> list[Piece]:
        """Take the end of the pipe; return what is left: unfinished lines, without a newline."""
        out: list[Piece] = []
        carry, self._carry = self._carry, b""
        self._read(carry, len(carry), out, final=True)
        for tag, line in self._pending.items():
            out.append((*self._keys[tag], bytes(line)))
        self._pending.clear()
        self._tag = None
        return out

    def _read(self, data: bytes, end: int, out: list[Piece], *, final: bool) -> int:
        """
        Read ``data[:end]`` frame by frame; return where reading stopped.

        It stops early at a tag that would start a frame but has no text after it yet: whether
        the bytes after it are a tag or its text depends on it. At the ``final`` end such a
        tag is text (mpirun writes no empty frame).
        """
        pos = 0
        while pos < end:
            if self._tag is None:
                tag = self._tag_at(data, pos, end)
                if tag is not None and pos + len(tag) == end:
                    if not final:
                        return pos
                    tag = None
                self._tag = tag or b""
                self._fresh = tag is not None
                pos += len(self._tag)
            else:
                pos = self._frame(data, pos, end, out, final=final)
        return end

    def _frame(self, data: bytes, pos: int, end: int, out: list[Piece], *, final: bool) -> int:
        """Read the current frame's text from ``pos``: up to its first line not in its tag, or a new frame."""
        tag = self._tag
        assert tag is not None
        run = self._runs.get(tag)
        if run is None:
            run = self._runs[tag] = re.compile(b"\n(?!" + re.escape(tag) + b")") if tag else re.compile(b"\n")
        found = run.search(data, pos, end)
        stop = found.end() if found else end
        if found is None and tag and not final and end - len(tag) > pos \
                and data.startswith(b"\n" + tag, end - len(tag) - 1):
            stop = end - len(tag)  # the last line starts with the tag and has no text yet: stop before it
        region = data[pos:stop].replace(b"\n" + tag, b"\n") if tag else data[pos:stop]
        text, cut = self._cut(region, tag, final=final)
        self._add(tag, text, out)
        self._fresh = False
        if cut < 0:
            self._tag = None if data[stop - 1:stop] == b"\n" else tag
            return stop
        self._tag = None  # a new frame starts at the cut, mid-line
        return pos + cut + len(tag) * region.count(b"\n", 0, cut)

    def _cut(self, region: bytes, tag: bytes, *, final: bool) -> tuple[bytes, int]:
        """
        Return the frame's text in ``region`` and where another frame starts in it (-1: nowhere).

        ``region`` has lost the tags that start its lines; the tags left are inside lines. One
        directly after a tag (at the start of a fresh frame, after a newline, after a dropped
        tag) is text; the frame's own tag is dropped; any other tag starts a new frame. A tag
        with nothing after it ends the region: :meth:`_read` waits for what follows, or takes it
        for text at the ``final`` end.
        """
        parts: list[bytes] = []
        start = 0
        text_at = 0 if self._fresh else -1  # a tag starting here is text
        mark = region.find(_MARK)
        while mark >= 0:
            at = region.rfind(b"[", max(start, mark - 22), mark)
            found = self._tag_at(region, at, len(region)) if at >= 0 and at != text_at else None
            last = at + len(found) == len(region) if found else False
            if found is None or region[at - 1:at] == b"\n" or (last and final):
                mark = region.find(_MARK, mark + 1)
                continue
            parts.append(region[start:at])
            if found != tag or last:
                return b"".join(parts), at
            start = text_at = at + len(found)
            mark = region.find(_MARK, start)
        if not parts:
            return region, -1
        parts.append(region[start:])
        return b"".join(parts), -1

    def _add(self, tag: bytes, text: bytes, out: list[Piece]) -> None:
        """Add ``text`` to the output of ``tag``: whole lines go out, an unfinished one waits."""
        if not text:
            return
        cut = text.rfind(b"\n") + 1
        line = self._pending.get(tag)
        if cut:
            lines = text[:cut]
            if line is not None:
                lines = bytes(line + lines)
                del self._pending[tag]
                line = None
            out.append((*self._keys[tag], lines))
            if cut == len(text):
                return
            text = text[cut:]
        if line is None:
            line = self._pending[tag] = bytearray()
        line += text
        if len(line) > self._max_line:
            out.append((*self._keys[tag], bytes(line)))
            del self._pending[tag]

    def _tag_at(self, data: bytes, pos: int, end: int) -> bytes | None:
        """Return the tag that starts at ``pos`` (learning its instance and stream the first time), or None."""
        close = data.find(b">:", pos, min(pos + _MAX_TAG, end))
        if close < 0 or data[pos:pos + 1] != b"[":
            return None
        tag = data[pos:close + 2]
        if tag not in self._keys:
            found = _TAG.fullmatch(tag)
            if found is None:
                return None
            self._keys[tag] = (int(found[1]), _STREAMS[found[2]])
        return tag


def _safe_end(data: bytes) -> int:
    """Return where ``data`` may be read up to: before a tag at its end that is cut short or has no text yet."""
    at = data.rfind(b"[", max(0, len(data) - _MAX_TAG))
    return at if at >= 0 and _is_tag_start(data[at:]) else len(data)


def _is_tag_start(piece: bytes) -> bool:
    """Return whether ``piece`` (from a ``[`` to the end of the data) is a tag, or may become one."""
    head, bracket, tail = piece[1:].partition(b"]")
    job, comma, rank = head.partition(b",")
    if not all(part.isdigit() for part in (job, rank) if part):
        return False
    if not bracket:
        return bool(job or not comma)
    return bool(job and rank) and any(end.startswith(tail) for end in _TAG_ENDS)


_EXITED = re.compile(r"Process name:\s*\[\[\d+,\d+\],(\d+)\]\s*Exit code:\s*(-?\d+)")
_SIGNALLED = re.compile(r"process rank (\d+) with PID \d+ on node \S+ exited on signal (\d+)")


def parse_failure(text: str) -> tuple[int, int | None, int | None] | None:
    """
    Return ``(index, exit_code, signal)`` of the instance mpirun reports as the first to fail, or None.

    ``text`` is mpirun's untagged stderr. Exactly one of ``exit_code`` and ``signal`` is set.
    OpenMPI 4.1's two reports (``help-orterun.txt``: ``orterun:non-zero-exit`` and
    ``orterun:proc-aborted-strsignal``)::

        mpirun detected that one or more processes exited with non-zero status, thus causing
        the job to be terminated. The first process to do so was:

          Process name: [[45213,1],1]
          Exit code:    3

        mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed).

    The last number of the process name is the rank, which is the instance index. mpirun does
    not always print either: racing its own teardown, it sometimes prints only "Primary job
    terminated normally, but 1 process returned a non-zero exit code", and then this returns None.
    When both appear, the earlier one counts.
    """
    found = [m for m in (_EXITED.search(text), _SIGNALLED.search(text)) if m is not None]
    if not found:
        return None
    first = min(found, key=lambda m: m.start())
    index, number = int(first[1]), int(first[2])
    return (index, number, None) if first.re is _EXITED else (index, None, number)
