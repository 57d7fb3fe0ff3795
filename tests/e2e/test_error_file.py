"""torch's error file: each instance's ``@record`` writes its exception where poprun said, and the failure report shows it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PY = sys.executable
RECORDED = """
import os
from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    if os.environ["POPDIST_INSTANCE_INDEX"] == "1":
        raise ValueError("the learning rate is negative")

main()
"""
# Prints where its error file is; on attempt 0, instance 1 fails once instance 0 has printed.
SHOW = """
import os, stat, sys, time
path = os.environ["TORCHELASTIC_ERROR_FILE"]
folder, count, index = os.path.dirname(path), os.environ["POPRUN_RESTART_COUNT"], os.environ["POPDIST_INSTANCE_INDEX"]
print(count, os.path.basename(folder), os.path.basename(path), os.path.exists(path),
      oct(stat.S_IMODE(os.stat(folder).st_mode)), flush=True)
open(f"printed-{count}-{index}", "w").close()
if count == "0" and index == "1":
    while not os.path.exists("printed-0-0"):
        time.sleep(0.05)
    sys.exit(3)
"""
# What an instance may leave at its error file's path instead of torch's JSON.
HOSTILE = {
    "link": "os.symlink('/etc/passwd', path)",
    "fifo": "os.mkfifo(path)",
    "large": "open(path, 'w').write('{\"message\": \"' + 'x' * (1 << 20) + '\"}')",
    "not json": "open(path, 'w').write('\\x1b[2J not json')",
    "nested": "open(path, 'w').write('[' * 60000)",
    "message not text": "open(path, 'w').write('{\"message\": {\"message\": [1, 2]}}')",
    "controls": "open(path, 'w').write('{\"message\": {\"message\": \"bad\\\\u001b[31m\\\\nthing\"}}')",
}


def poprun(tmp_path: Path, *args: str, extra: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in ``tmp_path``, its runs under ``tmp_path/runs`` and its temporary files in ``tmp_path/tmp``."""
    (tmp_path / "tmp").mkdir(exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POPDIST_", "MASTER_", "POPRUN_", "TORCHELASTIC"))}
    env |= {"POPRUN_RUNS_DIR": str(tmp_path / "runs"), "TMPDIR": str(tmp_path / "tmp")} | (extra or {})
    return subprocess.run([PY, "-m", "poprun.cli.main", *args], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=100, check=False)


def test_the_failure_report_shows_what_record_wrote(tmp_path: Path) -> None:
    """A program decorated with torch's @record raises in instance 1: the console and `poprun report` show its message."""
    pytest.importorskip("torch")
    (tmp_path / "train.py").write_text(RECORDED)

    done = poprun(tmp_path, "--num-instances=2", "--num-replicas=2", PY, "train.py")

    run = next((tmp_path / "runs").iterdir())
    report = poprun(tmp_path, "report", run.name)
    assert 1 == done.returncode
    assert "  instance 1 on localhost" in done.stderr
    assert "    error file: ValueError: the learning rate is negative" in done.stderr.splitlines()
    assert "    error file: ValueError: the learning rate is negative" in report.stdout.splitlines()
    assert ["1.json"] == sorted(p.name for p in (run / "errors" / "0").iterdir())  # kept with the run record


def test_without_a_run_record_the_error_files_are_removed(tmp_path: Path) -> None:
    """POPRUN_RECORD=0: the message is still shown, and the temporary directory of error files is gone at the end."""
    pytest.importorskip("torch")
    (tmp_path / "train.py").write_text(RECORDED)

    done = poprun(tmp_path, "--num-instances=2", "--num-replicas=2", PY, "train.py", extra={"POPRUN_RECORD": "0"})

    assert "    error file: ValueError: the learning rate is negative" in done.stderr.splitlines()
    assert [] == sorted(p.name for p in (tmp_path / "tmp").iterdir())


def test_each_instance_and_attempt_has_its_own_error_file(tmp_path: Path) -> None:
    """Every instance on this machine gets a file of its own per attempt, none of them existing yet, in an owner-only folder."""
    (tmp_path / "show.py").write_text(SHOW)

    done = poprun(tmp_path, "--num-instances=2", "--num-replicas=2", "--max-restarts=1", "--restart-backoff=0", PY,
                  "show.py")

    assert 0 == done.returncode, done.stderr
    assert ["0 0 0.json False 0o700", "0 0 1.json False 0o700", "1 1 0.json False 0o700",
            "1 1 1.json False 0o700"] == sorted(done.stdout.splitlines())


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_an_error_file_that_is_not_torchs_is_not_trusted(tmp_path: Path, kind: str) -> None:
    """A link, a FIFO, a huge file, junk or control characters at the path: never followed, read whole or printed raw."""
    program = f"import os; path = os.environ['TORCHELASTIC_ERROR_FILE']; {HOSTILE[kind]}; raise SystemExit(1)"

    done = poprun(tmp_path, "--num-instances=1", "--num-replicas=2", PY, "-c", program)

    errors = [line for line in done.stderr.splitlines() if "error file:" in line]
    expected = {"large": ["    error file: (its error file is larger than 64 KiB: not shown)"],
                "controls": ["    error file: bad [31m thing"]}.get(kind, [])
    assert 1 == done.returncode
    assert expected == errors
    assert "root:" not in done.stderr
