"""MPI detection on hostile input: the planner must never raise (a traceback) on what a spec or a saved plan holds."""

from __future__ import annotations

from pathlib import Path

import pytest

from poprun.planner.mpiuse import probe

PATH = {"PATH": "/usr/bin:/bin"}


@pytest.mark.parametrize("argv", [
    ("python3", "train\x00.py"),  # a TOML spec may write "train\u0000.py"
    ("pyth\x00on3", "train.py"),
    ("./ri\x00ng",),
])
def test_a_nul_in_the_program_or_its_script_is_no_traceback(tmp_path: Path, argv: tuple[str, ...]) -> None:
    """
    `[program] argv = ["python3", "train\\u0000.py"]` in a spec: os.open/os.access raise ValueError
    (embedded null byte), which _read/_find do not catch, so `poprun plan spec.toml` ends in
    "poprun: internal error: ValueError: embedded null byte".
    """
    assert probe(argv, str(tmp_path), PATH) is None
