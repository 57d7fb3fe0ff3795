"""Host-free adversarial checks of the CLI: an operator's odd environment or spec must never end in a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

PY = sys.executable


def poprun(*args: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "poprun.cli.main", *args], cwd=cwd, capture_output=True, text=True,
                          env=os.environ | env, timeout=30, check=False, stdin=subprocess.DEVNULL)


def test_a_tmpdir_that_does_not_exist_is_no_internal_error(tmp_path: Path) -> None:
    """
    TMPDIR names a directory that is gone (a finished Slurm job's, a typo): making the temporary
    executable cache raises FileNotFoundError and poprun says "internal error ... please report it"
    (exit 125) for every launch of several instances, local or ssh. Expected: the launch runs (in /tmp),
    or a diagnostic names TMPDIR.
    """
    done = poprun("--num-instances", "2", "--num-replicas", "2", "true", cwd=tmp_path,
                  env={"TMPDIR": str(tmp_path / "gone")})

    assert "internal error" not in done.stderr, done.stderr


def test_a_nul_in_a_spec_program_is_no_internal_error(tmp_path: Path) -> None:
    """`[program] argv = ["python3", "a\\u0000b.py"]`: `poprun plan` ends in "internal error: ValueError: embedded null byte"."""
    spec = tmp_path / "nul.toml"
    spec.write_text('[program]\nargv = ["python3", "a\\u0000b.py"]\n')
    done = poprun("plan", str(spec), "--num-instances", "2", "--num-replicas", "2", cwd=tmp_path, env={})

    assert "internal error" not in done.stderr, done.stderr


def test_a_nul_in_a_spec_value_is_no_internal_error(tmp_path: Path) -> None:
    """
    `[env] set = { NV = "a\\u0000b" }` is planned without a word; the local backend then ends in "internal
    error: ValueError: embedded null byte" (the ssh backend silently drops the NUL: the instance gets "ab").
    Expected: the spec is rejected with a diagnostic, as a bad variable name is.
    """
    spec = tmp_path / "nul.toml"
    spec.write_text('[env]\nset = { NV = "a\\u0000b" }\n')
    done = poprun("apply", str(spec), "--num-instances", "2", "--num-replicas", "2", "true", cwd=tmp_path, env={})

    assert "internal error" not in done.stderr, done.stderr
