"""
``poprun plan --diff OLD.json``: what a change of the command line changes in the plan, exactly.

Each folder under ``diffs/`` is a scenario named as a sentence. Its ``case.json`` holds
``old_argv``, the command line whose plan (``--format json``) is saved as ``old.json``, and
``argv``, the command line compared with it (``old_env`` and ``env``: settings each is planned with, when
a case needs them). ``expected.txt`` is poprun's standard output
then its exit status (0, with or without differences). ``POPRUN_UPDATE_GOLDEN=1`` rewrites them.
"""

import json
from pathlib import Path

import pytest

from tests.golden.harness import assert_golden, case_dirs, run_cli

CASE_DIRS = case_dirs(Path(__file__).parent / "diffs")


def run_argv(folder: Path, argv: list[str], monkeypatch: pytest.MonkeyPatch,
             env: dict[str, str] | None = None) -> tuple[int, str, str]:
    """Run ``argv`` through the golden harness in ``folder``, with ``env`` set."""
    # no V-IPU probe while planning: these cases are about the diff (the probe has its own, PR502)
    (folder / "case.json").write_text(json.dumps({"argv": argv, "env": {"POPRUN_PARTITION_PROVIDER": "none",
                                                                        **(env or {})}}), encoding="utf-8")
    with monkeypatch.context() as patch:
        return run_cli(folder, patch)


@pytest.mark.parametrize("case", CASE_DIRS, ids=[p.name for p in CASE_DIRS])
def test_diff_matches_golden(case, monkeypatch, tmp_path):
    """The old plan is made in the same context, then the diff's text or JSON is exactly the golden output."""
    # GIVEN
    spec = json.loads((case / "case.json").read_text(encoding="utf-8"))
    status, old, err = run_argv(tmp_path, spec["old_argv"], monkeypatch, spec.get("old_env"))
    assert 0 == status, err
    (tmp_path / "old.json").write_text(old, encoding="utf-8")

    # WHEN
    status, out, err = run_argv(tmp_path, spec["argv"], monkeypatch, spec.get("env"))

    # THEN
    assert "" == err
    assert_golden(case, f"{out}exit {status}\n")
