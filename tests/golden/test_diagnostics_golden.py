"""
Every diagnostic code, triggered through the real CLI, with its exact rendered text.

Each folder under ``diagnostics/`` is one case, named by its code and a sentence: ``case.json``
holds the argv (and optional environment), spec files sit beside it, and ``expected.txt`` is
poprun's standard error followed by its exit status. ``POPRUN_UPDATE_GOLDEN=1`` rewrites them.
"""

import io
import json
import os
import re
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import attrs
import pytest

from poprun.cli import commands
from poprun.cli.main import main
from poprun.core.diagnostic import CODES
from poprun.planner.context import Context

CASES = Path(__file__).parent / "diagnostics"
CASE_DIRS = sorted(p for p in CASES.iterdir() if (p / "case.json").is_file())
FROM_PROCESS = Context.from_process
UPDATE = os.environ.get("POPRUN_UPDATE_GOLDEN") == "1"


def run_case(case: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    spec = json.loads((case / "case.json").read_text(encoding="utf-8"))
    for name in [n for n in os.environ if n.startswith(("POPRUN_", "IPUOF_", "POPLAR_", "POPTORCH_"))]:
        monkeypatch.delenv(name)
    for name, value in spec.get("env", {}).items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HOME", str(case))  # no vipu configuration of the machine running the tests
    monkeypatch.chdir(case)
    fixed = attrs.evolve(FROM_PROCESS(), cwd="/home/user/app", is_root=False,
                         local_names=("127.0.0.1", "::1", "localhost"))
    monkeypatch.setattr(commands.Context, "from_process", staticmethod(lambda: fixed))
    before = set(case.iterdir())
    out, err = io.StringIO(), io.StringIO()
    try:
        with redirect_stdout(out), redirect_stderr(err):
            status = main(spec["argv"])
    finally:
        for made in set(case.iterdir()) - before:  # files a case writes (--export-config)
            made.unlink()
    return re.sub(r"\.\d{8}-\d{6}", ".<time stamp>", f"{err.getvalue()}exit {status}\n")


@pytest.mark.parametrize("case", CASE_DIRS, ids=[p.name for p in CASE_DIRS])
def test_diagnostic_text_matches_golden(case, monkeypatch):
    """The rendered diagnostic and exit status are exactly the golden text."""
    actual = run_case(case, monkeypatch)
    expected_file = case / "expected.txt"
    if UPDATE:
        expected_file.write_text(actual, encoding="utf-8")
    expected = expected_file.read_text(encoding="utf-8") if expected_file.exists() else "(missing)"

    assert expected == actual, f"golden text differs; set POPRUN_UPDATE_GOLDEN=1 to update {expected_file}"


def test_every_code_has_a_golden_case_and_a_doc_page():
    """Each registered code is triggered by a golden case and documented in docs/errors/."""
    triggered = {p.name.split("_")[0] for p in CASE_DIRS}
    docs = Path(__file__).parents[2] / "docs" / "errors"

    assert [] == sorted(set(CODES) - triggered)
    assert [] == sorted(c for c in CODES if not (docs / f"{c}.md").is_file())


def test_each_case_triggers_the_code_it_is_named_for(monkeypatch):
    """A case named PRxxx shows a PRxxx diagnostic."""
    for case in CASE_DIRS:
        code = case.name.split("_")[0]

        assert f"[{code}]" in run_case(case, monkeypatch), case.name
