"""
Data-parallel training under the real CLI: 1, 2 and 4 replicas end with the same weights.

Each test launches ``examples/train_digits.py`` (or ``examples/torchrun_style.py``) through
``python -m poprun.cli.main`` in a subprocess and compares what the instances saved or printed:
1 and 2 replicas from the classic command line, 4 through ``poprun apply`` on the example's
spec, run unchanged in a copy of ``examples/`` (it saves ``train_digits.pt`` in its directory).
Each launch costs a few seconds, mostly importing PyTorch in every instance.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ports import free_port_pair

torch = pytest.importorskip("torch")
pytest.importorskip("sklearn")

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "examples" / "train_digits.py"
WEIGHT_TOLERANCE = 1e-5  # float32 sums in another order: about 2e-7 is seen
ACCURACY_THRESHOLD = 0.9  # on the 360 held-out digits; 0.93 after the example's 60 steps


def launch_env() -> dict[str, str]:
    """Return an environment outside any launch, this interpreter first on PATH, with free meeting ports."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("POPDIST_", "MASTER_", "OMPI_"))}
    environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{environ.get('PATH', '')}"
    environ["MASTER_PORT"] = str(free_port_pair())
    return environ


def poprun(*argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """Run ``poprun ARGV`` (the real CLI, in a subprocess) and return what it did."""
    return subprocess.run([sys.executable, "-m", "poprun.cli.main", *argv], cwd=cwd, env=launch_env(),
                          capture_output=True, text=True, timeout=150, check=False)


def summary(done: subprocess.CompletedProcess[str]) -> dict[str, object]:
    """Return the JSON line instance 0 of train_digits printed."""
    assert 0 == done.returncode, done.stderr
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert 1 == len(lines), done.stdout
    result: dict[str, object] = json.loads(lines[0])
    return result


def train(tmp: Path, replicas: int, *options: str) -> tuple[dict[str, torch.Tensor], dict[str, object]]:
    """Train with ``replicas`` replicas, one per instance; return the saved weights and the summary."""
    saved = tmp / f"weights-{replicas}.pt"
    done = poprun(f"--num-instances={replicas}", f"--num-replicas={replicas}", *options, sys.executable,
                  str(TRAIN), "--save", str(saved))
    return torch.load(saved), summary(done)


def apply_spec(tmp: Path) -> tuple[dict[str, torch.Tensor], dict[str, object]]:
    """Run ``poprun apply examples/train_digits.toml`` in a copy of the example; return its weights and summary."""
    (tmp / "examples").mkdir()
    for name in ("train_digits.py", "train_digits.toml"):
        shutil.copy(ROOT / "examples" / name, tmp / "examples" / name)
    done = poprun("apply", "examples/train_digits.toml", cwd=tmp)
    return torch.load(tmp / "train_digits.pt"), summary(done)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[dict[str, torch.Tensor], dict[str, object]]]:
    """Return the weights and summary of training with 1 and 2 replicas (command line) and 4 (the spec), offline."""
    tmp = tmp_path_factory.mktemp("training")
    return {1: train(tmp, 1, "--offline-mode=1"), 2: train(tmp, 2, "--offline-mode=1"),
            4: apply_spec(tmp_path_factory.mktemp("spec"))}


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Return the largest absolute difference between two state dicts' values."""
    assert a.keys() == b.keys()
    return max(float((a[name] - b[name]).abs().max()) for name in a)


def test_replicas_end_with_the_same_weights(runs) -> None:
    """1, 2 and 4 replicas at the same global batch reach the same weights after the same steps."""
    alone = runs[1][0]

    differences = {replicas: max_difference(alone, runs[replicas][0]) for replicas in (2, 4)}

    assert all(d <= WEIGHT_TOLERANCE for d in differences.values()), differences
    assert [("single", 1), ("gloo", 2), ("gloo", 4)] == [(runs[r][1]["collectives"], runs[r][1]["instances"])
                                                        for r in (1, 2, 4)]


def test_training_learns_the_digits(runs) -> None:
    """Every run classifies the held-out digits better than the threshold, and all agree on the score."""
    accuracies = {replicas: run[1]["accuracy"] for replicas, run in runs.items()}

    assert all(float(a) >= ACCURACY_THRESHOLD for a in accuracies.values()), accuracies  # type: ignore[arg-type]
    assert 1 == len(set(accuracies.values())), accuracies


@pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun is not on PATH")
def test_under_mpirun_the_collectives_go_through_mpi(runs, tmp_path) -> None:
    """Launched by the mpirun backend, popdist.init() picks MPI, and 2 replicas still match 1."""
    root = ["--allow-run-as-root=yes"] if os.geteuid() == 0 else []

    weights, result = train(tmp_path, 2, "--backend=mpirun", *root)

    assert "mpi" == result["collectives"]
    assert max_difference(runs[1][0], weights) <= WEIGHT_TOLERANCE


def test_a_torchrun_style_program_runs_unchanged() -> None:
    """A program that reads RANK, WORLD_SIZE, LOCAL_RANK and uses env:// runs under poprun as under torchrun."""
    done = poprun("--num-instances=2", "--num-replicas=2", "--offline-mode=1", sys.executable,
                  str(ROOT / "examples" / "torchrun_style.py"))

    assert 0 == done.returncode, done.stderr
    lines = sorted(line for line in done.stdout.splitlines() if line.startswith("rank "))
    assert [f"rank {i} of 2, local rank {i}, master localhost:" for i in range(2)] == [
        line.split(":")[0] + ":" for line in lines]
    assert all(line.endswith("sum of ranks 1") for line in lines)
