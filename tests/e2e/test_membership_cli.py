"""
Declared membership through the real CLI in a subprocess: the classic form and its fallbacks, refused before anything runs.

A launch on this machine cannot replace a host (PR228); these tests check that the classic
command line and ``POPRUN_<FLAG>`` reach the planner, that nothing starts (no marker file, no
run record of a started instance) and that a plan with membership is written and read back.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


def poprun(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("POPDIST_", "MASTER_", "OMPI_", "POPRUN_"))}
    environ["POPRUN_RUNS_DIR"] = str(cwd / "runs")
    environ["HOME"] = str(cwd)
    return subprocess.run([sys.executable, "-m", "poprun.cli.main", *args], cwd=cwd, capture_output=True, text=True,
                          env={**environ, **(env or {})}, timeout=60, check=False)


MARK = ["python3", "-c", "open('started', 'w').close()"]


def test_the_classic_form_with_spares_on_this_machine_is_refused_before_anything_starts(tmp_path):
    """`poprun --spare-host h[9-10] --min-hosts 1 --health-check CMD PROGRAM` here: PR228, exit 2, nothing run."""
    done = poprun("--spare-host", "h[9-10]", "--min-hosts", "1", "--health-check", "touch checked", "--num-replicas",
                  "2", *MARK, cwd=tmp_path)

    assert 2 == done.returncode, done.stderr
    assert "error[PR228]: this backend cannot change hosts" in done.stderr
    assert "a re-plan would run on the same machine again" in done.stderr
    assert not (tmp_path / "started").exists()
    assert not (tmp_path / "checked").exists()


def test_a_spare_host_from_the_environment_is_refused_with_its_variable_named(tmp_path):
    """POPRUN_SPARE_HOST=pod9 on a local launch: PR228 points at the variable; nothing runs."""
    done = poprun(*MARK, cwd=tmp_path, env={"POPRUN_SPARE_HOST": "pod9"})

    assert 2 == done.returncode, done.stderr
    assert "error[PR228]" in done.stderr
    assert "environment variable POPRUN_SPARE_HOST" in done.stderr
    assert not (tmp_path / "started").exists()


def test_a_bad_spare_list_in_the_environment_is_pr103(tmp_path):
    """POPRUN_SPARE_HOST with a bad range: the host list's diagnostic, naming the variable."""
    done = poprun(*MARK, cwd=tmp_path, env={"POPRUN_SPARE_HOST": "pod[9-"})

    assert 2 == done.returncode
    assert "error[PR103]: invalid value in POPRUN_SPARE_HOST" in done.stderr


def test_a_saved_plan_with_membership_explains_and_diffs_the_same(tmp_path):
    """`plan -o` then `plan PLAN.json --explain`: the membership section is the same as from the command line."""
    spec = ["--host", "pod[1-4]", "--num-instances", "4", "--num-replicas", "8", "--spare-host", "pod[5-6]",
            "--min-hosts", "3", "--health-check", "test -e /dev/shm"]
    assert 0 == poprun("plan", "--format", "json", "-o", "plan.json", *spec, "python3", "train.py",
                       cwd=tmp_path).returncode

    saved = poprun("plan", "plan.json", "--explain", cwd=tmp_path)
    fresh = poprun("plan", "--explain", *spec, "python3", "train.py", cwd=tmp_path)
    diff = poprun("plan", "--diff", "plan.json", *spec, "python3", "train.py", cwd=tmp_path)

    assert 0 == saved.returncode, saved.stderr
    section = fresh.stdout[fresh.stdout.rindex("membership: "):].split("\n\n")[0]
    assert "3 hosts left  3 hosts, 3 instances, 6 replicas" in section
    assert section in saved.stdout
    assert (0, "no differences") == (diff.returncode, diff.stdout.splitlines()[-1])
    assert ["pod5", "pod6"] == json.loads((tmp_path / "plan.json").read_text())["membership"]["spares"]
