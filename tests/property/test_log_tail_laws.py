"""Laws of a run record's logs as ``poprun logs --tail N`` reads them."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from poprun.runs.store import LogReader

PIECES = st.lists(st.tuples(st.integers(0, 2), st.sampled_from(["stdout", "stderr"]),
                            st.binary(min_size=1, max_size=40).map(lambda b: b.replace(b"\r", b"\n"))), max_size=30)


def naive_last_lines(pieces: list[tuple[int, str, bytes]], count: int) -> list[tuple[int, str, bytes]]:
    """Every whole line of each (instance, stream), in the order its newline arrived; the last ``count``."""
    open_lines: dict[tuple[int, str], bytes] = {}
    lines: list[tuple[int, str, bytes]] = []
    for index, stream, data in pieces:
        text = open_lines.pop((index, stream), b"") + data
        *whole, rest = text.split(b"\n")
        lines += [(index, stream, line + b"\n") for line in whole]
        if rest:
            open_lines[index, stream] = rest
    return lines[-count:] if count else []


@given(pieces=PIECES, count=st.integers(0, 6))
def test_the_tail_is_the_last_whole_lines_in_arrival_order(pieces: list[tuple[int, str, bytes]], count: int) -> None:
    """last_lines(N) is the last N whole lines, each as written, however the record's pieces cut them."""
    with tempfile.TemporaryDirectory() as folder:
        logs = Path(folder, "logs")
        logs.mkdir()
        for index, stream, data in pieces:
            with (logs / f"{index}.{stream}").open("ab") as log:
                log.write(data)
        (logs / "order").write_bytes(b"".join(b"%d %s %d\n" % (i, s.encode(), len(d)) for i, s, d in pieces))
        reader = LogReader(folder)
        try:
            assert naive_last_lines(pieces, count) == reader.last_lines(count)
        finally:
            reader.close()
