"""
MPI that the planner cannot see, caught while the instances run: PR425 on stderr, in the events and in the report.

A program that reaches MPI through ``importlib``, a wrapper script or ``ctypes`` runs under the
local backend (poprun saw no MPI in it); each instance is then an MPI world of one, and poprun
says so once, naming the instance and ``--backend mpirun``. Real mpi4py and real Open MPI.
"""

from __future__ import annotations

import ctypes.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Marked
from tests.e2e.test_runs import runs_env
from tests.golden.harness import assert_golden

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PY = sys.executable
GOLDEN = Path(__file__).parent / "runs_golden"
TWO = ["--num-instances", "2", "--num-replicas", "2"]
# mpi4py through importlib: the planner reads no "import mpi4py" (as mpi4py's own test/main.py loads its tests)
INDIRECT = """\
import importlib, os, time
MPI = importlib.import_module("mpi4py" + ".MPI")
world = MPI.COMM_WORLD
time.sleep(1)
print(os.environ["POPDIST_INSTANCE_INDEX"], world.Get_rank(), world.Get_size(), flush=True)
"""
# Open MPI's library through ctypes, MPI_Init and MPI_Finalize: no mpi4py at all
CTYPES = """\
import ctypes, os, time
mpi = ctypes.CDLL("{library}", mode=ctypes.RTLD_GLOBAL)
assert mpi.MPI_Init(None, None) == 0
time.sleep(1)
mpi.MPI_Finalize()
print("done", os.environ["POPDIST_INSTANCE_INDEX"], flush=True)
"""
LIBMPI = re.compile(r"/\S*/libmpi\.so[.0-9]*")


def run(env: dict[str, str], *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "poprun.cli.main", *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=90, check=False)


def only_run(tmp_path: Path) -> Path:
    """Return the directory of the one run recorded under the test's runs folder."""
    (found,) = [d for d in (tmp_path / "runs").iterdir() if d.is_dir()]
    return found


def test_instances_that_load_mpi4py_through_importlib_are_told_once(tmp_path: Path, marked: Marked) -> None:
    """Local backend chosen by poprun, mpi4py through importlib: one PR425 (instance, library, --backend mpirun), exit 0."""
    pytest.importorskip("mpi4py")
    (tmp_path / "indirect.py").write_text(INDIRECT)
    env = runs_env(marked, tmp_path)

    done = run(env, "--events", str(tmp_path / "events.jsonl"), *TWO, PY, "indirect.py", cwd=tmp_path)

    assert (0, ["0 0 1", "1 0 1"]) == (done.returncode, sorted(done.stdout.splitlines())), done.stderr
    told = re.sub(r"instance [01] on", "instance I on", LIBMPI.sub("LIBMPI", done.stderr))
    assert_golden(GOLDEN / "PR425_instances_load_mpi_through_importlib", f"{told}exit {done.returncode}\n")
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    seen = [e for e in events if e["event"] == "mpi-without-launcher"]
    assert [(True, True)] == [(e["index"] in (0, 1), bool(LIBMPI.fullmatch(e["library"]))) for e in seen]
    report = json.loads((only_run(tmp_path) / "report.json").read_text())
    assert ["PR425"] == [w["code"] for w in report["warnings"]]
    assert "--backend mpirun" in report["warnings"][0]["hint"]


def test_a_wrapper_script_whose_child_calls_mpi_init_through_ctypes_is_told(tmp_path: Path) -> None:
    """sh runs python as its child, which dlopens libmpi and calls MPI_Init: the instance's descendants count."""
    library = ctypes.util.find_library("mpi")
    if library is None or shutil.which("mpirun") is None:
        pytest.skip("Open MPI's libmpi is not installed")
    (tmp_path / "init.py").write_text(CTYPES.format(library=library))

    done = run(dict(os.environ), *TWO, "sh", "-c", f"{PY} init.py; echo wrapped $POPDIST_INSTANCE_INDEX", cwd=tmp_path)

    assert 0 == done.returncode, done.stderr
    assert ["done 0", "done 1", "wrapped 0", "wrapped 1"] == sorted(done.stdout.splitlines())
    assert 1 == done.stderr.count("warning[PR425]: an instance loads MPI, but no MPI launcher started it"), done.stderr
    assert "hint: run it with --backend mpirun" in done.stderr


@pytest.mark.parametrize("backend", [
    ["--backend", "local"],  # chosen: the instances are apart on purpose
    ["--backend", "mpirun"],  # one world: nothing to tell
])
def test_a_backend_chosen_by_the_user_or_mpirun_is_not_told(tmp_path: Path, backend: list[str]) -> None:
    """--backend local (on purpose) and --backend mpirun (one MPI world): no PR425."""
    pytest.importorskip("mpi4py")
    if "mpirun" in backend and shutil.which("mpirun") is None:
        pytest.skip("mpirun is not on PATH")
    (tmp_path / "indirect.py").write_text(INDIRECT)

    done = run(dict(os.environ), *backend, *TWO, PY, "indirect.py", cwd=tmp_path)

    expected = ["0 0 1", "1 0 1"] if "local" in backend else ["0 0 2", "1 1 2"]
    assert (0, expected) == (done.returncode, sorted(done.stdout.splitlines())), done.stderr
    assert "PR425" not in done.stderr


def test_offline_mode_is_told_too(tmp_path: Path) -> None:
    """The offline backend (offline mode chose it) runs instances here too: PR425 once."""
    pytest.importorskip("mpi4py")
    (tmp_path / "indirect.py").write_text(INDIRECT)

    done = run(dict(os.environ), "--offline-mode=1", *TWO, PY, "indirect.py", cwd=tmp_path)

    assert 0 == done.returncode, done.stderr
    assert 1 == done.stderr.count("warning[PR425]"), done.stderr
    assert "the offline backend starts no MPI launcher" in done.stderr
