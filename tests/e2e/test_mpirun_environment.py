"""The mpirun backend gives the instances the caller's PATH and libraries, as plain ``mpirun`` does."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120),
              pytest.mark.skipif(shutil.which("mpirun") is None, reason="mpirun is not on PATH")]


def test_python3_is_the_callers_and_imports_mpi4py(tmp_path: Path) -> None:
    """
    With this interpreter's bin directory first on PATH, ``python3`` in an instance is that one (not /usr/bin's).

    (Called by its absolute path, mpirun acts as if given --prefix and puts its own directories
    first on the instances' PATH and LD_LIBRARY_PATH.)
    """
    pytest.importorskip("mpi4py")
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', os.defpath)}"
    env = os.environ | {"PATH": path, "LD_LIBRARY_PATH": str(tmp_path)}
    probe = "import os, sys, mpi4py; print(sys.executable, os.environ.get('LD_LIBRARY_PATH'))"

    done = subprocess.run([sys.executable, "-m", "poprun.cli.main", "--backend", "mpirun", "--num-instances", "2",
                           "--num-replicas", "2", "python3", "-c", probe], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=60, check=False)

    assert 0 == done.returncode, done.stderr
    assert [f"{shutil.which('python3', path=path)} {tmp_path}"] * 2 == done.stdout.splitlines()
