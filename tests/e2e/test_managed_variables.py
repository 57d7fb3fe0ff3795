"""A -x of a variable poprun sets: what ``plan --explain`` shows is what the instances get, or the plan is refused."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.test_partition_launch import server  # noqa: F401 - a fixture

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]

PY = sys.executable
SHOWN = ("POPDIST_EXECUTABLE_CACHE_PATH", "RANK", "IPUOF_VIPU_API_TIMEOUT", "IPUOF_CONFIG_PATH", "OMPI_COMM_WORLD_RANK")
PRINT = f"import json, os; print(json.dumps({{n: os.environ.get(n) for n in {SHOWN!r}}}))"


def poprun(tmp_path: Path, *args: str, extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in ``tmp_path`` with a clean launching environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POPDIST_", "MASTER_", "IPUOF_", "OMPI_", "RANK"))}
    return subprocess.run([PY, "-m", "poprun.cli.main", *args], cwd=tmp_path, env=env | (extra or {}),
                          capture_output=True, text=True, timeout=80, check=False)


def explained(text: str) -> dict[str, str]:
    """Return the variables ``plan --explain`` lists for instance 0 (NAME=VALUE lines)."""
    lines = text.split("environment of instance 0", 1)[1].splitlines()[1:]
    pairs = [line.strip().split("=", 1) for line in lines if line.startswith("  ") and "=" in line]
    return {name: value for name, value in pairs if " " not in name}


def shown_and_run(tmp_path: Path, *options: str,
                  extra: dict[str, str] | None = None) -> tuple[str, dict[str, str], dict[str, str | None]]:
    """Return explain's text, its variables of instance 0, and what instance 0 printed, for the same options."""
    plan = poprun(tmp_path, "plan", "--explain", *options, PY, "-c", PRINT, extra=extra)
    assert 0 == plan.returncode, plan.stderr
    run = poprun(tmp_path, *options, PY, "-c", PRINT, extra=extra)
    assert 0 == run.returncode, run.stderr
    first = json.loads(run.stdout.splitlines()[0])
    return plan.stdout + plan.stderr, explained(plan.stdout), first


TWO = ("--num-instances=1", "--num-replicas=2", "--offline-mode=yes")


def test_an_executable_cache_set_with_x_is_the_fixed_cache_that_runs(tmp_path: Path) -> None:
    """-x POPDIST_EXECUTABLE_CACHE_PATH=DIR: explain shows DIR as the fixed cache, the instances get DIR, and it is kept."""
    cache = tmp_path / "cache"
    options = ("--num-instances=2", "--num-replicas=2", "--offline-mode=yes",
               f"--mpi-local-args=-x POPDIST_EXECUTABLE_CACHE_PATH={cache}")

    text, shown, got = shown_and_run(tmp_path, *options)

    assert f"executable cache: user at {cache}" in text
    assert str(cache) == shown["POPDIST_EXECUTABLE_CACHE_PATH"] == got["POPDIST_EXECUTABLE_CACHE_PATH"]


@pytest.mark.parametrize("given", ["-x POPDIST_EXECUTABLE_CACHE_PATH", "-x POPDIST_EXECUTABLE_CACHE_PATH=/elsewhere"])
def test_an_executable_cache_not_fixed_for_the_run_is_refused(tmp_path: Path, given: str) -> None:
    """Forwarded, or naming another directory than --executable-cache-path: PR234, nothing runs."""
    done = poprun(tmp_path, "--num-instances=2", "--num-replicas=2", "--offline-mode=yes",
                  f"--executable-cache-path={tmp_path}", f"--mpi-local-args={given}", "touch", "ran")

    assert (2, "error[PR234]: executable cache not a fixed path for the run") == (done.returncode,
                                                                                  done.stderr.splitlines()[0])
    assert not (tmp_path / "ran").exists()


def test_a_layout_variable_set_with_x_is_what_runs_with_a_warning(tmp_path: Path) -> None:
    """-x RANK=7: explain and the instance both say 7, and PR233 says it replaces poprun's value."""
    text, shown, got = shown_and_run(tmp_path, *TWO, "--mpi-local-args=-x RANK=7")

    assert "warning[PR233]: -x replaces a value of the layout" in text
    assert "7" == shown["RANK"] == got["RANK"]


@pytest.mark.parametrize("name", ["POPRUN_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT", "POPRUN_RUN_ID",
                                  "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE", "OMPI_COMM_WORLD_RANK",
                                  "OMPI_COMM_WORLD_LOCAL_SIZE", "PMIX_RANK"])
def test_a_variable_set_for_each_attempt_or_by_mpi_is_refused(tmp_path: Path, name: str) -> None:
    """A -x of a variable poprun sets when each attempt starts, or MPI's: PR232 before anything runs."""
    done = poprun(tmp_path, *TWO, f"--instance-mpi-local-args=0:-x {name}=5", "touch", "ran")

    assert (2, "error[PR232]: a variable poprun sets itself") == (done.returncode, done.stderr.splitlines()[0])
    assert not (tmp_path / "ran").exists()


def test_ipuof_config_path_set_with_x_is_not_removed(tmp_path: Path) -> None:
    """-x IPUOF_CONFIG_PATH=F: explain no longer says it is removed, and the instance gets F."""
    text, shown, got = shown_and_run(tmp_path, *TWO, "--mpi-local-args=-x IPUOF_CONFIG_PATH=/etc/ipuof.conf")

    assert "removed: IPUOF_CONFIG_PATH" not in text
    assert "/etc/ipuof.conf" == shown["IPUOF_CONFIG_PATH"] == got["IPUOF_CONFIG_PATH"]


def test_the_users_vipu_timeout_survives_the_partition_step(server: int, tmp_path: Path) -> None:  # noqa: F811
    """-x IPUOF_VIPU_API_TIMEOUT=600 with a partition acquired: explain and the instance both say 600, not 120."""
    options = ("--vipu-server-host", "127.0.0.1", "--vipu-server-port", str(server), "--vipu-partition", "p2",
               "--update-partition", "yes", "--num-instances=2", "--num-replicas=2",
               "--mpi-local-args=-x IPUOF_VIPU_API_TIMEOUT=600")

    _, shown, got = shown_and_run(tmp_path, *options, extra={"POPRUN_PARTITION_PROVIDER": "emulated"})

    assert "600" == shown["IPUOF_VIPU_API_TIMEOUT"] == got["IPUOF_VIPU_API_TIMEOUT"]


def test_a_partition_variable_set_with_x_is_refused(server: int, tmp_path: Path) -> None:  # noqa: F811
    """-x IPUOF_VIPU_API_PARTITION_ID with a partition poprun acquires: PR232, pointing at --vipu-partition."""
    done = poprun(tmp_path, "--vipu-server-host", "127.0.0.1", "--vipu-server-port", str(server),
                  "--num-instances=2", "--num-replicas=2", "--mpi-local-args=-x IPUOF_VIPU_API_PARTITION_ID=other",
                  "touch", "ran", extra={"POPRUN_PARTITION_PROVIDER": "emulated"})

    assert 2 == done.returncode
    assert "hint: give --vipu-partition instead" in done.stderr
    assert not (tmp_path / "ran").exists()


def test_popdist_variables_of_the_launching_shell_are_not_inherited_unseen(tmp_path: Path) -> None:
    """A stale POPDIST_EXECUTABLE_CACHE_PATH and POPRUN_RUN_ID in the shell: explain says they are removed, and they are."""
    stale = {"POPDIST_EXECUTABLE_CACHE_PATH": "/stale/cache", "POPRUN_RUN_ID": "outer", "POPRUN_RECORD": "0"}
    program = "import os; print(os.environ.get('POPDIST_EXECUTABLE_CACHE_PATH'), os.environ.get('POPRUN_RUN_ID'))"

    plan = poprun(tmp_path, "plan", "--explain", *TWO, PY, "-c", program, extra=stale)
    done = poprun(tmp_path, *TWO, PY, "-c", program, extra=stale)
    two = poprun(tmp_path, "--num-instances=2", "--num-replicas=2", "--offline-mode=yes", PY, "-c", program,
                 extra=stale)

    assert "  removed: IPUOF_CONFIG_PATH POPDIST_EXECUTABLE_CACHE_PATH POPRUN_RUN_ID" in plan.stdout.splitlines()
    assert (0, "None None") == (done.returncode, done.stdout.strip())
    assert 0 == two.returncode, two.stderr
    assert [("None", "poprun-cache-")] * 2 == [(run_id, Path(cache).name[:13]) for cache, run_id in
                                              (line.split() for line in two.stdout.splitlines())]
