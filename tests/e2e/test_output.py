"""Output forwarding: whole lines, tags, one instance's output, per-instance files; the router in process."""

from __future__ import annotations

import collections
import re
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

from poprun.backends.base import InstanceSink, Stream
from poprun.backends.conformance import MemorySink
from poprun.process import output
from poprun.process.output import TAIL_LINES, Router
from tests.e2e.helpers import plan_of

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

PY = sys.executable
INDEX = "int(os.environ['POPDIST_INSTANCE_INDEX'])"
# Each instance writes 100,000 numbered lines of varying length through Python's buffered
# streams (so lines are cut across writes), every tenth to stderr.
MANY_LINES = (f"import os, sys; i = {INDEX}\n"
              "for n in range(100_000):\n"
              "    (sys.stderr if n % 10 == 0 else sys.stdout).write(f'{i}:{n}:' + 'x' * (n % 97) + '\\n')\n")


def poprun(*args: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    """Run the real CLI in a subprocess; return what it did, as bytes."""
    return subprocess.run([PY, "-m", "poprun.cli.main", *args], cwd=cwd, capture_output=True, timeout=60,
                          check=False)




def test_4_instances_x_100000_tagged_lines_each_arrive_once_whole_and_tagged(tmp_path: Path) -> None:
    """Every line of 4 x 100,000 arrives exactly once, whole, on its stream, tagged with its instance."""
    # GIVEN
    expected: dict[Stream, set[bytes]] = {"stdout": set(), "stderr": set()}
    for i in range(4):
        for n in range(100_000):
            stream: Stream = "stderr" if n % 10 == 0 else "stdout"
            expected[stream].add(b"[1,%d]<%s>:%d:%d:%s" % (i, stream.encode(), i, n, b"x" * (n % 97)))

    # WHEN
    done = poprun("--num-instances", "4", "--num-replicas", "4", "--mpi-global-args=--tag-output",
                  PY, "-c", MANY_LINES, cwd=tmp_path)
    seen = {"stdout": collections.Counter(done.stdout.split(b"\n")), "stderr": collections.Counter(done.stderr.split(b"\n"))}

    # THEN
    assert 0 == done.returncode
    assert [{b""}, {b""}] == [set(seen[s]) - expected[s] for s in ("stdout", "stderr")]  # b"": after the last newline
    assert [set(), set()] == [expected[s] - set(seen[s]) for s in ("stdout", "stderr")]
    assert [{1}, {1}] == [set(seen[s].values()) for s in ("stdout", "stderr")]


def test_only_output_from_instance_still_reports_the_others_failures(tmp_path: Path) -> None:
    """--only-output-from-instance 0 hides instance 2's lines, but its failure report shows their tail."""
    script = (f"import os, sys, time; i = {INDEX}; print('line', i, flush=True); "
              "i == 2 and time.sleep(0.3); sys.exit(5 if i == 2 else 0)")  # the others have printed by then
    done = poprun("--num-instances", "3", "--num-replicas", "3", "--only-output-from-instance", "0",
                  PY, "-c", script, cwd=tmp_path)
    report = re.sub(rb" \(PID \d+\)", b"", done.stderr)

    assert (5, b"line 0\n") == (done.returncode, done.stdout)
    assert b"  instance 2 on localhost: exited with status 5\n    | line 2\n" in report


def test_output_files_hold_exactly_what_each_instance_wrote(tmp_path: Path) -> None:
    """DIR/1/rank.N/stdout keeps the bytes as written (no newline added); the terminal gets whole lines."""
    script = f"import os, sys; i = {INDEX}; sys.stdout.write(f'first {{i}}\\nlast {{i}}')"
    done = poprun("--num-instances", "2", "--num-replicas", "2", "--mpi-global-args=--output-filename out",
                  PY, "-c", script, cwd=tmp_path)

    assert [b"first 0\nlast 0", b"first 1\nlast 1"] == [(tmp_path / f"out/1/rank.{i}/stdout").read_bytes()
                                                        for i in range(2)]
    assert {b"first 0", b"last 0", b"first 1", b"last 1"} == set(done.stdout.splitlines())
    assert 4 == done.stdout.count(b"\n")


@given(lines=st.lists(st.tuples(st.integers(0, 1), st.binary(max_size=30).map(lambda b: b.replace(b"\n", b""))),
                      max_size=60),
       cuts=st.lists(st.integers(1, 40), min_size=1, max_size=10))
def test_router_passes_on_whole_tagged_lines_however_the_chunks_are_cut(lines: list[tuple[int, bytes]],
                                                                          cuts: list[int]) -> None:
    """Lines of two instances, fed in chunks cut anywhere, come out whole, tagged, in order per instance."""
    # GIVEN
    sink = MemorySink()
    router = Router(plan_of("--num-instances", "2", "--num-replicas", "2", "--mpi-global-args=--tag-output",
                            "true"), sink)
    streams = {i: b"".join(line + b"\n" for j, line in lines if j == i) for i in range(2)}

    # WHEN
    for index, data in streams.items():
        offset, k = 0, 0
        while offset < len(data):
            router.feed(index, "stdout", data[offset:offset + cuts[k % len(cuts)]])
            offset, k = offset + cuts[k % len(cuts)], k + 1
            router.flush()
        router.end(index, "stdout")
    router.close()

    # THEN
    out = sink.data("stdout").split(b"\n")[:-1]
    assert [b"[1,%d]<stdout>:%s" % (i, line) for i, line in lines if i == 0] == [x for x in out if x[3] == ord("0")]
    assert [b"[1,%d]<stdout>:%s" % (i, line) for i, line in lines if i == 1] == [x for x in out if x[3] == ord("1")]
    assert [line.decode(errors="replace") for i, line in lines if i == 1][-TAIL_LINES:] == list(router.tail(1))


def test_router_gives_a_last_line_without_newline_one_and_keeps_tails_of_hidden_instances() -> None:
    """A final partial line is passed on with a newline; a hidden instance's lines are only in its tail."""
    sink = MemorySink()
    router = Router(plan_of("--num-instances", "2", "--num-replicas", "2", "--only-output-from-instance", "1",
                            "true"), sink)

    router.feed(0, "stderr", b"hidden\nalso hidden")
    router.feed(1, "stderr", b"shown\nand the end")
    router.close()

    assert (b"shown\nand the end\n", ("hidden", "also hidden")) == (sink.data("stderr"), router.tail(0))


class _RecordingSink(MemorySink, InstanceSink):
    """A sink that also keeps each instance's pieces, as the run record does."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: dict[tuple[int, str], bytes] = collections.defaultdict(bytes)

    def instance_lines(self, index: int, stream: Stream, data: bytes) -> None:
        self.kept[index, stream] += data


@given(lines=st.lists(st.tuples(st.integers(0, 2), st.binary(max_size=60).map(lambda b: b.replace(b"\n", b""))),
                      max_size=40),
       order=st.lists(st.tuples(st.integers(0, 2), st.integers(1, 25)), min_size=1, max_size=30))
def test_long_lines_of_three_instances_fed_anyhow_come_out_whole_tagged_and_exact_in_the_record(
        lines: list[tuple[int, bytes]], order: list[tuple[int, int]]) -> None:
    """Lines longer than STREAM_AT pass as they come, yet every line reaches the sink whole, tagged once; the record is exact."""
    # GIVEN: lines over 8 bytes are "long"; chunks of the instances come interleaved anyhow
    sink = _RecordingSink()
    streams = {i: b"".join(line + b"\n" for j, line in lines if j == i) for i in range(3)}
    with mock.patch.object(output, "STREAM_AT", 8):
        router = Router(plan_of("--num-instances", "3", "--num-replicas", "3", "--mpi-global-args=--tag-output",
                                "true"), sink)

        # WHEN
        offsets, k = dict.fromkeys(range(3), 0), 0
        while any(offsets[i] < len(streams[i]) for i in range(3)):
            index, size = order[k % len(order)]
            k += 1
            if offsets[index] >= len(streams[index]):
                index = next(i for i in range(3) if offsets[i] < len(streams[i]))
            router.feed(index, "stdout", streams[index][offsets[index]:offsets[index] + size])
            offsets[index] += size
            if k % 3 == 0:
                router.flush()
        router.close()

    # THEN
    out = sink.data("stdout").split(b"\n")
    assert b"" == out.pop()
    for i in range(3):
        assert [b"[1,%d]<stdout>:%s" % (i, line) for j, line in lines if j == i] == \
            [x for x in out if x.startswith(b"[1,%d]" % i)]
    assert len(out) == len(lines)
    assert {i: streams[i] for i in range(3) if streams[i]} == {i: d for (i, _), d in sink.kept.items()}


def test_a_long_line_is_cut_on_the_terminal_only_when_too_much_other_output_waits_and_says_so() -> None:
    """Past HOLD_MAX of others' output waiting, the long line is ended on the terminal with a warning; the record keeps it whole."""
    sink = _RecordingSink()
    with mock.patch.object(output, "STREAM_AT", 8), mock.patch.object(output, "HOLD_MAX", 100):
        router = Router(plan_of("--num-instances", "2", "--num-replicas", "2", "true"), sink)
        router.feed(0, "stdout", b"a" * 20)  # long: passes, and instance 1 waits
        for _ in range(30):
            router.feed(1, "stdout", b"one line\n")
        router.feed(0, "stdout", b"b" * 5 + b"\nend\n")
        router.close()

    out = sink.data("stdout")
    assert out.startswith(b"a" * 20 + b"\none line\n")
    assert b"a" * 20 + b"b" * 5 + b"\nend\n" == sink.kept[0, "stdout"]
    assert 30 * b"one line\n" == sink.kept[1, "stdout"]
    assert sorted([b"a" * 20, b"b" * 5, b"end", *[b"one line"] * 30, b""]) == sorted(out.split(b"\n"))
    assert [(b"poprun: warning: instance 0's stdout line was cut on the terminal after 20 bytes, to let the other "
             b"instances' output through (it waits behind a long line for 5 s or 100 bytes at most); its rest follows "
             b"on lines of its own (the run record and output files keep it whole)\n")] == \
        [d for s, d in sink.written if s == "stderr"]


def test_the_tail_keeps_a_long_line_cut_and_says_how_long_it_was() -> None:
    """A failure report's tail holds at most TAIL_LINE bytes of a line, and its length."""
    router = Router(plan_of("true"), MemorySink())

    router.feed(0, "stderr", b"x" * (3 << 20))
    router.feed(0, "stderr", b"y\nshort\n")
    router.close()

    assert ("x" * output.TAIL_LINE + f" [... a line of {(3 << 20) + 1} bytes]", "short") == router.tail(0)


def test_a_progress_bar_that_never_ends_its_line_holds_the_others_back_for_hold_s_at_most() -> None:
    """A long line of carriage returns (a progress bar) is cut on the terminal once others' output waited HOLD_S; told once."""
    sink = _RecordingSink()
    with mock.patch.object(output, "STREAM_AT", 8), mock.patch.object(output, "HOLD_S", 0.0):
        router = Router(plan_of("--num-instances", "2", "--num-replicas", "2", "true"), sink)
        router.feed(0, "stdout", b"\r10%" * 5)  # long: it passes, and owns stdout
        router.feed(1, "stdout", b"first\n")  # waited long enough (0 s): the bar is cut, the line passes
        router.feed(0, "stdout", b"\r50%" * 5)
        router.feed(1, "stdout", b"second\n")
        router.feed(0, "stdout", b"\r100%\n")
        router.close()

    assert b"\r10%" * 5 + b"\nfirst\n" + b"\r50%" * 5 + b"\nsecond\n\r100%\n" == sink.data("stdout")
    assert b"\r10%" * 5 + b"\r50%" * 5 + b"\r100%\n" == sink.kept[0, "stdout"]
    assert 1 == len([d for s, d in sink.written if s == "stderr"])
