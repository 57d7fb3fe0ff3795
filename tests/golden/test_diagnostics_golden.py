"""
Every diagnostic code, triggered through the real CLI, with its exact rendered text.

Each folder under ``diagnostics/`` is one case, named by its code and a sentence; ``expected.txt``
is poprun's standard error followed by its exit status. ``POPRUN_UPDATE_GOLDEN=1`` rewrites them.
"""

import re
from pathlib import Path

import pytest

from poprun.core.diagnostic import CODES
from tests.golden.harness import assert_golden, case_dirs, run_cli

CASE_DIRS = case_dirs(Path(__file__).parent / "diagnostics")
# Codes that need real ssh hosts (or a live run) have their golden cases beside the tests that bring them up.
HOST_CASE_DIRS = [*case_dirs(Path(__file__).parents[1] / "e2e" / "hosts" / "golden"),
                  *case_dirs(Path(__file__).parents[1] / "e2e" / "hosts" / "golden_mpirun"),
                  *case_dirs(Path(__file__).parents[1] / "e2e" / "runs_golden"),
                  *case_dirs(Path(__file__).parents[1] / "e2e" / "ports_golden"),
                  *case_dirs(Path(__file__).parents[1] / "e2e" / "health_golden")]


def stderr_of(case: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    status, _, err = run_cli(case, monkeypatch)
    text = re.sub(r"\.\d{8}-\d{6}", ".<time stamp>", f"{err}exit {status}\n")
    # PR438: the compressed instances hold the run's random id, so their size varies by a few bytes
    return re.sub(r"instances take \d+ bytes", "instances take <N> bytes", text)


@pytest.mark.parametrize("case", CASE_DIRS, ids=[p.name for p in CASE_DIRS])
def test_diagnostic_text_matches_golden(case, monkeypatch):
    """The rendered diagnostic and exit status are exactly the golden text."""
    assert_golden(case, stderr_of(case, monkeypatch))


def test_every_code_has_a_golden_case_and_a_doc_page():
    """Each registered code is triggered by a golden case and documented in docs/errors/."""
    triggered = {p.name.split("_")[0] for p in (*CASE_DIRS, *HOST_CASE_DIRS)}
    docs = Path(__file__).parents[2] / "docs" / "errors"

    assert [] == sorted(set(CODES) - triggered)
    assert [] == sorted(c for c in CODES if not (docs / f"{c}.md").is_file())
    table = (docs / "README.md").read_text()
    assert [] == sorted(c for c in CODES if f"| [{c}]({c}.md) | {CODES[c]} |" not in table)  # the index's row


def test_each_case_triggers_the_code_it_is_named_for(monkeypatch):
    """A case named PRxxx shows a PRxxx diagnostic."""
    for case in CASE_DIRS:
        code = case.name.split("_")[0]
        with monkeypatch.context() as patched:  # one case's environment never leaks into the next
            text = stderr_of(case, patched)

        assert f"[{code}]" in text, case.name
