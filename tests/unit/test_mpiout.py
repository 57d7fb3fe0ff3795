"""
mpirun's output: tagged lines back to their instances, and the first failure from mpirun's messages.

The texts under ``tests/data/mpirun/`` were recorded from Debian's OpenMPI 4.1.4 ``mpirun``
(``--allow-run-as-root --oversubscribe``, 2 processes; mpirun's own PIDs and job ids as they came):

- ``exit-code.stderr``, ``exit-code-brief.stderr``: ``-np 2 sh -c 'exit $((OMPI_COMM_WORLD_RANK*3))'``;
  mpirun prints the "first process" report on some runs only (the brief one on others).
- ``signal.stderr``: rank 1 runs ``kill -KILL $$``.
- ``tagged-exit-code.stderr``: ``--tag-output``, each rank writes a line to stderr, rank 1 exits 3.
- ``partial-lines.stdout``/``.stderr``: ``--tag-output``, each rank writes ``out<rank>\\n`` to
  stdout, ``err<rank>\\n`` to stderr, then ``partial`` without a newline.
"""

import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from poprun.backends.mpirun.mpiout import TagSplitter, parse_failure

DATA = Path(__file__).parents[1] / "data" / "mpirun"


def recorded(name: str) -> bytes:
    return (DATA / name).read_bytes()


def split(data: bytes, *, stream: str = "stdout", sizes: tuple[int, ...] = (len(b"x"),)) -> list:
    """Feed ``data`` in chunks of the given sizes (cycling); return every piece, end() included."""
    splitter = TagSplitter(stream)
    pieces = []
    pos = 0
    for i in range(len(data)):
        if pos >= len(data):
            break
        size = sizes[i % len(sizes)]
        pieces += splitter.feed(data[pos:pos + size])
        pos += size
    return pieces + splitter.end()


def whole(data: bytes, *, stream: str = "stdout") -> list:
    """Feed ``data`` in one chunk; return every piece, end() included."""
    splitter = TagSplitter(stream)
    return splitter.feed(data) + splitter.end()


def by_instance(pieces: list) -> dict:
    """Return the bytes of each (instance, stream), in order."""
    found: dict = {}
    for index, stream, data in pieces:
        found[index, stream] = found.get((index, stream), b"") + data
    return found


def test_recorded_partial_lines_go_to_their_instances():
    """A frame that ends mid-line is followed by another instance's frame on the same line."""
    data = recorded("partial-lines.stdout")

    pieces = whole(data)

    assert b"[1,0]<stdout>:partial[1,1]<stdout>:out1\n" in data
    assert [(0, "stdout", b"out0\n"), (1, "stdout", b"out1\n"),
            (0, "stdout", b"partial"), (1, "stdout", b"partial")] == pieces


def test_recorded_stderr_tags_say_stderr():
    """On mpirun's stderr pipe, <stderr> tags give each instance's stderr lines."""
    assert [(0, "stderr", b"err0\n"), (1, "stderr", b"err1\n")] == whole(recorded("partial-lines.stderr"),
                                                                         stream="stderr")


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 13, 64])
def test_any_chunking_gives_the_same_lines(size):
    """Chunks cut mid-tag and mid-line give each instance the same bytes as one chunk."""
    data = recorded("partial-lines.stdout")

    assert by_instance(whole(data)) == by_instance(split(data, sizes=(size,)))


def test_a_tag_cut_between_chunks_waits_for_the_rest():
    """Half a tag gives nothing yet; the rest of it and the line give the line."""
    splitter = TagSplitter("stdout")

    assert [] == splitter.feed(b"[1,3]<std")
    assert [(3, "stdout", b"hello\n")] == splitter.feed(b"out>:hello\n")


def test_a_line_cut_between_chunks_waits_for_its_end():
    """The start of a line waits for its newline, even with another instance's lines in between."""
    splitter = TagSplitter("stdout")

    assert [] == splitter.feed(b"[1,0]<stdout>:hel")
    assert [(1, "stdout", b"other\n")] == splitter.feed(b"[1,1]<stdout>:other\n")
    assert [(0, "stdout", b"hello\n")] == splitter.feed(b"[1,0]<stdout>:lo\n")


def test_frames_of_one_instance_join_into_one_line():
    """mpirun reads 4 KiB at a time, so one line can come in several frames of the same instance."""
    assert [(0, "stdout", b"abcdef\n")] == whole(b"[1,0]<stdout>:abc[1,0]<stdout>:def\n")


def test_consecutive_lines_of_an_instance_come_as_one_piece():
    """A burst of one instance's lines is one piece, newlines kept, tags removed."""
    data = b"".join(b"[1,2]<stdout>:line %d\n" % i for i in range(1000))

    assert [(2, "stdout", b"".join(b"line %d\n" % i for i in range(1000)))] == whole(data)


def test_untagged_lines_are_mpiruns_own():
    """A line without a tag comes as (None, the pipe's stream, line)."""
    data = recorded("tagged-exit-code.stderr")

    pieces = whole(data, stream="stderr")

    assert [(0, "stderr", b"warning from 0\n"), (1, "stderr", b"warning from 1\n")] == pieces[:2]
    assert {None} == {index for index, _, _ in pieces[2:]}
    assert data.split(b"\n", 2)[2] == b"".join(line for _, _, line in pieces[2:])
    assert {"stderr"} == {stream for _, stream, _ in pieces}


def test_stddiag_counts_as_stderr():
    """OpenMPI's <stddiag> tag (its diagnostics from inside a process) is stderr."""
    assert [(4, "stderr", b"diag\n")] == whole(b"[1,4]<stddiag>:diag\n", stream="stderr")


def test_a_tag_directly_after_a_tag_is_text():
    """mpirun writes no empty frame, so a tag right after a tag (a nested launch's output) is text."""
    data = b"[1,0]<stdout>:[1,1]<stdout>:x\n[1,0]<stdout>:a\n[1,0]<stdout>:[1,0]<stdout>:b\n"

    assert [(0, "stdout", b"[1,1]<stdout>:x\na\n[1,0]<stdout>:b\n")] == whole(data)
    assert by_instance(whole(data)) == by_instance(split(data, sizes=(1, 4, 9)))


def test_text_that_only_looks_like_a_tag_is_text():
    """Brackets, a wrong stream name or letters for numbers are not tags."""
    data = b"[1,0]<stdout>:x[1,1]<stdin>:y [a,b]<stdout>: ]<std\n[warn] [1,\n"

    assert [(0, "stdout", b"x[1,1]<stdin>:y [a,b]<stdout>: ]<std\n"), (None, "stdout", b"[warn] [1,\n")] == whole(data)


def test_end_returns_unfinished_lines_as_they_are():
    """end() gives each unfinished line without adding a newline; a cut tag at the end is text."""
    splitter = TagSplitter("stdout")
    splitter.feed(b"[1,0]<stdout>:no newline\n[1,1]<stdout>:last")
    splitter.feed(b"[1,1]<stdout>:")

    assert [(1, "stdout", b"last[1,1]<stdout>:")] == splitter.end()
    assert [] == splitter.end()


def test_a_very_long_line_is_passed_on_in_parts():
    """A line longer than max_line does not wait whole: its parts come without a newline, then its end."""
    splitter = TagSplitter("stdout", max_line=10)

    first = splitter.feed(b"[1,0]<stdout>:" + b"x" * 8)
    second = splitter.feed(b"[1,0]<stdout>:" + b"x" * 8)
    last = splitter.feed(b"[1,0]<stdout>:end\n")

    assert ([], [(0, "stdout", b"x" * 16)], [(0, "stdout", b"end\n")]) == (first, second, last)


TAG = re.compile(rb"\[\d+,\d+\]<std(?:out|err|diag)>:")
tokens = st.sampled_from([b"a", b"b c", b"\n", b"[", b"]", b"<", b">", b":", b"1", b",", b"[1,0]", b"]<std",
                          b"]<stdout>:", b"[1,1]<stdout>:"])


def _mpirun_safe(text: bytes) -> bool:
    """Whether no tag-like text stands inside a line of ``text`` (where it is a frame boundary)."""
    return all(m.start() == 0 or text[m.start() - 1:m.start()] == b"\n" for m in TAG.finditer(text))


writes = st.tuples(st.integers(0, 3), st.sampled_from(["stdout", "stderr"]),
                   st.lists(tokens, min_size=1, max_size=12).map(b"".join).filter(_mpirun_safe))


def frame(index: int, stream: str, text: bytes) -> bytes:
    """Return ``text`` as OpenMPI 4.1 writes one read of it: tagged, and tagged again after each inner newline."""
    tag = b"[1,%d]<%s>:" % (index, stream.encode())
    return tag + text[:-1].replace(b"\n", b"\n" + tag) + text[-1:]


@given(st.lists(st.tuples(writes, st.booleans()), min_size=1, max_size=30),
       st.lists(st.integers(1, 80), min_size=1, max_size=10))
def test_tagged_output_chunked_anyhow_comes_back_exactly(frames, sizes):
    """
    Any interleaving of instances' writes, as mpirun frames them, read in any chunks, gives each instance its bytes.

    mpirun's own lines (untagged) may come wherever its output is at a line start. Every piece
    fed back before the end is whole lines.
    """
    # GIVEN
    written: dict = {}
    stream = bytearray()
    for (index, name, text), own_line in frames:
        written[index, name] = written.get((index, name), b"") + text
        stream += frame(index, name, text)
        if own_line and stream.endswith(b"\n"):
            written[None, "stdout"] = written.get((None, "stdout"), b"") + b"mpirun: a message\n"
            stream += b"mpirun: a message\n"
    data = bytes(stream)
    splitter = TagSplitter("stdout")

    # WHEN
    fed = []
    pos, turn = 0, 0
    while pos < len(data):
        fed += splitter.feed(data[pos:pos + sizes[turn % len(sizes)]])
        pos += sizes[turn % len(sizes)]
        turn += 1
    pieces = fed + splitter.end()

    # THEN
    assert written == by_instance(pieces)
    assert all(line.endswith(b"\n") for _, _, line in fed)


def test_failure_with_an_exit_code():
    """OpenMPI's non-zero-exit report names the first process to fail: rank 1, exit code 3."""
    assert (1, 3, None) == parse_failure(recorded("exit-code.stderr").decode())


def test_failure_by_a_signal():
    """'exited on signal 9 (Killed)' gives the signal, not an exit code."""
    assert (1, None, 9) == parse_failure(recorded("signal.stderr").decode())


def test_failure_without_mpiruns_report():
    """mpirun sometimes prints only 'Primary job terminated normally, but 1 process returned ...': no instance known."""
    assert parse_failure(recorded("exit-code-brief.stderr").decode()) is None
    assert parse_failure("") is None


def test_failure_read_from_tagged_stderr():
    """With --tag-output, mpirun's report is what the splitter gives as untagged text."""
    pieces = whole(recorded("tagged-exit-code.stderr"), stream="stderr")

    text = b"".join(line for index, _, line in pieces if index is None).decode()

    assert (1, 3, None) == parse_failure(text)


def test_the_earlier_report_counts():
    """When both reports appear, the one printed first is the first failure."""
    signal = recorded("signal.stderr").decode().replace("process rank 1", "process rank 0")
    exit_code = recorded("exit-code.stderr").decode()

    assert (0, None, 9) == parse_failure(signal + exit_code)
    assert (1, 3, None) == parse_failure(exit_code + signal)
