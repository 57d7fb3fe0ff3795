"""
Pruning old runs (``POPRUN_RUNS_KEEP``) through real launches: hostile old records, launches at once, runs of one second.

Every test keeps its runs in a folder of its own (``POPRUN_RUNS_DIR``). An "old record" is a copy
of a real run's record under an older id, then spoiled as an attacker (or a crash) would leave it.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import Marked

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PY = sys.executable
OLD = "20000101-000000-abcdef"  # an id older than any real run's


def poprun(env: dict[str, str], *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    """Run ``poprun ARGS`` to its end, its address space bounded (what reads without end dies, not the machine)."""
    def bounded() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))

    return subprocess.run([PY, "-m", "poprun.cli.main", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False, preexec_fn=bounded)


def launch(env: dict[str, str], script: str = "true", *, keep: int = 1) -> subprocess.CompletedProcess[str]:
    """Run ``poprun sh -c SCRIPT`` (2 instances) with ``POPRUN_RUNS_KEEP=keep``."""
    return poprun(env | {"POPRUN_RUNS_KEEP": str(keep)}, "--num-instances", "2", "--num-replicas", "2", "sh", "-c",
                  script)


@pytest.fixture
def env(marked: Marked, tmp_path: Path) -> dict[str, str]:
    """Return the marked environment with the test's own runs folder."""
    return marked.env | {"POPRUN_RUNS_DIR": str(tmp_path / "runs")}


def old_record(env: dict[str, str], name: str = OLD) -> Path:
    """Return a real run's record renamed to the older id ``name`` (of 2000-01-01)."""
    runs = Path(env["POPRUN_RUNS_DIR"])
    assert 0 == launch(env, keep=100).returncode
    made = next(p for p in runs.iterdir() if not p.name.startswith("20000101-"))
    return made.rename(runs / name)


def _replace(path: Path, make: Callable[[Path], None]) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()
    make(path)


def _huge(path: Path) -> None:
    with path.open("wb") as file:
        file.truncate(100 << 20)  # sparse: 100 MiB of NUL


SPOILED = {
    "supervisor is a FIFO": lambda run: _replace(run / "supervisor", os.mkfifo),
    "supervisor is a link to /dev/zero": lambda run: _replace(run / "supervisor",
                                                              lambda p: p.symlink_to("/dev/zero")),
    "supervisor is a directory": lambda run: _replace(run / "supervisor", Path.mkdir),
    "supervisor is huge": lambda run: _replace(run / "supervisor", _huge),
    "supervisor holds other digits": lambda run: (run / "supervisor").write_text(f"² 1 {os.uname().nodename}\n"),
    "supervisor is missing": lambda run: (run / "supervisor").unlink(),
    "report.json is a FIFO": lambda run: _replace(run / "report.json", os.mkfifo),
    "events.jsonl is a link to /dev/zero": lambda run: _replace(run / "events.jsonl",
                                                                lambda p: p.symlink_to("/dev/zero")),
    "plan.json is a directory": lambda run: _replace(run / "plan.json", Path.mkdir),
}


@pytest.mark.parametrize("case", sorted(SPOILED))
def test_a_spoiled_old_record_is_pruned_without_a_hang_or_a_crash(env: dict[str, str], case: str) -> None:
    """An old record whose files are FIFOs, links to /dev/zero, huge or garbage: the next launch prunes it, at once."""
    # GIVEN
    old = old_record(env)
    SPOILED[case](old)

    # WHEN
    done = launch(env, "echo ran")

    # THEN
    assert (0, "ran\nran\n", "") == (done.returncode, done.stdout, done.stderr)
    assert not old.exists()
    assert 1 == len(list(Path(env["POPRUN_RUNS_DIR"]).iterdir()))


def test_pruning_never_deletes_through_a_link_or_outside_the_runs_directory(env: dict[str, str], tmp_path: Path) -> None:
    """A marked run directory that is a link is left alone; a pruned run's links to files and folders outside are unlinked only."""
    # GIVEN a record elsewhere, linked into the runs directory as an old run; an old record holding links out
    old = old_record(env)
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(old, elsewhere, symlinks=True)
    (Path(env["POPRUN_RUNS_DIR"]) / "20000101-000000-000000").symlink_to(elsewhere)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("keep me")
    (old / "logs" / "to-dir").symlink_to(outside)
    (old / "logs" / "to-file").symlink_to(outside / "keep")
    (old / "supervisor").unlink()
    (old / "supervisor").symlink_to(outside / "keep")

    # WHEN
    done = launch(env)

    # THEN
    assert (0, "") == (done.returncode, done.stderr)
    assert not old.exists()
    assert ["keep"] == [p.name for p in outside.iterdir()]
    assert "keep me" == (outside / "keep").read_text()
    assert (elsewhere / ".poprun-run").is_file() and (elsewhere / "report.json").is_file()


def test_a_deeply_nested_old_record_is_pruned_as_deep_as_is_safe(env: dict[str, str]) -> None:
    """An old record holding 3,000 nested folders: the launch goes on (no recursion error), the record is no run any more."""
    # GIVEN
    old = old_record(env)
    fd = os.open(old / "logs", os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(3000):
            os.mkdir("d", dir_fd=fd)
            deeper = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = deeper
    finally:
        os.close(fd)

    # WHEN
    try:
        done = launch(env)
    finally:
        listed = poprun(env, "ps", "--all", "--json")
        _unnest(old / "logs")

    # THEN
    assert (0, "") == (done.returncode, done.stderr)
    assert 1 == len(json.loads(listed.stdout))


def _unnest(base: Path) -> None:
    """Remove the chain of folders ``d/d/d/...`` under ``base`` a level at a time (pytest's rmtree would recurse)."""
    current, n = base / "d", 0
    while current.is_dir():
        below = current / "d"
        if below.is_dir():
            n += 1
            below.rename(base / f"up{n}")
        for leftover in current.iterdir():
            leftover.unlink()
        current.rmdir()
        current = base / f"up{n}"


def test_pruning_never_leaves_the_file_system_of_the_run(env: dict[str, str], tmp_path: Path) -> None:
    """A file system mounted inside an old record (its logs): pruning removes nothing on it."""
    # GIVEN
    old = old_record(env)
    mount = old / "logs" / "mounted"
    mount.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], check=False,
                      capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (not root)")
    try:
        (mount / "data").write_text("keep me")

        # WHEN
        done = launch(env)

        # THEN
        assert (0, "") == (done.returncode, done.stderr)
        assert "keep me" == (mount / "data").read_text()
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_launches_at_once_never_prune_each_other(env: dict[str, str]) -> None:
    """12 launches at once with POPRUN_RUNS_KEEP=1: every one is recorded while it runs, none says otherwise."""
    # GIVEN each instance looks for its own run's record while it runs
    script = 'sleep 1; [ -f "$POPRUN_RUNS_DIR/$POPRUN_RUN_ID/.poprun-run" ] && echo recorded || echo "not recorded"'
    argv = [PY, "-m", "poprun.cli.main", "--num-instances", "2", "--num-replicas", "2", "sh", "-c", script]

    # WHEN
    procs = [subprocess.Popen(argv, env=env | {"POPRUN_RUNS_KEEP": "1"}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(12)]
    ended = [(p.wait(timeout=100), *p.communicate()) for p in procs]

    # THEN
    assert [(0, "recorded\nrecorded\n", "")] * 12 == ended


def test_the_newest_runs_are_kept_within_one_second_as_ps_lists_them(env: dict[str, str]) -> None:
    """Runs of one second whose random ends sort against their order: KEEP=3 keeps the 3 newest as ps lists them."""
    # GIVEN 4 runs, renamed as if all began in one second, each later one with a smaller random end
    runs = Path(env["POPRUN_RUNS_DIR"])
    for n, suffix in enumerate(("ffffff", "cccccc", "999999", "666666")):
        assert 0 == launch(env, f"echo run {n}", keep=100).returncode
        made = next(p for p in runs.iterdir() if not p.name.startswith("20000101-"))
        made.rename(runs / f"20000101-000000-{suffix}")
    listed = [r["id"] for r in json.loads(poprun(env, "ps", "--all", "--json").stdout)]
    last = poprun(env, "logs", "last")

    # WHEN a fifth run, with KEEP=3
    assert 0 == launch(env, "echo run 4", keep=3).returncode

    # THEN
    assert ["20000101-000000-666666", "20000101-000000-999999", "20000101-000000-cccccc",
            "20000101-000000-ffffff"] == listed
    assert "run 3\nrun 3\n" == last.stdout
    kept = [r["id"] for r in json.loads(poprun(env, "ps", "--all", "--json").stdout)]
    assert kept[1:] == ["20000101-000000-666666", "20000101-000000-999999"]
    assert "run 4\nrun 4\n" == poprun(env, "logs", "last").stdout


def test_a_run_of_another_host_is_pruned_once_its_report_is_written(env: dict[str, str]) -> None:
    """A shared runs directory: another host's ended run is pruned; one without a report (it may run) is kept."""
    # GIVEN two old runs supervised on another host, one of them ended
    ended, running = old_record(env, "20000101-000000-000001"), old_record(env, "20000101-000000-000002")
    for run in (ended, running):
        (run / "supervisor").write_text("4242 1234 another-host\n")
    (running / "report.json").unlink()

    # WHEN
    done = launch(env)

    # THEN
    assert (0, "") == (done.returncode, done.stderr)
    assert (False, True) == (ended.exists(), running.exists())


def test_a_launch_that_starts_nothing_still_prunes(env: dict[str, str]) -> None:
    """A run whose instances never started prunes as its record closes."""
    old = old_record(env)
    failed = poprun(env | {"POPRUN_RUNS_KEEP": "1"}, "--offline-mode=1", "no-such-program-poprun")
    assert failed.returncode != 0
    assert not old.exists()


@pytest.mark.parametrize("how", ["at once", "prune_old", "close"])
def test_record_create_prunes_at_once_unless_asked_later(env: dict[str, str], how: str) -> None:
    """RunRecord.create prunes as it makes the record; with prune=False, at prune_old() (once) or close()."""
    from poprun.runs.record import RunRecord

    old = old_record(env)
    record = RunRecord.create(env | {"POPRUN_RUNS_KEEP": "1"}, prune=how == "at once")
    assert old.exists() == (how != "at once")
    if how == "prune_old":
        record.prune_old()
        assert not old.exists()
        record.prune_old()  # once: nothing more to do
    record.close()
    assert not old.exists()
