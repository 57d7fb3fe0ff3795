"""Adversarial unit checks, second battery: `via` in old and hostile run reports, the machine-id parsing."""

from __future__ import annotations

from poprun.backends.ssh.preflight import _greeting, _machine
from poprun.render.outcome import render_failures
from poprun.runs.report import result_of


def _report(failure: dict[str, object]) -> dict[str, object]:
    return {"v": 1, "run": "r", "status": 1, "statuses": [0, 1], "root_cause": 1, "failures": [failure]}


def test_an_old_report_without_via_still_renders_the_lost_host() -> None:
    """A report.json written before `via` existed: the lost host is named as before."""
    result = result_of(_report({"index": 1, "host": "h2", "lost": True, "exit_code": 255}))
    assert result.failures[0].via == ""
    assert "host h2 stopped answering" in render_failures(result)


def test_a_non_string_via_in_a_report_is_not_rendered_as_a_host() -> None:
    """
    A hand-edited or foreign report.json with "via": ["h1"] (not a string): `poprun report` names
    "host ['h1'], the relay it was reached through" - a Python repr shown as a host, instead of ignoring it.
    """
    result = result_of(_report({"index": 1, "host": "h2", "lost": True, "exit_code": 255, "via": ["h1"]}))
    assert "['h1']" not in render_failures(result)


def test_the_id_line_is_read_and_never_passed_on() -> None:
    """The check's id line names the machine and is cut from what reaches the instance's output."""
    answer = b"hello\npoprun-preflight id b00t net:[4026531840]\npoprun-preflight ok\n"
    assert _machine(answer) == "b00t net:[4026531840]"
    assert b"poprun-preflight" not in _greeting(answer)
    assert _machine(b"poprun-preflight id  \npoprun-preflight ok\n") == ""  # /proc unreadable: no claim


def test_the_checks_own_id_line_wins_over_a_greetings() -> None:
    """A login shell that prints a line holding the mark first (a shared ~/.bashrc): its text is the id of
    every host, so separate hosts are PR413 (see the e2e test of the same name)."""
    answer = b"poprun-preflight id shared home\npoprun-preflight id b00t net:[1]\npoprun-preflight ok\n"
    assert _machine(answer) == "b00t net:[1]"
