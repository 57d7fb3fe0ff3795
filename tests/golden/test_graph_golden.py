"""
``poprun render`` and ``poprun plan --format dot``: the DOT of the seed's launch modes, exactly.

Each folder under ``graphs/`` is a scenario named as a sentence; ``expected.txt`` is poprun's
standard output (the DOT text). ``POPRUN_UPDATE_GOLDEN=1`` rewrites them.
"""

from pathlib import Path

import pytest

from tests.golden.harness import assert_golden, case_dirs, run_cli

CASE_DIRS = case_dirs(Path(__file__).parent / "graphs")


@pytest.mark.parametrize("case", CASE_DIRS, ids=[p.name for p in CASE_DIRS])
def test_dot_matches_golden(case, monkeypatch):
    """The graph's DOT text is exactly the golden output, and nothing is written to standard error."""
    status, out, err = run_cli(case, monkeypatch)

    assert (0, "") == (status, err)
    assert_golden(case, out)
