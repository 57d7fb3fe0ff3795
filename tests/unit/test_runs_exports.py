"""The names of the run-records library: pinned, loaded on first use, and not loaded by a launch's record."""

from __future__ import annotations

import subprocess
import sys

import poprun.runs
from poprun.runs import api

EXPORTED = ["Piece", "Run", "RunReport", "RunStateError", "StopResult", "attach", "check_attempt", "check_instance",
            "ended_with", "follow", "info", "list_runs", "locate", "read_report", "report_json", "require_running",
            "stop"]


def test_the_library_exports_exactly_its_names_each_the_api_modules() -> None:
    """``poprun.runs.__all__`` is pinned; each name is the one of ``poprun.runs.api``."""
    assert EXPORTED == poprun.runs.__all__
    assert all(getattr(poprun.runs, name) is getattr(api, name) for name in EXPORTED)


def test_writing_a_record_does_not_load_the_library() -> None:
    """Importing ``poprun.runs.record`` (every launch does) leaves ``poprun.runs.api`` unloaded."""
    code = "import sys, poprun.runs.record; print('poprun.runs.api' in sys.modules)"

    assert "False\n" == subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
