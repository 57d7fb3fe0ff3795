"""
``poprun plan`` output for the seed's launch modes, exactly: explain text, topology tables and JSON.

Each folder under ``plans/`` is a scenario named as a sentence; ``expected.txt`` is poprun's
standard output. ``POPRUN_UPDATE_GOLDEN=1`` rewrites them.
"""

from pathlib import Path

import pytest

from tests.golden.harness import assert_golden, case_dirs, run_cli

CASE_DIRS = case_dirs(Path(__file__).parent / "plans")


@pytest.mark.parametrize("case", CASE_DIRS, ids=[p.name for p in CASE_DIRS])
def test_plan_output_matches_golden(case, monkeypatch):
    """The plan's text or JSON is exactly the golden output."""
    status, out, err = run_cli(case, monkeypatch)

    assert 0 == status, err
    assert_golden(case, out)
