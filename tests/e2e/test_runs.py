"""
``poprun ps``, ``logs`` and ``report`` over the records real launches leave, and over hostile records.

Every test keeps its runs in a folder of its own (``POPRUN_RUNS_DIR``), so that ``last`` is its own run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import Marked
from tests.e2e.test_lifecycle import READY, await_ready, finish

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

PY = sys.executable


def runs_env(marked: Marked, tmp_path: Path) -> dict[str, str]:
    """Return the marked environment with the test's own runs folder."""
    return marked.env | {"POPRUN_RUNS_DIR": str(tmp_path / "runs")}


def poprun(env: dict[str, str], *args: str, timeout: float = 20) -> subprocess.CompletedProcess[str]:
    """Run ``poprun ARGS`` to its end; return it (stdout and stderr as text)."""
    return subprocess.run([PY, "-m", "poprun.cli.main", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def launch(env: dict[str, str], script: str, *, instances: int = 4) -> subprocess.CompletedProcess[str]:
    """Run ``poprun sh -c SCRIPT`` with ``instances`` instances in the foreground."""
    return poprun(env, "--num-instances", str(instances), "--num-replicas", str(instances), "sh", "-c", script)


def test_report_of_a_failing_4_instance_run_repeats_the_foreground_failure_report(tmp_path: Path,
                                                                                     marked: Marked) -> None:
    """``poprun report last`` shows the failure report the foreground printed, root cause first, and the phases."""
    # GIVEN
    env = runs_env(marked, tmp_path)
    foreground = launch(env, 'echo "working $POPDIST_INSTANCE_INDEX"; '
                             'if [ "$POPDIST_INSTANCE_INDEX" = 2 ]; then echo "disk full"; exit 3; fi; sleep 30')

    # WHEN
    report = poprun(env, "report", "last")

    # THEN
    assert 3 == foreground.returncode
    assert foreground.stderr.splitlines()[-1] == "Root cause: instance 2 on localhost exited with status 3"
    assert (0, "") == (report.returncode, report.stderr)
    assert foreground.stderr in report.stdout
    assert report.stdout.startswith("run 2")
    assert "ended with status 3\n" in report.stdout.splitlines()[0] + "\n"
    assert "phases: plan " in report.stdout


def test_report_json_is_the_record_of_how_it_ended(tmp_path: Path, marked: Marked) -> None:
    """``poprun report RUN --json`` prints report.json: the status, the root cause, each failed instance."""
    env = runs_env(marked, tmp_path)
    launch(env, '[ "$POPDIST_INSTANCE_INDEX" = 1 ] && exit 5; sleep 30', instances=2)

    data = json.loads(poprun(env, "report", "last", "--json").stdout)

    assert (5, 1, [1, 0]) == (data["status"], data["root_cause"], [f["index"] for f in data["failures"]])


SCRIPT = ('i=$POPDIST_INSTANCE_INDEX; echo "out $i one"; echo "err $i one" >&2; printf "out %s two\\n" $i; '
          'echo "err $i two" >&2; printf "no newline $i"')


def test_logs_of_one_instance_are_exactly_what_it_printed(tmp_path: Path, marked: Marked) -> None:
    """``poprun logs last --instance 2``: instance 2's stdout on stdout and its stderr on stderr, byte for byte."""
    env = runs_env(marked, tmp_path)
    launch(env, SCRIPT)

    shown = poprun(env, "logs", "last", "--instance", "2")

    assert (0, "out 2 one\nout 2 two\nno newline 2\n", "err 2 one\nerr 2 two\n") == (
        shown.returncode, shown.stdout, shown.stderr)


def test_logs_tag_and_tail(tmp_path: Path, marked: Marked) -> None:
    """``--tag`` prefixes every line as mpirun's --tag-output does; ``--tail N`` keeps the last N lines."""
    env = runs_env(marked, tmp_path)
    launch(env, SCRIPT, instances=2)

    tagged = poprun(env, "logs", "last", "--instance", "1", "--tag")
    tail = poprun(env, "logs", "last", "--instance", "0", "--tail", "2")

    assert "[1,1]<stdout>:out 1 one\n[1,1]<stdout>:out 1 two\n[1,1]<stdout>:no newline 1\n" == tagged.stdout
    assert "[1,1]<stderr>:err 1 one\n[1,1]<stderr>:err 1 two\n" == tagged.stderr
    assert ("no newline 0\n", "err 0 two\n") == (tail.stdout, tail.stderr)


def test_logs_merge_the_instances_in_the_order_their_lines_arrived(tmp_path: Path, marked: Marked) -> None:
    """Instances that print one after the other, 3 first and 0 last, are merged 3, 2, 1, 0 (not by instance)."""
    # GIVEN each instance waits for the one after it to have printed
    env = runs_env(marked, tmp_path)
    turns = tmp_path / "turns"
    turns.mkdir()
    script = (f'i=$POPDIST_INSTANCE_INDEX; next=$((i + 1)); if [ $i -lt 3 ]; then while [ ! -e {turns}/$next ]; do '
              f'sleep 0.01; done; fi; echo "line of $i"; sleep 0.1; touch {turns}/$i')

    # WHEN
    launch(env, script)
    merged = poprun(env, "logs", "last")
    last_two = poprun(env, "logs", "last", "--tail", "2")

    # THEN
    assert "line of 3\nline of 2\nline of 1\nline of 0\n" == merged.stdout
    assert "line of 1\nline of 0\n" == last_two.stdout


def test_last_and_unique_prefixes_name_runs_and_ambiguity_is_one_diagnostic(tmp_path: Path, marked: Marked) -> None:
    """``last`` is the newest run; a unique prefix names its run; a shared prefix or an unknown id exits 2, listing runs."""
    # GIVEN two runs
    env = runs_env(marked, tmp_path)
    launch(env, "echo first", instances=1)
    launch(env, "echo second", instances=1)
    ids = [r["id"] for r in reversed(json.loads(poprun(env, "ps", "--json").stdout))]  # oldest first
    unique = next(ids[1][:n] for n in range(1, len(ids[1]) + 1) if not ids[0].startswith(ids[1][:n]))

    # WHEN
    last, by_prefix, shared, unknown = (poprun(env, "logs", "last"), poprun(env, "logs", unique),
                                        poprun(env, "logs", "20"), poprun(env, "logs", "zz"))

    # THEN
    assert ("second\n", "second\n") == (last.stdout, by_prefix.stdout)
    assert (2, 2) == (shared.returncode, unknown.returncode)
    assert "error[PR601]: ambiguous run '20'" in shared.stderr
    assert all(i in shared.stderr for i in ids)
    assert "error[PR600]: no such run 'zz'" in unknown.stderr
    assert ids[1] in unknown.stderr


def test_ps_lists_runs_newest_first_and_a_sigkilled_supervisor_as_lost(tmp_path: Path, marked: Marked) -> None:
    """kill -9 of poprun mid-run: its watchdog ends every instance, and ``poprun ps`` says the run was lost."""
    # GIVEN an ended run, then one whose poprun is SIGKILLed
    env = runs_env(marked, tmp_path)
    launch(env, "exit 4", instances=1)
    proc = subprocess.Popen([PY, "-m", "poprun.cli.main", "--num-instances", "2", "--num-replicas", "2", "sh", "-c",
                             f"{READY}; sleep 60"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    await_ready(proc, 2)
    running = json.loads(poprun(env, "ps", "--json").stdout)

    # WHEN
    proc.send_signal(signal.SIGKILL)
    finish(proc)
    listed = poprun(env, "ps")
    rows = json.loads(poprun(env, "ps", "--json").stdout)
    stop = poprun(env, "stop", "last")

    # THEN
    assert {} == marked.survivors(within_s=3.0)
    assert ["running", "ended"] == [r["state"] for r in running]
    assert [("lost", None, 2), ("ended", 4, 1)] == [(r["state"], r["status"], r["instances"]) for r in rows]
    assert listed.stdout.splitlines()[0].split() == ["RUN", "STATE", "STARTED", "DURATION", "INSTANCES", "HOSTS",
                                                     "PROGRAM"]
    assert " lost " in listed.stdout.splitlines()[1]
    assert " ended 4 " in listed.stdout.splitlines()[2]
    assert (1, "error[PR603]: run is not running") == (stop.returncode, stop.stderr.splitlines()[0])


def test_ps_shows_the_last_ten_ended_runs_unless_all(tmp_path: Path, marked: Marked) -> None:
    """Without --all, ``ps`` lists running runs and the ten newest ended ones."""
    env = runs_env(marked, tmp_path)
    root = tmp_path / "runs"
    launch(env, "true", instances=1)
    made = next(root.iterdir())
    for n in range(11):  # copies of the record, as older runs
        copy = root / f"20000101-0000{n:02d}-abcdef"
        copy.mkdir(mode=0o700)
        for name in (".poprun-run", "supervisor", "plan.json", "report.json", "events.jsonl"):
            (copy / name).write_bytes((made / name).read_bytes())

    assert (11, 13) == (len(poprun(env, "ps").stdout.splitlines()), len(poprun(env, "ps", "--all").stdout.splitlines()))


# ---------------------------------------------------------------- hostile records


def _a_run(env: dict[str, str], tmp_path: Path) -> Path:
    launch(env, "echo hello; echo oops >&2; exit 1", instances=2)
    return next((tmp_path / "runs").iterdir())


def _fifo(path: Path) -> None:
    path.unlink()
    os.mkfifo(path)


def _symlink(path: Path) -> None:
    path.unlink()
    path.symlink_to("/etc/passwd")


def _huge(path: Path) -> None:
    with path.open("wb") as file:
        file.truncate(100 << 20)  # sparse: 100 MiB of NUL


HOSTILE = {
    "report.json is not JSON": ("report.json", lambda p: p.write_text('{"status": 3,'), "report", "not JSON"),
    "report.json has the wrong shape": ("report.json", lambda p: p.write_text('{"status": "3", "failures": 7}'),
                                        "report", "$.status is missing or of the wrong type"),
    "report.json is a list": ("report.json", lambda p: p.write_text("[1, 2]"), "report", "a JSON list"),
    "report.json nests 100000 deep": ("report.json", lambda p: p.write_text("[" * 100_000 + "]" * 100_000), "report",
                                      "nested too deeply"),
    "report.json is huge": ("report.json", _huge, "report", "larger than 64 MiB"),
    "report.json is a FIFO": ("report.json", _fifo, "report", "not a regular file"),
    "report.json is a symlink": ("report.json", _symlink, "report", "a symbolic link"),
    "logs/order is garbage": ("logs/order", lambda p: p.write_text("0 stdout 6\nrm -rf /\n"), "logs",
                              "line 2 is not 'INDEX STREAM BYTES'"),
    "logs/order claims more": ("logs/order", lambda p: p.write_text("0 stdout 999999999999\n"), "logs",
                               "shorter than logs/order says"),
    "an instance's log is a FIFO": ("logs/0.stdout", _fifo, "logs", "not a regular file"),
    "supervisor is garbage": ("supervisor", lambda p: p.write_text("\x1b[2J 7\n"), "stop", "not 'PID START HOST'"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_record_is_one_diagnostic_never_a_traceback_or_a_hang(tmp_path: Path, marked: Marked,
                                                                          case: str) -> None:
    """A record file that is not what poprun writes: PR602 naming it, exit 2; ``ps`` still lists the other runs."""
    # GIVEN
    env = runs_env(marked, tmp_path)
    path = _a_run(env, tmp_path)
    name, spoil, command, why = HOSTILE[case]
    if name == "supervisor":
        (path / "report.json").unlink()
    spoil(path / name)

    # WHEN
    shown = poprun(env, command, "last", timeout=10)
    listed = poprun(env, "ps", "--all", timeout=10)

    # THEN
    assert (2, "error[PR602]: run record unreadable") == (shown.returncode, shown.stderr.splitlines()[0])
    assert why in shown.stderr
    assert "Traceback" not in shown.stderr + listed.stderr
    assert 0 == listed.returncode


def test_a_run_directory_of_another_user_is_not_a_run(tmp_path: Path, marked: Marked) -> None:
    """A run directory that belongs to another user is not poprun's: neither listed nor shown."""
    if os.geteuid() != 0:
        pytest.skip("making a directory of another user needs root")
    env = runs_env(marked, tmp_path)
    path = _a_run(env, tmp_path)
    os.chown(path, 65534, 65534)

    assert (2, "error[PR600]: no such run 'last'") == (poprun(env, "report", "last").returncode,
                                                         poprun(env, "report", "last").stderr.splitlines()[0])
    assert 1 == len(poprun(env, "ps", "--all").stdout.splitlines())


def test_a_runs_directory_that_is_a_symlink_is_refused(tmp_path: Path, marked: Marked) -> None:
    """POPRUN_RUNS_DIR naming a symbolic link: one PR602 diagnostic, exit 2."""
    env = runs_env(marked, tmp_path)
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "runs").symlink_to(tmp_path / "elsewhere")

    shown = poprun(env, "ps")

    assert (2, "error[PR602]: run record unreadable") == (shown.returncode, shown.stderr.splitlines()[0])


def _report_value(key: str, value: object) -> Callable[[Path], None]:
    def spoil(path: Path) -> None:
        data = json.loads(path.read_text())
        data[key] = value
        path.write_text(json.dumps(data))
    return spoil


def _plan_hosts(*hosts: str) -> Callable[[Path], None]:
    def spoil(path: Path) -> None:
        data = json.loads(path.read_text())
        data["topology"]["hosts"] = list(hosts)
        path.write_text(json.dumps(data))
    return spoil


def _nested(path: Path) -> None:
    path.write_text("[" * 100_000)


HOSTILE_VALUES = {
    "report.json starts in the year 1e300": ("report.json", _report_value("started", 1e300)),
    "report.json ends at infinity": ("report.json", _report_value("ended", float("inf"))),
    "report.json ends at NaN": ("report.json", _report_value("ended", float("nan"))),
    "report.json's stacks name instance ²": ("report.json", _report_value("stacks", {"²": "here"})),
    "report.json's incomplete is a number": ("report.json", _report_value("incomplete", 7)),
    "report.json is nested 100,000 deep": ("report.json", _nested),
    "plan.json is nested 100,000 deep": ("plan.json", _nested),
    "events.jsonl starts nested 100,000 deep": ("events.jsonl", _nested),
    "events.jsonl starts in the year 1e300": ("events.jsonl", lambda p: p.write_text('{"time": 1e300}\n')),
    "actual.json names instance ²": ("actual.json", lambda p: p.write_text('{"instances": {"²": {"verified": true}}}')),
    "supervisor holds other digits": ("supervisor", lambda p: p.write_text(f"² 1 {os.uname().nodename}\n")),
    "plan.json names hosts that are host lists": ("plan.json", _plan_hosts("pod[1-3]", "x,y")),
    "plan.json names an empty host": ("plan.json", _plan_hosts("")),
    "plan.json names a host with an escape": ("plan.json", _plan_hosts("a\x1b[2Jb")),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_VALUES))
def test_a_hostile_value_in_a_record_is_never_a_traceback(tmp_path: Path, marked: Marked, case: str) -> None:
    """Times out of range, non-ASCII digits, JSON nested without end: ps, report and logs say so (PR602) or go on."""
    # GIVEN
    env = runs_env(marked, tmp_path)
    path = _a_run(env, tmp_path)
    name, spoil = HOSTILE_VALUES[case]
    if name == "supervisor":
        (path / "report.json").unlink()
    spoil(path / name)

    # WHEN
    shown = [poprun(env, *command, timeout=10) for command in (("ps",), ("ps", "--json"), ("report", "last"),
                                                                ("logs", "last"))]

    # THEN
    for done in shown:
        assert done.returncode in (0, 2), done.stderr
        assert "Traceback" not in done.stderr and "internal error" not in done.stderr, done.stderr
    rows = json.loads(shown[1].stdout, parse_constant=lambda word: pytest.fail(f"ps --json printed {word}"))
    assert [path.name] == [r["id"] for r in rows]
    assert "\x1b" not in shown[0].stdout + shown[2].stdout


def test_counts_beyond_64_bits_are_taken_as_everything_and_other_digits_are_refused(tmp_path: Path,
                                                                                     marked: Marked) -> None:
    """``--tail`` and ``--timeout`` of 20 or 5,000 digits mean 'no limit'; digits of another script are PR105."""
    # GIVEN a run, and one that goes on (detached)
    env = runs_env(marked, tmp_path)
    launch(env, "echo hello", instances=1)
    ended = json.loads(poprun(env, "ps", "--json").stdout)[0]["id"]
    running = poprun(env, "--detach", "--num-instances", "2", "--num-replicas", "2", "sleep", "60").stdout.strip()

    # WHEN
    tails = [poprun(env, "logs", ended, "--tail", count) for count in ("9" * 20, "9" * 5000)]
    other = poprun(env, "logs", ended, "--tail", "٣")
    stopped = poprun(env, "stop", running, "--timeout", "9" * 5000)

    # THEN
    assert [(0, "hello\n", "")] * 2 == [(t.returncode, t.stdout, t.stderr) for t in tails]
    assert (2, "error[PR105]: invalid value for --tail") == (other.returncode, other.stderr.splitlines()[0])
    assert (0, f"poprun: stopped run {running}: it ended with status 143\n") == (stopped.returncode, stopped.stderr)


def test_a_run_directory_named_with_control_characters_is_not_a_run(tmp_path: Path, marked: Marked) -> None:
    """A copy of a record under a name with an escape sequence or a byte that is not UTF-8: never listed, never shown."""
    # GIVEN
    env = runs_env(marked, tmp_path)
    path = _a_run(env, tmp_path)
    for name in (b"2026\x1b[2J", b"2026\xff"):
        shutil.copytree(path, tmp_path / "runs" / os.fsdecode(name))

    # WHEN
    listed, shown = poprun(env, "ps", "--all"), poprun(env, "report", "last")

    # THEN
    assert "\x1b" not in listed.stdout + shown.stdout
    assert [path.name] == [line.split()[0] for line in listed.stdout.splitlines()[1:]]
    assert shown.stdout.startswith(f"run {path.name}: ")
