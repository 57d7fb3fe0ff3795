"""bench/gpu_check.py where no GPU is: it says so and exits 0; its reading of nvidia-smi topo -m, on a recorded output."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from poprun.planner.machine import sysfs_devices

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data" / "devices"


def gpu_check():
    """Import bench/gpu_check.py as a module."""
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_numa_affinity_column_of_a_recorded_topo_m() -> None:
    """GPU rows give their NUMA Affinity cell; the NIC row and the legend are not GPUs."""
    text = (DATA / "nvidia-smi-topo-m-hgx-h100.txt").read_text()

    assert {0: "0", 1: "0", 4: "1"} == gpu_check().parse_topo(text)
    assert {} == gpu_check().parse_topo("NVIDIA-SMI has failed because it couldn't communicate with the driver\n")


@pytest.mark.skipif(any(d.vendor == "nvidia" for d in sysfs_devices("/")), reason="a GPU is here: the checks run")
def test_without_a_gpu_it_says_so_and_exits_0() -> None:
    """No NVIDIA GPU in sysfs, no nvidia-smi: one line, status 0."""
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_check.py")], capture_output=True, text=True,
                          timeout=120, check=False)

    assert (0, "gpu_check: no NVIDIA GPU here") == (done.returncode, done.stdout[:29])
