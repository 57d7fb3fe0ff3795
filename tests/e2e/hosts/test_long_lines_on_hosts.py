"""Lines of 3 MiB and 40 MiB from instances on other hosts (ssh, mpirun) arrive whole and byte-exact, on stdout and in the record."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.e2e.test_long_lines import PY, SIZES, WRITER, expected, record_log, shape
from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


@pytest.mark.parametrize("backend", ["ssh", "mpirun"])
def test_long_lines_from_another_host_arrive_whole(test_hosts: TestHosts, tmp_path: Path, backend: str) -> None:
    """One instance on h1 writes a 3 MiB and a 40 MiB line (every byte value), then a last line: byte-exact here."""
    want = expected(*SIZES)

    done = subprocess.run([PY, "-m", "poprun.cli.main", "--backend", backend, "--host", "h1", PY, "-c", WRITER,
                           *map(str, SIZES)], cwd=tmp_path, capture_output=True, timeout=240, check=False,
                          env=os.environ | test_hosts.env() | {"POPRUN_RUNS_DIR": str(tmp_path / "runs")})

    assert 0 == done.returncode, done.stderr[-2000:]
    assert shape(want) == shape(done.stdout)
    assert want == done.stdout
    assert want == record_log(tmp_path / "runs", 0)
