"""
Bytes that are not UTF-8 (a Latin-1 file name) in argv, the working directory or a variable's value.

The program gets the exact bytes, from the command line and from the saved plan; every record
stays UTF-8 JSON (plan.json keeps them as ``{"$bytes": BASE64}``); text shows them as ``\\xe9``.
"""

from __future__ import annotations

import base64
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

PY = sys.executable
LATIN1 = os.fsdecode(b"caf\xe9.txt")  # as Python reads the byte 0xe9 from argv: U+DCE9
# Prints its first argument, its working directory and $F as bytes.
SHOW = "import os, sys; print(os.fsencode(sys.argv[1]), os.fsencode(os.getcwd()), os.environb.get(b'F'))"


def poprun(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([PY, "-m", "poprun.cli.main", *args], cwd=cwd, capture_output=True, timeout=60,
                          env=os.environ | {"POPRUN_RUNS_DIR": str(cwd / "runs")} | (env or {}), check=False,
                          stdin=subprocess.DEVNULL)


def test_a_latin1_argument_runs_exactly_and_its_record_stays_utf8(tmp_path: Path) -> None:
    """The run ends 0, its records are UTF-8 JSON, ps shows it ended, and plan/apply of its plan.json run the same bytes."""
    # GIVEN a run of a program given a Latin-1 file name
    done = poprun(PY, "-c", SHOW, LATIN1, cwd=tmp_path)
    assert (0, b"") == (done.returncode, done.stderr), done.stderr
    expected = f"b'caf\\xe9.txt' {os.fsencode(tmp_path)!r} None\n".encode()
    assert expected == done.stdout
    (run,) = (tmp_path / "runs").iterdir()

    # THEN every record is UTF-8 JSON, and the plan holds the bytes
    plan = json.loads((run / "plan.json").read_bytes().decode("utf-8"))
    assert {"$bytes": base64.b64encode(b"caf\xe9.txt").decode()} == plan["instances"][0]["argv"][3]
    json.loads((run / "report.json").read_bytes().decode("utf-8"))
    for line in (run / "events.jsonl").read_bytes().decode("utf-8").splitlines():
        json.loads(line)

    # AND ps, report, plan and apply of the record read it
    ps = poprun("ps", cwd=tmp_path)
    shown = poprun("plan", str(run / "plan.json"), cwd=tmp_path)
    again = poprun("apply", str(run / "plan.json"), cwd=tmp_path)
    report = poprun("report", run.name, cwd=tmp_path)

    assert f"{run.name}  ended 0".encode() in ps.stdout, ps.stdout
    assert b"$'caf\\xe9.txt'\n" in ps.stdout
    assert (0, b"") == (shown.returncode, shown.stderr)
    assert f"program: {shlex.join([PY, '-c', SHOW])} $'caf\\xe9.txt'\n".encode() in shown.stdout
    assert (0, expected) == (again.returncode, again.stdout), again.stderr
    assert b"$'caf\\xe9.txt'" in report.stdout
    for text in (ps.stdout, shown.stdout, report.stdout):
        text.decode("utf-8")


def test_a_latin1_working_directory_and_value_reach_the_program_from_a_saved_plan(tmp_path: Path) -> None:
    """cwd and -x F=VALUE holding 0xe9 are planned, saved, explained escaped and applied with the exact bytes."""
    where = tmp_path / os.fsdecode(b"d\xe9j\xe0")
    where.mkdir()
    made = poprun("plan", "--format", "json", "-o", "plan.json", f"--mpi-local-args=-x F={LATIN1}", PY, "-c", SHOW,
                  "x", cwd=where)
    assert (0, b"") == (made.returncode, made.stderr)
    (where / "plan.json").read_bytes().decode("utf-8")

    explained = poprun("plan", "--explain", "plan.json", cwd=where, env={"PYTHONIOENCODING": "utf-8:strict"})
    applied = poprun("apply", "plan.json", cwd=where)

    assert 0 == explained.returncode, explained.stderr
    assert b"  F=caf\\xe9.txt\n" in explained.stdout
    assert b"working directory: " + os.fsencode(tmp_path) + b"/d\\xe9j\\xe0\n" in explained.stdout
    explained.stdout.decode("utf-8")
    assert (0, f"b'x' {os.fsencode(where)!r} b'caf\\xe9.txt'\n".encode()) == (applied.returncode, applied.stdout), \
        applied.stderr


def test_text_output_escapes_such_bytes_whatever_the_locale(tmp_path: Path) -> None:
    """plan, --explain, -vv and diff write \\xe9, never the raw byte, and never crash on a strict UTF-8 terminal."""
    strict = {"PYTHONIOENCODING": "utf-8:strict"}
    (tmp_path / "old.json").write_bytes(poprun("plan", "--format", "json", PY, "x.py", cwd=tmp_path).stdout)

    outputs = [poprun("plan", "--explain", PY, "x.py", LATIN1, cwd=tmp_path, env=strict),
               poprun("plan", "--diff", "old.json", PY, "x.py", LATIN1, cwd=tmp_path, env=strict),
               poprun("-vv", PY, "-c", "pass", LATIN1, cwd=tmp_path, env=strict)]

    assert [0, 0, 0] == [done.returncode for done in outputs], [done.stderr for done in outputs]
    for done in outputs:
        assert b"\xe9" not in done.stdout + done.stderr
        (done.stdout + done.stderr).decode("utf-8")
    assert b"python3" in outputs[0].stdout or PY.encode() in outputs[0].stdout
    assert b"caf\\xe9.txt" in outputs[1].stdout
    assert b"$'caf\\xe9.txt'" in outputs[2].stderr


@pytest.mark.parametrize(("args", "what"), [(("plan", "--format", "toml"), b"a TOML spec"),
                                            (("plan", "--format", "sbatch"), b"the sbatch view"),
                                            (("plan", "--export-config", "job.conf"), b"a TOML spec"),
                                            (("submit", "--dry-run"), b"the sbatch view")])
def test_formats_that_cannot_hold_such_bytes_refuse_them(tmp_path: Path, args: tuple[str, ...], what: bytes) -> None:
    """TOML specs and batch scripts are UTF-8 text: a value they cannot hold exactly is PR119, exit 2, nothing written."""
    done = poprun(*args, "python3", "x.py", LATIN1, cwd=tmp_path)

    assert 2 == done.returncode
    assert done.stderr.startswith(b"error[PR119]: " + what + b" cannot hold bytes that are not UTF-8\n"), done.stderr
    assert not (tmp_path / "job.conf").exists()


@pytest.mark.parametrize(("args", "code"), [(("--host", os.fsdecode(b"h\xe9")), b"PR103"),
                                            (("--mpi-local-args=-x " + os.fsdecode(b"N\xe9=1"),), b"PR105")])
def test_a_host_or_variable_name_holding_such_bytes_is_refused(tmp_path: Path, args: tuple[str, ...],
                                                               code: bytes) -> None:
    """Host and variable names are ASCII words: one holding 0xe9 is a diagnostic, exit 2, shown escaped."""
    done = poprun("plan", *args, "python3", "x.py", cwd=tmp_path)

    assert 2 == done.returncode
    assert done.stderr.startswith(b"error[" + code + b"]"), done.stderr
    assert b"\xe9" not in done.stderr


@pytest.mark.parametrize("args", [("plan", "--format", "sbatch"), ("submit", "--dry-run")])
def test_a_working_directory_with_a_newline_cannot_add_lines_to_a_batch_script(tmp_path: Path,
                                                                              args: tuple[str, ...]) -> None:
    """'#SBATCH --chdir=DIR' ends at a newline: a directory named 'a\\n#SBATCH ...\\necho hi' is PR119, no script."""
    where = tmp_path / "a\n#SBATCH --output=elsewhere.out\necho injected"
    where.mkdir()

    done = poprun(*args, "python3", "x.py", cwd=where)

    assert 2 == done.returncode
    assert done.stderr.startswith(b"error[PR119]: the sbatch view cannot hold this working directory\n"), done.stderr
    assert b"" == done.stdout


def test_a_spec_file_with_a_latin1_name_is_read_and_named_escaped(tmp_path: Path) -> None:
    """A spec called caf\\xe9.pop plans (its JSON stays UTF-8), and a diagnostic in it names the file escaped."""
    name = os.fsdecode(b"caf\xe9.pop")
    (tmp_path / name).write_text("run python3 x.py\n")
    (tmp_path / ("bad-" + name)).write_text("run python3 x.py\nbad statement\n")

    planned = poprun("plan", "--format", "json", name, cwd=tmp_path)
    refused = poprun("plan", "bad-" + name, cwd=tmp_path, env={"PYTHONIOENCODING": "utf-8:strict"})

    assert 0 == planned.returncode, planned.stderr
    sources = [d["source"] for d in json.loads(planned.stdout.decode("utf-8"))["explanation"]]
    assert [b"caf\xe9.pop:1:5"] == [base64.b64decode(s["$bytes"]) for s in sources if isinstance(s, dict)]
    assert 2 == refused.returncode
    assert b"  --> bad-caf\\xe9.pop:2:1  (statement)\n" in refused.stderr
