"""
Start-up stays lean: what a classic launch imports (the time itself is measured by bench/apply_bench.py).

poprun's start-up budget is twice a bare ``python3 -c pass``. It holds because a classic launch
imports no heavy module: these tests fail when one creeps back onto that path, with its name.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# Each costs 1 to 30 ms to import, or is needed only by other commands (plan files, TOML, the DSL).
HEAVY = ("attr", "attrs", "cattrs", "lark", "typing", "inspect", "dataclasses", "shutil", "tempfile", "json",
         "socket", "difflib", "tomllib", "tomli_w", "importlib.metadata", "ast")
_PROBE = """
import sys
before = set(sys.modules)
from poprun.cli.main import main
status = main(sys.argv[1:])
sys.stdout.flush()
print(status, *sorted(set(sys.modules) - before), file=sys.stderr)
"""


def _imported(*args: str, cwd: Path, env: dict[str, str] | None = None) -> tuple[int, set[str]]:
    """Return the exit status of ``poprun args`` in a fresh interpreter and the modules it imported."""
    result = subprocess.run([sys.executable, "-c", _PROBE, *args], cwd=cwd, capture_output=True, text=True,
                            timeout=30, check=False, env=None if env is None else {**os.environ, **env})
    status, *modules = result.stderr.splitlines()[-1].split()
    return int(status), set(modules)


@pytest.mark.parametrize("args", [
    ("--offline-mode=1", "true"),
    ("--num-instances", "4", "--num-replicas", "8", "--offline-mode=1", "--mpi-global-args=--tag-output", "true"),
    ("--version",),
], ids=["one-instance", "tagged-four-instances", "version"])
def test_a_classic_launch_imports_nothing_heavy(tmp_path: Path, args: tuple[str, ...]) -> None:
    """The classic form, planned and run through the offline backend, imports none of HEAVY."""
    status, modules = _imported(*args, cwd=tmp_path)

    assert (0, []) == (status, sorted(modules.intersection(HEAVY)))


def test_the_console_script_is_the_fast_exit_entry() -> None:
    """pyproject's poprun script is main.entry, which skips the interpreter's module teardown."""
    text = (Path(__file__).parents[2] / "pyproject.toml").read_text()

    assert 'poprun = "poprun.cli.main:entry"' in text


def test_entry_flushes_output_and_exits_with_main_status(tmp_path: Path) -> None:
    """Through entry (python -m), output piped to a file arrives whole and the status is the instance's."""
    program = "i=0; while [ $i -lt 2000 ]; do echo line $i; i=$((i+1)); done; exit 3"
    result = subprocess.run([sys.executable, "-m", "poprun.cli.main", "--offline-mode=1", "sh", "-c", program],
                            cwd=tmp_path, capture_output=True, text=True, timeout=30, check=False)

    assert 3 == result.returncode
    assert [f"line {i}" for i in range(2000)] == result.stdout.splitlines()


def test_pruning_old_runs_imports_nothing_heavy(tmp_path: Path) -> None:
    """A launch that prunes old run records (more than POPRUN_RUNS_KEEP) imports none of HEAVY, and prunes."""
    runs = tmp_path / "runs"
    for n in range(3):
        (runs / f"20200101-00000{n}-aaaaaa" / "logs").mkdir(parents=True)
        (runs / f"20200101-00000{n}-aaaaaa" / ".poprun-run").write_text("")
        (runs / f"20200101-00000{n}-aaaaaa" / "logs" / "0.stdout").write_text("old\n")
    status, modules = _imported("--offline-mode=1", "true", cwd=tmp_path,
                                env={"POPRUN_RUNS_DIR": str(runs), "POPRUN_RUNS_KEEP": "1"})

    assert (0, []) == (status, sorted(modules.intersection(HEAVY)))
    assert 1 == len(list(runs.iterdir()))


def _own_cgroup_directory() -> Path | None:
    """Return this process's cgroup v2 directory when a child cgroup can be made there, else None."""
    from poprun.process.cgroup import Cgroup

    probe = Cgroup.make()
    if probe is None:
        return None
    probe.remove()
    return Path(probe.parent)


@pytest.mark.parametrize(("program", "status"), [
    (("sh", "-c", "cat /proc/self/cgroup"), 0),
    (("no-such-program-here",), 127),
], ids=["a-launch", "nothing-started"])
def test_the_cgroup_made_ahead_is_the_launchs_and_none_is_left(tmp_path: Path, program: tuple[str, ...],
                                                                status: int) -> None:
    """
    poprun makes its launch's cgroup as the run begins (its move overlaps the record's making).

    The instance runs in it, and afterwards no cgroup of poprun's is left, also when nothing
    started (the program is missing): poprun runs in a cgroup of this test's own, so that
    other launches on the machine do not count.
    """
    parent = _own_cgroup_directory()
    if parent is None:
        pytest.skip("no cgroup can be made here (cgroup v2 not writable, or POPRUN_CGROUP=0)")
    mine = parent / f"startup-test-{os.getpid()}-{status}"
    mine.mkdir()
    try:
        # WHEN poprun runs in a cgroup of this test's own
        result = subprocess.run(["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(mine), sys.executable,
                                 "-m", "poprun.cli.main", "--offline-mode=1", *program], cwd=tmp_path,
                                capture_output=True, text=True, timeout=30, check=False,
                                env={**os.environ, "POPRUN_RUNS_DIR": str(tmp_path / "runs")})

        # THEN
        ran_in = [line[3:] for line in result.stdout.splitlines() if line.startswith("0::")]
        assert status == result.returncode, result.stderr
        assert [] == [p.name for p in mine.iterdir() if p.is_dir()]
        assert "" == (mine / "cgroup.procs").read_text()
        if status == 0:
            assert (mine.name, "poprun-") == (Path(ran_in[0]).parent.name, Path(ran_in[0]).name[:7])
    finally:
        mine.rmdir()
