"""``poprun plan --format sbatch``: the batch script ``poprun submit`` would submit, without submitting it."""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from poprun.cli.main import main


def test_plan_shows_the_batch_script_of_the_launch_without_plan_options(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Nodes and tasks per node from the plan; the script runs the launch itself, not 'plan --format sbatch -o'."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SLURM_JOB_ID", "99")  # planning inside an allocation still shows the script for outside
    out_file = tmp_path / "job.sh"
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()) as err:
        status = main(["plan", "--format", "sbatch", "--host", "h[1-3]", "--num-instances", "6", "--num-replicas",
                       "6", "-o", str(out_file), "python3", "train.py"])
    script = out_file.read_text()

    assert (0, "") == (status, err.getvalue())
    assert "#SBATCH --nodes=3\n#SBATCH --ntasks-per-node=2\n" in script
    last = script.rstrip().splitlines()[-1]
    assert last.endswith("-m poprun.cli.main --host 'h[1-3]' --num-instances 6 --num-replicas 6 python3 train.py")
    assert "--format" not in last
    assert " -o " not in last
