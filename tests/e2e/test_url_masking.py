"""A URL's password in a value, an argument or a spec is masked in every text poprun shows, whatever holds it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PY = sys.executable
SECRET = "s3cr3tpw"  # noqa: S105 - the test's own, looked for in the output
URL = f"postgres://u:{SECRET}@db.example/app"
SHOWN = "postgres://u:****@db.example/app"
PRINT_URL = "import os; print(os.environ['DB_URL'].split(':')[2].split('@')[0][::-1])"  # the password, reversed


def poprun(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "poprun.cli.main", *args], cwd=cwd, capture_output=True, text=True, timeout=60,
                          env=os.environ | {"POPRUN_RUNS_DIR": str(cwd / "runs")}, check=False,
                          stdin=subprocess.DEVNULL)


def test_explain_masks_a_url_password_in_a_value_an_argument_and_the_mpirun_command(tmp_path: Path) -> None:
    """-x DB_URL=postgres://u:pw@h/db (a name that looks harmless) and --db URL show as u:****@, never the password."""
    done = poprun("plan", "--explain", "--backend", "mpirun", f"--mpi-local-args=-x DB_URL={URL}", "python3", "x.py",
                  "--db", URL, cwd=tmp_path)

    assert 0 == done.returncode, done.stderr
    assert SECRET not in done.stdout
    assert f"  DB_URL={SHOWN}\n" in done.stdout
    assert f"program: python3 x.py --db {SHOWN}\n" in done.stdout
    assert f"'-x' 'DB_URL={SHOWN}'" in done.stdout  # the mpirun command


@pytest.mark.parametrize(("name", "text"), [
    ("job.toml", f'[env]\nset = {{DB_URL = "{URL}"}}\n\n[program]\nargv = ["python3", "x.py"]\n'),
    ("job.pop", f"set DB_URL = {URL}\nrun python3 x.py\n"),
])
def test_a_url_password_set_in_a_spec_is_masked_but_the_saved_plan_keeps_it(tmp_path: Path, name: str,
                                                                             text: str) -> None:
    """A spec's value shows masked in explain; --format json is exact (apply needs the value): the password is there."""
    (tmp_path / name).write_text(text)

    explained = poprun("plan", "--explain", name, cwd=tmp_path)
    saved = poprun("plan", "--format", "json", name, cwd=tmp_path)

    assert 0 == explained.returncode, explained.stderr
    assert SECRET not in explained.stdout
    assert f"  DB_URL={SHOWN}\n" in explained.stdout
    assert URL == json.loads(saved.stdout)["instances"][0]["env"]["DB_URL"]


def test_verbose_logs_mask_the_password_and_the_program_gets_it(tmp_path: Path) -> None:
    """-vv shows the instance's environment with u:****@; the instance itself reads the real URL."""
    done = poprun("-vv", f"--mpi-local-args=-x DB_URL={URL}", PY, "-c", PRINT_URL, cwd=tmp_path)

    assert (0, SECRET[::-1] + "\n") == (done.returncode, done.stdout), done.stderr
    assert SECRET not in done.stderr
    assert f"DB_URL={SHOWN}" in done.stderr


def test_diff_text_and_json_mask_the_password(tmp_path: Path) -> None:
    """plan --diff shows the changed value masked, as text and as JSON."""
    (tmp_path / "old.json").write_text(poprun("plan", "--format", "json", "python3", "x.py", cwd=tmp_path).stdout)

    as_text = poprun("plan", "--diff", "old.json", f"--mpi-local-args=-x DB_URL={URL}", "python3", "x.py",
                     cwd=tmp_path)
    as_json = poprun("plan", "--diff", "old.json", "--format", "json", f"--mpi-local-args=-x DB_URL={URL}",
                     "python3", "x.py", cwd=tmp_path)

    assert f"  DB_URL: (none) -> {SHOWN} (instance 0)\n" in as_text.stdout
    assert SHOWN in as_json.stdout
    assert SECRET not in as_text.stdout + as_json.stdout


def test_events_and_ps_mask_the_password(tmp_path: Path) -> None:
    """Nothing of a failed, restarted run (events.jsonl, --events, the report on stderr) holds the password; ps shows u:****@."""
    done = poprun("--events", "events.jsonl", "--max-restarts", "1", "--pre-restart", f"true {URL}", PY, "-c",
                  "import sys; sys.exit(3)", URL, cwd=tmp_path)
    (run,) = (tmp_path / "runs").iterdir()
    ps = poprun("ps", cwd=tmp_path)

    assert 3 == done.returncode, done.stderr
    for text in ((run / "events.jsonl").read_text(), (tmp_path / "events.jsonl").read_text(), ps.stdout, done.stderr):
        assert SECRET not in text
    assert SHOWN in ps.stdout


def test_an_event_line_masks_a_url_password_in_any_field() -> None:
    """Events are for people and log collectors: a reason quoting a URL shows its password masked."""
    from poprun.core.events import AttemptEnded
    from poprun.runs.record import event_line

    line = event_line(AttemptEnded(attempt=0, status=3, reason=f"pre-restart 'curl {URL}' failed"), 0.0)

    assert f"pre-restart 'curl {SHOWN}' failed" in json.loads(line)["reason"]


def test_a_diagnostic_masks_the_password_and_keeps_its_caret_in_place(tmp_path: Path) -> None:
    """The command line a diagnostic quotes hides the password, one * per character, so the caret stays under '-q'."""
    done = poprun("plan", f"--mpi-local-args=-x DB_URL={URL}", "-q", "python3", "x.py", cwd=tmp_path)

    assert 2 == done.returncode
    assert SECRET not in done.stderr
    lines = done.stderr.splitlines()
    quoted = next(line for line in lines if "poprun plan" in line)
    caret = lines[lines.index(quoted) + 1]
    assert "postgres://u:********@db.example/app" in quoted
    assert quoted.index(" -q ") + 1 == caret.index("^")


def test_a_secret_looking_assignment_is_masked_in_a_diagnostic_and_in_explain(tmp_path: Path) -> None:
    """'-x API_TOKEN=abc123' quoted by a PR101 diagnostic, and a program's --password=hunter2 in explain, are masked."""
    refused = poprun("plan", "--mpi-local-args=-x API_TOKEN=abc123", "-q", "python3", "x.py", cwd=tmp_path)
    explained = poprun("plan", "--explain", "python3", "x.py", "--password=hunter2", cwd=tmp_path)

    assert 2 == refused.returncode
    assert "abc123" not in refused.stderr
    assert "-x API_TOKEN=******' -q" in refused.stderr
    assert 0 == explained.returncode
    assert "hunter2" not in explained.stdout
    assert "program: python3 x.py --password=****\n" in explained.stdout
