"""
What poprun makes is private whatever the umask: the directories above the runs directory, the record, ``--events FILE``.

Each launch is the real CLI under ``umask 000`` with ``HOME`` in the test's own directory
(``POPRUN_RUNS_DIR`` and ``XDG_STATE_HOME`` unset in that process only), so that nothing
is made in the real user's home.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

NOBODY = 65534


def poprun_umask_000(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the CLI with umask 000 and HOME=cwd/home, with no POPRUN_RUNS_DIR nor XDG_STATE_HOME."""
    environ = {k: v for k, v in os.environ.items() if k not in ("POPRUN_RUNS_DIR", "XDG_STATE_HOME")}
    environ |= {"HOME": str(cwd / "home"), **(env or {})}
    return subprocess.run([sys.executable, "-m", "poprun.cli.main", *args], cwd=cwd, capture_output=True, text=True,
                          env=environ, timeout=50, check=False, umask=0)


def modes(top: Path) -> dict[str, str]:
    """Return {path under top: its permission bits in octal} for top and everything below it."""
    found = {".": oct(stat.S_IMODE(top.lstat().st_mode))}
    for path in sorted(top.rglob("*")):
        found[str(path.relative_to(top))] = oct(stat.S_IMODE(path.lstat().st_mode))
    return found


def test_the_directories_made_above_the_runs_directory_are_0700_under_umask_000(tmp_path: Path) -> None:
    """~/.local, ~/.local/state, ~/.local/state/poprun and runs/ are made 0700, the record's files 0600."""
    (tmp_path / "home").mkdir()

    done = poprun_umask_000("--num-instances", "2", "--num-replicas", "2", "echo", "ran", cwd=tmp_path)

    assert (0, "ran\nran\n", "") == (done.returncode, done.stdout, done.stderr)
    found = modes(tmp_path / "home" / ".local")
    assert {".": "0o700", "state": "0o700", "state/poprun": "0o700", "state/poprun/runs": "0o700"} == {
        k: v for k, v in found.items() if k.count("/") < 3}
    assert set() == {k for k, v in found.items() if v not in ("0o700", "0o600")}, found


def test_the_parents_of_a_runs_directory_poprun_makes_are_0700(tmp_path: Path) -> None:
    """POPRUN_RUNS_DIR=a/b/runs, none of them there: each one poprun makes is 0700."""
    done = poprun_umask_000("true", cwd=tmp_path, env={"POPRUN_RUNS_DIR": str(tmp_path / "a" / "b" / "runs")})

    assert 0 == done.returncode, done.stderr
    assert {".": "0o700", "b": "0o700", "b/runs": "0o700"} == {
        k: v for k, v in modes(tmp_path / "a").items() if k.count("/") < 2}


def test_an_existing_events_file_of_yours_is_made_0600(tmp_path: Path) -> None:
    """--events over an existing 0644 file of the user's own: it is 0600 once poprun has opened it."""
    events = tmp_path / "events.jsonl"
    events.write_text("old\n")
    events.chmod(0o644)

    done = poprun_umask_000("--events", "events.jsonl", "true", cwd=tmp_path)

    assert (0, "0o600") == (done.returncode, oct(stat.S_IMODE(events.stat().st_mode))), done.stderr
    assert events.read_text().startswith('{"v":1,"event":"run-started"')


def test_a_new_events_file_is_0600_under_umask_000(tmp_path: Path) -> None:
    """--events to a file that does not exist yet: made 0600 whatever the umask."""
    done = poprun_umask_000("--events", "new.jsonl", "true", cwd=tmp_path)

    assert (0, "0o600") == (done.returncode, oct(stat.S_IMODE((tmp_path / "new.jsonl").stat().st_mode)))


@pytest.mark.skipif(os.geteuid() != 0, reason="making a file of another user's needs root")
def test_a_link_to_another_users_file_is_not_followed_to_change_its_mode(tmp_path: Path) -> None:
    """--events through a link to someone else's 0644 file: its mode and owner stay as they were."""
    theirs = tmp_path / "theirs.jsonl"
    theirs.write_text("")
    os.chown(theirs, NOBODY, NOBODY)
    theirs.chmod(0o644)
    (tmp_path / "link").symlink_to(theirs)

    done = poprun_umask_000("--events", "link", "true", cwd=tmp_path)

    assert 0 == done.returncode, done.stderr
    assert ("0o644", NOBODY) == (oct(stat.S_IMODE(theirs.stat().st_mode)), theirs.stat().st_uid)


def test_a_device_as_events_target_keeps_its_mode(tmp_path: Path) -> None:
    """--events /dev/null: written, never made 0600 (it is not a regular file, even when root owns it)."""
    before = Path("/dev/null").stat().st_mode

    done = poprun_umask_000("--events", "/dev/null", "true", cwd=tmp_path)

    assert (0, before) == (done.returncode, Path("/dev/null").stat().st_mode), done.stderr


@pytest.mark.parametrize("args", [("plan", "-o", "saved"), ("plan", "--format", "json", "-o", "saved"),
                                  ("--export-config", "saved")], ids=["plan-o", "plan-json-o", "export-config"])
def test_a_saved_plan_or_exported_config_is_0600_under_umask_000(tmp_path: Path, args: tuple[str, ...]) -> None:
    """plan -o and --export-config hold the values the plan sets: created 0600 whatever the umask."""
    done = poprun_umask_000(*args, "--mpi-local-args=-x LEARNING_RATE=0.125", "true", cwd=tmp_path, env={"POPRUN_RECORD": "0"})

    assert (0, "0o600") == (done.returncode, oct(stat.S_IMODE((tmp_path / "saved").stat().st_mode))), done.stderr
    assert args[1] == "-o" or "0.125" in (tmp_path / "saved").read_text()  # the text view shows no values


def test_an_existing_plan_file_of_yours_is_made_0600(tmp_path: Path) -> None:
    """plan -o over an existing 0666 file of the user's own: it is 0600 afterwards, and holds the new plan."""
    saved = tmp_path / "plan.json"
    saved.write_text("old\n")
    saved.chmod(0o666)

    done = poprun_umask_000("plan", "--format", "json", "-o", "plan.json", "true", cwd=tmp_path)

    assert (0, "0o600") == (done.returncode, oct(stat.S_IMODE(saved.stat().st_mode))), done.stderr
    assert saved.read_text().startswith("{")
