"""
The examples report their steps: run as one process with POPRUN_PROGRESS naming a real receiver.

``examples/train_digits.py`` and ``examples/torchrun_style.py`` run as they do alone (one
instance, no launcher), popdist sending to a UDP socket of the test; every datagram is read by
the strict parser of ``tests/unit/test_popdist_progress.py``. Under poprun the launcher sets the
variables itself (its own tests); here the examples' side of it is checked.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.ports import free_port_pair
from tests.unit.test_popdist_progress import TOKEN, Receiver, strict_parse

pytest.importorskip("torch")
pytest.importorskip("sklearn")

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[2]


def run_example(receiver: Receiver, *argv: str, **variables: str) -> subprocess.CompletedProcess[str]:
    """Run an example alone, popdist sending to ``receiver``."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("POPRUN_", "POPDIST_", "OMPI_", "MASTER_"))}
    environ |= {"POPRUN_PROGRESS": f"127.0.0.1:{receiver.port}", "POPRUN_PROGRESS_TOKEN": TOKEN, **variables}
    return subprocess.run([sys.executable, *argv], env=environ, capture_output=True, text=True, timeout=150,
                          check=False, cwd=ROOT)


@pytest.fixture
def receiver():
    """A real UDP receiver on loopback."""
    opened = Receiver()
    yield opened
    opened.close()


def test_the_training_example_reports_every_step_to_the_last_with_its_loss(receiver):
    """train_digits.py --steps 12: datagrams from step 0 to 12 of 12, the loss a finite number, nothing of the loader's count."""
    done = run_example(receiver, "examples/train_digits.py", "--steps", "12")

    assert 0 == done.returncode, done.stderr
    got = [strict_parse(raw) for raw in receiver.raw(200, within_s=5)]
    progress = [d for d in got if d["k"] == "p"]
    assert (0, 12, None) == (progress[0]["s"], progress[0]["n"], progress[0].get("m"))  # before the first step
    assert all(d["n"] == 12 for d in progress)  # the loader's own count (22 batches an epoch) never shows: it beats
    assert (12, 12) == (progress[-1]["s"], progress[-1]["n"])
    assert math.isfinite(progress[-1]["m"]["loss"])  # type: ignore[index]
    assert all(d["i"] == 0 and d["a"] == 0 for d in got)
    assert 12 <= sum(d["c"] for d in got)


def test_the_torchrun_style_example_reports_its_rounds(receiver):
    """torchrun_style.py as rank 0 of 1: its three rounds of all_reduce are steps 1..3 of 3 (popdist is installed here)."""
    done = run_example(receiver, "examples/torchrun_style.py", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0",
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port_pair()))

    assert 0 == done.returncode, done.stderr
    got = [strict_parse(raw) for raw in receiver.raw(10, within_s=5)]
    assert (3, 3, {"sum_of_ranks": 0.0}) == (got[-1]["s"], got[-1]["n"], got[-1]["m"])
    assert 3 == sum(d["c"] for d in got)
