"""PR500's advice works: following the hint turns the failing launch into one that runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]


def poprun(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """Run the classic CLI against an emulated V-IPU server that holds no partition."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("IPUOF_", "POPRUN_"))}
    env |= {"POPRUN_NO_PLUGINS": "1", "POPRUN_PARTITION_PROVIDER": "emulated",
            "POPRUN_VIPU_EMULATOR_INVENTORY": str(cwd / "pod.json"), "HOME": str(cwd)}
    return subprocess.run([sys.executable, "-m", "poprun.cli.main", *args, "--num-replicas", "16", "true"], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=30, check=False)


def test_unnamed_partition_hint_leads_to_a_launch(tmp_path: Path) -> None:
    """No partition named and none on the server: PR500 says to name one; named, --update-partition=yes runs."""
    (tmp_path / "pod.json").write_text(json.dumps({"ipus": 64, "ild_size": 16, "partitions": []}))

    failed = poprun("--update-partition=yes", cwd=tmp_path)
    followed = poprun("--vipu-partition", "p16", "--update-partition=yes", cwd=tmp_path)

    assert (125, 0) == (failed.returncode, followed.returncode), followed.stderr
    assert "[PR500]" in failed.stderr
    assert "--vipu-partition NAME; with --update-partition=yes poprun creates it" in failed.stderr
