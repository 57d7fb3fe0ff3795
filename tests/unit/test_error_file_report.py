"""A report.json's failure ``error`` (torch's error file message) is shown as one bounded printable line, or not at all."""

from __future__ import annotations

import pytest

from poprun.render.outcome import render_failures
from poprun.runs.report import result_of


def _report(error: object) -> dict[str, object]:
    return {"v": 1, "run": "r", "status": 1, "statuses": [0, 1], "root_cause": 1,
            "failures": [{"index": 1, "host": "h2", "exit_code": 1, "error": error}]}


@pytest.mark.parametrize(("error", "shown"), [
    ("ValueError: boom", ["    error file: ValueError: boom"]),
    ("a\x1b[2J\nb\rc", ["    error file: a [2J b c"]),
    ("x" * 10_000, ["    error file: " + "x" * 500 + " ..."]),
    (["not", "text"], []),
    (None, []),
    ("", []),
])
def test_a_reports_error_is_one_printable_line(error: object, shown: list[str]) -> None:
    """Control characters become spaces, a long message is cut, anything but a string is ignored."""
    text = render_failures(result_of(_report(error)))

    assert shown == [line for line in text.splitlines() if "error file:" in line]
