"""
``poprun plan`` output for the seed's launch modes, exactly: explain text, topology tables and JSON.

Each folder under ``plans/`` is a scenario named as a sentence: ``case.json`` holds the argv,
``expected.txt`` poprun's standard output (in a fixed context: working directory /home/user/app, not root).
``POPRUN_UPDATE_GOLDEN=1`` rewrites them.
"""

import io
import json
import os
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import attrs
import pytest

from poprun.cli import commands
from poprun.cli.main import main
from poprun.planner.context import Context

CASES = Path(__file__).parent / "plans"
CASE_DIRS = sorted(p for p in CASES.iterdir() if (p / "case.json").is_file())
FROM_PROCESS = Context.from_process
UPDATE = os.environ.get("POPRUN_UPDATE_GOLDEN") == "1"


def run_case(case: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    spec = json.loads((case / "case.json").read_text(encoding="utf-8"))
    for name in [n for n in os.environ if n.startswith(("POPRUN_", "IPUOF_", "POPLAR_", "POPTORCH_", "MASTER_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(case))
    monkeypatch.chdir(case)
    fixed = attrs.evolve(FROM_PROCESS(), cwd="/home/user/app", is_root=False,
                         local_names=("127.0.0.1", "::1", "localhost"))
    monkeypatch.setattr(commands.Context, "from_process", staticmethod(lambda: fixed))
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = main(spec["argv"])
    assert 0 == status, err.getvalue()
    return out.getvalue()


@pytest.mark.parametrize("case", CASE_DIRS, ids=[p.name for p in CASE_DIRS])
def test_plan_output_matches_golden(case, monkeypatch):
    """The plan's text or JSON is exactly the golden output."""
    actual = run_case(case, monkeypatch)
    expected_file = case / "expected.txt"
    if UPDATE:
        expected_file.write_text(actual, encoding="utf-8")
    expected = expected_file.read_text(encoding="utf-8") if expected_file.exists() else "(missing)"

    assert expected == actual, f"golden output differs; set POPRUN_UPDATE_GOLDEN=1 to update {expected_file}"
