"""
popdist.poptorch.Options in instances started by the real CLI, over the PopTorch double (tests/doubles).

The program does what graphcore/examples do: build the options in one of the three call forms,
then set a seed, the executable cache, gradient accumulation and device iterations.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

PY = sys.executable
DOUBLES = Path(__file__).parent.parent / "doubles"
PROGRAM = """
import json, sys

import popdist, popdist.poptorch

made = {
    "Options()": lambda: popdist.poptorch.Options(),
    "Options(ipus_per_replica=2)": lambda: popdist.poptorch.Options(ipus_per_replica=2),
    "Options(2)": lambda: popdist.poptorch.Options(2),
}
record = {"instance": popdist.getInstanceIndex()}
for form, make in made.items():
    opts = make()
    opts.randomSeed(42)
    opts.enableExecutableCaching("./cachedir")
    opts.Training.gradientAccumulation(8)
    opts.deviceIterations(4)
    try:
        opts.replicationFactor(1)
    except RuntimeError as refused:
        refusal = str(refused)
    record[form] = [opts.replication_factor, opts.Distributed.processId, opts.Distributed.numProcesses,
                    opts.ipu_id if opts.exists("ipu_id") else None, opts.random_seed,
                    opts.Training.gradient_accumulation, refusal]
print(json.dumps(record), flush=True)
"""
REFUSAL = "Cannot call `replicationFactor` with popdist.poptorch.Options"


def run(tmp_path: Path, *args: str) -> list[dict[str, object]]:
    """Launch PROGRAM with the PopTorch double on PYTHONPATH; return each instance's record, by instance."""
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("POPDIST_", "IPUOF_", "POPRUN_", "OMPI_"))}
    environ["PYTHONPATH"] = os.pathsep.join([str(DOUBLES), *filter(None, [os.environ.get("PYTHONPATH")])])
    done = subprocess.run([PY, "-m", "poprun.cli.main", *args, "--num-instances=2", "--num-replicas=8",
                           "--ipus-per-replica=2", PY, str(program)],
                          cwd=tmp_path, env=environ | {"POPRUN_PARTITION_PROVIDER": "emulated"},
                          capture_output=True, text=True, timeout=45, check=False)
    assert 0 == done.returncode, done.stderr
    return sorted((json.loads(line) for line in done.stdout.splitlines()), key=lambda r: r["instance"])


def expected(instance: int, device: int | None) -> dict[str, object]:
    """Return what instance ``instance`` of 2 (4 replicas each) records; ``device`` for the forms given IPUs."""
    values = [4, instance, 2, None, 42, 8, REFUSAL]
    given = [4, instance, 2, device, 42, 8, REFUSAL]
    return {"instance": instance, "Options()": values, "Options(ipus_per_replica=2)": given, "Options(2)": given}


def test_every_call_form_works_in_an_offline_launch(tmp_path):
    """Offline: each instance's options take its replicas and index; no device is chosen; later calls work."""
    assert [expected(0, None), expected(1, None)] == run(tmp_path, "--offline-mode=1")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[int]:
    """Run ``poprun vipu-server`` (a Pod16) on a free port; yield the port."""
    proc = subprocess.Popen([PY, "-m", "poprun.cli.main", "vipu-server", "--port", "0", "--db",
                             str(tmp_path / "vipu.sqlite"), "--ipus", "16", "--ild-size", "16"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("listening on "), line
    yield int(line.split()[2].rsplit(":", 1)[1])
    proc.terminate()
    proc.wait(timeout=10)
    proc.stdout.close()


def test_every_call_form_selects_the_instance_device_on_a_partition(tmp_path, server):
    """On a partition of 16 IPUs, the forms given IPUs per replica select device 28 + instance (8 IPUs each)."""
    records = run(tmp_path, "--vipu-server-host=127.0.0.1", f"--vipu-server-port={server}",
                  "--vipu-partition=p16", "--update-partition=yes")

    assert [expected(0, 28), expected(1, 29)] == records
