"""Output forwarding: whole lines, tags, one instance's output, per-instance files; the router in process."""

from __future__ import annotations

import collections
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from poprun.backends._process.output import TAIL_LINES, Router
from poprun.backends.base import Stream
from poprun.backends.conformance import MemorySink
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
