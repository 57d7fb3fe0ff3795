"""Every variable real torchrun gives its workers, poprun gives its instances too, with torchrun's values where they do not depend on the launch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ports import free_port_pair

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PY = sys.executable
PRINT = """
import json, os
base = set(json.loads(os.environ["BASE_NAMES"]))
with open(os.path.join(os.environ["OUT"], os.environ["RANK"] + ".json"), "w") as out:  # not stdout: workers share it
    json.dump({k: v for k, v in os.environ.items() if k not in base and k != "_"}, out)
"""
# Values that differ on purpose: the run's id and error file are poprun's own, torchrun's store is its agent's,
# and OMP_NUM_THREADS is the plan's share of the CPUs (torchrun's is 1 for several processes on a node).
OWN = ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE", "TORCHELASTIC_USE_AGENT_STORE", "MASTER_PORT",
       "OMP_NUM_THREADS")


def environments(command: list[str], tmp_path: Path) -> list[dict[str, str]]:
    """Run ``command`` on the probe program; return each worker's new variables, by RANK."""
    out = tmp_path / command[2]  # torch.distributed.run or poprun.cli.main
    out.mkdir()
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("POPDIST_", "MASTER_", "POPRUN_", "TORCH", "OMP_", "MKL_", "PET_"))}
    env |= {"BASE_NAMES": json.dumps([*env, "BASE_NAMES", "OUT"]), "MASTER_PORT": str(free_port_pair()),
            "POPRUN_RUNS_DIR": str(tmp_path / "runs"), "OUT": str(out)}
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=100, check=False)
    assert 0 == done.returncode, done.stderr
    found = [json.loads(path.read_text()) for path in out.glob("*.json")]
    return sorted(found, key=lambda e: int(e["RANK"]))


def test_poprun_gives_every_variable_torchrun_gives(tmp_path: Path) -> None:
    """torchrun --nproc-per-node=2 against poprun --num-instances=2: torchrun's names are a subset, its values equal."""
    pytest.importorskip("torch")
    (tmp_path / "print.py").write_text(PRINT)

    theirs = environments([PY, "-m", "torch.distributed.run", "--nproc-per-node=2", "print.py"], tmp_path)
    ours = environments([PY, "-m", "poprun.cli.main", "--num-instances=2", "--num-replicas=2", PY, "print.py"],
                        tmp_path)

    assert [] == sorted(set(theirs[0]) - set(ours[0]))
    assert [{k: v for k, v in t.items() if k not in OWN} for t in theirs] == [
        {k: o[k] for k in t if k not in OWN} for t, o in zip(theirs, ours, strict=True)]
    assert ["False", "False"] == [o["TORCHELASTIC_USE_AGENT_STORE"] for o in ours]  # instance 0's torch holds the store
