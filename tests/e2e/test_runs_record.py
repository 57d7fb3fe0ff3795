"""The record every launch keeps: its directory, plan, events (against the documented schema), logs and report."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest

from poprun.planner.serde import from_json, to_json

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

SCHEMA = json.loads((Path(__file__).parents[2] / "docs" / "events.schema.json").read_text())
# Instance i prints "out i k" (k < 3) on stdout and "err i" on stderr; instance 2 then exits 3, the others sleep.
CHATTY = ("import os, sys, time; i = int(os.environ['POPDIST_INSTANCE_INDEX']); "
          "[print('out', i, k, flush=True) for k in range(3)]; print('err', i, file=sys.stderr, flush=True); "
          "print('id', os.environ['POPRUN_RUN_ID'], flush=True); time.sleep(0.5 if i == 2 else 30); "
          "sys.exit(3 if i == 2 else 0)")


def poprun(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "poprun.cli.main", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=50, check=False)


def only_run(runs: Path) -> Path:
    made = [p for p in runs.iterdir() if p.is_dir()]
    assert len(made) == 1, made
    return made[0]


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_failing_run_is_recorded_as_the_foreground_saw_it(tmp_path: Path) -> None:
    """4 instances, instance 2 fails: logs per instance, events valid and streamed, report's root cause, plan.json."""
    runs = tmp_path / "runs"
    done = poprun("--events", "events.jsonl", "--num-instances", "4", "--num-replicas", "4", sys.executable, "-c",
                  CHATTY, cwd=tmp_path, env={"POPRUN_RUNS_DIR": str(runs)})
    run = only_run(runs)

    # the run's id: in the failure report, in every instance's environment, the directory's name
    assert 3 == done.returncode, done.stderr
    assert f"poprun: 4 instances failed (run {run.name})\n" in done.stderr
    assert {f"id {run.name}"} == {line for line in done.stdout.splitlines() if line.startswith("id ")}
    # each instance's output, exactly, in its own logs
    for i in range(4):
        assert f"out {i} 0\nout {i} 1\nout {i} 2\nid {run.name}\n" == (run / "logs" / f"{i}.stdout").read_text()
        assert f"err {i}\n" == (run / "logs" / f"{i}.stderr").read_text()
    # the events: every line valid against the documented schema, the same as --events streamed
    recorded, streamed = lines(run / "events.jsonl"), lines(tmp_path / "events.jsonl")
    for event in recorded + streamed:
        jsonschema.validate(event, SCHEMA)
    assert [{k: v for k, v in e.items() if k != "time"} for e in recorded] == \
        [{k: v for k, v in e.items() if k != "time"} for e in streamed]
    assert ("run-started", "run-ended") == (recorded[0]["event"], recorded[-1]["event"])
    assert {"status": 3, "root_cause": 2} == {k: recorded[-1][k] for k in ("status", "root_cause")}
    # the report: the root cause the foreground named, and the phases
    report = json.loads((run / "report.json").read_text())
    assert done.stderr.splitlines()[-1] == "Root cause: instance 2 on localhost exited with status 3"
    assert (2, 3, run.name) == (report["root_cause"], report["status"], report["run"])
    assert {"plan", "partition", "start", "run", "teardown"} == set(report["phases"])
    # the plan as applied: the format of 'poprun plan --format json', run id included; 'poprun plan' reads it
    text = (run / "plan.json").read_text()
    plan = from_json(text)
    assert text == to_json(plan)
    assert {run.name} == {i.env.get("POPRUN_RUN_ID") for i in plan.instances}
    assert 0 == poprun("plan", str(run / "plan.json"), cwd=tmp_path).returncode
    assert oct((run).stat().st_mode & 0o777) == "0o700"


def test_a_chatty_instance_is_cut_at_the_limit_and_the_cut_is_recorded(tmp_path: Path) -> None:
    """POPRUN_RUN_LOG_LIMIT: whole lines up to the limit are kept, the rest counted; the terminal gets everything."""
    runs = tmp_path / "runs"
    done = poprun("--num-instances", "1", "--num-replicas", "1", sys.executable, "-c",
                  "import sys; [sys.stdout.write('%05d\\n' % k) for k in range(1000)]", cwd=tmp_path,
                  env={"POPRUN_RUNS_DIR": str(runs), "POPRUN_RUN_LOG_LIMIT": "1000"})
    run = only_run(runs)
    kept = (run / "logs" / "0.stdout").read_text()

    assert (0, 1000) == (done.returncode, len(done.stdout.splitlines()))
    assert kept == "".join(f"{k:05d}\n" for k in range(166))  # 166 whole lines of 6 bytes: 996 bytes
    assert {"0": {"kept": 996, "dropped": 6000 - 996}} == json.loads((run / "report.json").read_text())["truncated"]
    assert [{"index": 0, "kept": 996}] == [{k: e[k] for k in ("index", "kept")} for e in lines(run / "events.jsonl")
                                            if e["event"] == "instance-output-truncated"]


@pytest.mark.parametrize("kind", ["file", "symlink"])
def test_a_record_that_cannot_be_made_is_a_warning_and_the_run_goes_on(tmp_path: Path, kind: str) -> None:
    """POPRUN_RUNS_DIR is a file, or a link: one warning, the instances run, nothing is written there."""
    target = tmp_path / "elsewhere"
    target.mkdir()
    runs = tmp_path / "runs"
    if kind == "file":
        runs.write_text("not a directory")
    else:
        runs.symlink_to(target)
    done = poprun("--num-instances", "2", "--num-replicas", "2", "echo", "ran", cwd=tmp_path,
                  env={"POPRUN_RUNS_DIR": str(runs)})

    assert (0, "ran\nran\n") == (done.returncode, done.stdout)
    assert done.stderr.startswith("poprun: warning: ") and done.stderr.endswith(": this run is not recorded\n")
    assert [] == list(target.iterdir())


def test_a_full_disk_stops_the_record_not_the_run(tmp_path: Path) -> None:
    """The runs directory on a 64 KiB file system: the record stops with one warning; the output is all there."""
    runs = tmp_path / "runs"
    runs.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(runs)], check=False).returncode:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        done = poprun("--num-instances", "2", "--num-replicas", "2", sys.executable, "-c",
                      "import sys; [sys.stdout.write('x' * 99 + '\\n') for _ in range(2000)]", cwd=tmp_path,
                      env={"POPRUN_RUNS_DIR": str(runs)})
    finally:
        subprocess.run(["umount", "-l", str(runs)], check=False)

    assert (0, 4000) == (done.returncode, len(done.stdout.splitlines())), done.stderr
    assert done.stderr.startswith("poprun: warning: cannot write the run record "), done.stderr
    assert done.stderr.endswith(" (No space left on device): it stops here, incomplete; its report.json keeps how "
                                "the run ended\n") and done.stderr.count("\n") == 1


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """Return a 64 KiB file system (a tmpfs) to keep runs on, unmounted after."""
    runs = tmp_path / "small"
    runs.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(runs)], check=False).returncode:
        pytest.skip("cannot mount a small tmpfs here")
    yield runs
    subprocess.run(["umount", "-l", str(runs)], check=False)


@pytest.mark.parametrize("status", [0, 3])
def test_a_record_cut_by_a_full_disk_keeps_the_exit_status_and_says_it_is_incomplete(tmp_path: Path,
                                                                                     small_disk: Path,
                                                                                     status: int) -> None:
    """The disk fills up: the launch exits with the program's status; ps, report and logs say 'record incomplete'."""
    # GIVEN
    env = {"POPRUN_RUNS_DIR": str(small_disk)}
    program = f"import sys; [sys.stdout.write('x' * 99 + '\\n') for _ in range(2000)]; sys.exit({status})"

    # WHEN
    done = poprun("--num-instances", "2", "--num-replicas", "2", sys.executable, "-c", program, cwd=tmp_path,
                  env=env)
    listed = poprun("ps", "--json", cwd=tmp_path, env=env)
    table = poprun("ps", cwd=tmp_path, env=env)
    report = poprun("report", "last", cwd=tmp_path, env=env)
    logs = poprun("logs", "last", "--instance", "1", cwd=tmp_path, env=env)

    # THEN the launch: its program's status, and one warning about the record
    assert status == done.returncode
    assert 4000 == len(done.stdout.splitlines()) or status  # (a failure stops the other instance)
    assert 1 == done.stderr.count("poprun: warning: cannot write the run record ")
    # ps: ended with that status, and why the record is incomplete
    row = json.loads(listed.stdout)[0]
    assert ("ended", status, "No space left on device", None, 2) == (row["state"], row["status"], row["incomplete"],
                                                                     row["problem"], row["instances"])
    assert f" ended {status}, record incomplete " in table.stdout.splitlines()[1]
    # report and logs: said, never a diagnostic
    assert (0, "") == (report.returncode, report.stderr)
    assert report.stdout.splitlines()[0].endswith(f": ended with status {status}")
    assert report.stdout.splitlines()[2].startswith("record incomplete (No space left on device): ")
    assert 0 == logs.returncode
    assert set(logs.stdout.splitlines()) <= {"x" * 99}
    assert logs.stderr.startswith("poprun: record incomplete (No space left on device): ")
    # every file whole: each event a line of JSON, the report valid
    run = only_run(small_disk)
    assert all(isinstance(e, dict) for e in lines(run / "events.jsonl"))
    assert not (run / ".reserve").exists()


def test_a_record_that_cannot_be_made_on_a_full_disk_leaves_nothing(tmp_path: Path, small_disk: Path) -> None:
    """The runs directory is full before the launch: one warning, the run goes on, no half-made run is left."""
    # GIVEN
    env = {"POPRUN_RUNS_DIR": str(small_disk)}
    fd = os.open(small_disk / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    with contextlib.suppress(OSError):
        while os.write(fd, b"x" * 4096):
            pass
    os.close(fd)

    # WHEN
    done = poprun("--num-instances", "2", "--num-replicas", "2", "echo", "ran", cwd=tmp_path, env=env)
    listed = poprun("ps", "--all", "--json", cwd=tmp_path, env=env)

    # THEN
    assert (0, "ran\nran\n") == (done.returncode, done.stdout)
    assert done.stderr.startswith("poprun: warning: cannot write the run record in ")
    assert done.stderr.endswith(": No space left on device: this run is not recorded\n")
    assert ([], ["filler"]) == (json.loads(listed.stdout), [p.name for p in small_disk.iterdir()])


def test_a_detached_run_whose_supervisor_cannot_be_recorded_is_not_started(tmp_path: Path) -> None:
    """A disk with room for the record but not one page more: --detach says why, exits 125, the report keeps it."""
    # GIVEN 20 KiB: the supervisor's page and the report's room, nothing for the detached supervisor's own line
    runs = tmp_path / "tiny"
    runs.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=20k", "tmpfs", str(runs)], check=False).returncode:
        pytest.skip("cannot mount a small tmpfs here")
    try:
        env = {"POPRUN_RUNS_DIR": str(runs)}

        # WHEN
        done = poprun("--detach", "--num-instances", "2", "--num-replicas", "2", "sleep", "30", cwd=tmp_path, env=env)
        listed = poprun("ps", "--json", cwd=tmp_path, env=env)
    finally:
        subprocess.run(["umount", "-l", str(runs)], check=False)

    # THEN
    assert (125, "") == (done.returncode, done.stdout)
    assert done.stderr.startswith("poprun: cannot record the supervisor of run ")
    assert done.stderr.endswith(" (No space left on device): a detached run that could not be found again is not "
                                "started\n")
    assert [("ended", 125)] == [(r["state"], r["status"]) for r in json.loads(listed.stdout)]


def test_old_runs_are_pruned_but_never_what_poprun_did_not_make(tmp_path: Path) -> None:
    """POPRUN_RUNS_KEEP=2: the two newest runs stay; a folder without poprun's mark and a link are left alone."""
    runs = tmp_path / "runs"
    runs.mkdir(mode=0o700)
    (runs / "0-mine").mkdir()
    (runs / "0-mine" / "data").write_text("keep me")
    (runs / "0-link").symlink_to(tmp_path)
    for _ in range(4):
        assert 0 == poprun("--num-instances", "1", "--num-replicas", "1", "true", cwd=tmp_path,
                           env={"POPRUN_RUNS_DIR": str(runs), "POPRUN_RUNS_KEEP": "2"}).returncode

    recorded = sorted(p.name for p in runs.iterdir() if (p / ".poprun-run").exists() and not p.is_symlink())
    assert 2 == len(recorded)
    assert ("keep me", True) == ((runs / "0-mine" / "data").read_text(), (runs / "0-link").is_symlink())


@pytest.mark.parametrize("keep", ["ten", "²", "-1"])
def test_a_runs_keep_that_is_no_number_is_one_warning_and_the_default(tmp_path: Path, keep: str) -> None:
    """POPRUN_RUNS_KEEP that is no whole number (other digits included): one warning, 100 kept, the run goes on."""
    done = poprun("--num-instances", "2", "--num-replicas", "2", "echo", "ran", cwd=tmp_path,
                  env={"POPRUN_RUNS_DIR": str(tmp_path / "runs"), "POPRUN_RUNS_KEEP": keep})

    assert (0, "ran\nran\n") == (done.returncode, done.stdout)
    assert f"poprun: warning: POPRUN_RUNS_KEEP is {keep!r}, not a whole number: 100 is used\n" == done.stderr


def test_poprun_record_0_keeps_nothing(tmp_path: Path) -> None:
    """POPRUN_RECORD=0: no directory, no POPRUN_RUN_ID, no run id in the failure report."""
    runs = tmp_path / "runs"
    done = poprun("--num-instances", "1", "--num-replicas", "1", "sh", "-c", 'echo "[$POPRUN_RUN_ID]"; exit 3',
                  cwd=tmp_path, env={"POPRUN_RUNS_DIR": str(runs), "POPRUN_RECORD": "0"})

    assert (3, "[]\n", False) == (done.returncode, done.stdout, runs.exists())
    assert "poprun: 1 instance failed\n" in done.stderr


def test_the_schema_documents_every_kind_and_field() -> None:
    """docs/events.schema.json has one variant per event kind, with exactly its fields (plus v, event, time)."""
    from poprun.core import events
    from poprun.core.record import fields

    documented = {v["properties"]["event"]["const"]: set(v["properties"]) for v in SCHEMA["oneOf"]}
    actual = {kind: {"v", "event", "time"} | {f.name for f in fields(cls)} for kind, cls in events._KINDS.items()}
    assert actual == documented


def test_actual_json_verifies_each_instance_against_the_plan(tmp_path: Path) -> None:
    """Instances bound by --numa-aware: argv, the plan's variables and the CPUs read back, all as planned, digested."""
    runs = tmp_path / "runs"
    done = poprun("--num-instances", "2", "--num-replicas", "2", "--numa-aware", "yes", "--mpi-global-args=-x FROM_PLAN=1",
                  "sleep", "0.3", cwd=tmp_path, env={"POPRUN_RUNS_DIR": str(runs)})
    actual = json.loads((only_run(runs) / "actual.json").read_text())["instances"]

    assert 0 == done.returncode, done.stderr
    for index in ("0", "1"):
        seen = actual[index]
        assert (True, True, True, True, []) == (seen["verified"], seen["argv_as_planned"], seen["env_as_planned"],
                                                 seen["cpus_as_planned"], seen["env_differs"]), seen
        assert 64 == len(seen["argv_blake2b"]) == len(seen["env_blake2b"])
    assert actual["0"]["argv_blake2b"] == actual["1"]["argv_blake2b"] != actual["0"]["env_blake2b"]


def test_a_process_that_is_not_what_the_plan_says_is_told_apart(tmp_path: Path) -> None:
    """observe() on a process started with another argv and a changed variable names the difference (not the value)."""
    from poprun.runs.verify import observe
    from tests.e2e.helpers import plan_of

    instance = plan_of("--num-instances", "1", "--num-replicas", "1", "--mpi-global-args=-x SECRET_TOKEN=planned",
                       "sleep", "5").instances[0]
    env = {**os.environ, **dict(instance.env.set), "SECRET_TOKEN": "changed"}
    proc = subprocess.Popen(["sleep", "6"], env=env)
    try:
        seen = observe(instance, proc.pid, os.environ)
    finally:
        proc.kill()
        proc.wait()

    assert (True, False, False, ["SECRET_TOKEN"]) == (seen["verified"], seen["argv_as_planned"],
                                                       seen["env_as_planned"], seen["env_differs"])
    assert "changed" not in json.dumps({k: v for k, v in seen.items() if not k.startswith("_")})


def test_report_tells_plan_against_actual(tmp_path: Path) -> None:
    """'poprun report' says every instance ran as planned; an actual.json that says otherwise is shown by name."""
    runs = tmp_path / "runs"
    env = {"POPRUN_RUNS_DIR": str(runs)}
    assert 0 == poprun("--num-instances", "2", "--num-replicas", "2", "sleep", "0.2", cwd=tmp_path, env=env).returncode
    assert "verified: 2 of 2 instances as planned (argv, environment, CPUs)\n" in \
        poprun("report", "last", cwd=tmp_path, env=env).stdout
    actual = only_run(runs) / "actual.json"
    data = json.loads(actual.read_text())
    data["instances"]["1"].update(env_as_planned=False, env_differs=["MY_TOKEN"])
    data["instances"]["0"] = {"host": "h9", "pid": 1, "verified": False}
    actual.write_text(json.dumps(data))

    told = poprun("report", "last", cwd=tmp_path, env=env).stdout

    assert ("verified: 0 of 2 instances as planned (argv, environment, CPUs); 1 not read back (on other hosts, or "
            "ended before they could be)\n  instance 1 on localhost: environment not as planned (MY_TOKEN)\n") in told


def test_a_sink_that_raises_still_leaves_a_finished_record(tmp_path: Path) -> None:
    """apply() with a record and a sink that raises at an instance's start: it raises, the run is reported ended (125)."""
    from poprun.apply import apply
    from poprun.backends.conformance import MemorySink, probe_plan
    from poprun.runs.record import RunRecord

    class Raising(MemorySink):
        def event(self, event: object) -> None:
            if type(event).__name__ == "InstanceStarted":
                msg = "the sink broke"
                raise RuntimeError(msg)

    record = RunRecord.create({"POPRUN_RUNS_DIR": str(tmp_path / "runs")})
    with pytest.raises(RuntimeError, match="the sink broke"):
        apply(probe_plan("pass", tmp_path, backend="local"), sink=Raising(), env_source=dict(os.environ), record=record)

    report = json.loads((Path(record.path) / "report.json").read_text())
    assert (125, "poprun ended by RuntimeError: the sink broke") == (report["status"], report["error"]["message"])


def test_removing_a_run_follows_no_link_not_even_a_swapped_top(tmp_path: Path) -> None:
    """A pruned run's links are removed as links; a run directory swapped for a link removes nothing behind it."""
    from poprun.runs.record import _remove_tree

    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("keep me")
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "logs" / "0.stdout").write_text("old\n")
    (run / "to-dir").symlink_to(outside)
    (run / "to-file").symlink_to(outside / "keep")
    swapped = tmp_path / "swapped"
    swapped.symlink_to(outside)

    _remove_tree(str(run))
    _remove_tree(str(swapped))

    assert (False, "keep me", ["keep"]) == (run.exists(), (outside / "keep").read_text(),
                                            [p.name for p in outside.iterdir()])


def test_a_report_too_large_for_the_room_left_is_kept_short(tmp_path: Path, small_disk: Path) -> None:
    """A full disk and the report of 5,000 failed instances: its short form (status, root cause) is still written."""
    from poprun.core.events import Teardown
    from poprun.runs.record import RunRecord

    # GIVEN a record, then a full disk
    record = RunRecord.create({"POPRUN_RUNS_DIR": str(small_disk)})
    fd = os.open(small_disk / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    with contextlib.suppress(OSError):
        while os.write(fd, b"x" * 4096):
            pass
    os.close(fd)
    failures = [{"index": i, "host": "localhost", "pid": 100 + i, "exit_code": 3 if i == 4321 else None,
                 "signal": None if i == 4321 else 15, "stopped": i != 4321, "lost": False, "via": "",
                 "tail": [f"line {k} of instance {i}" for k in range(10)]} for i in range(5000)]
    report = {"v": 1, "run": record.id, "status": 3, "started": record.started, "ended": record.started + 1,
              "statuses": [143] * 5000, "root_cause": 4321, "failures": failures, "signals": [], "error": None,
              "phases": {"run": 1.0}, "truncated": {}}

    # WHEN
    record.event(Teardown())
    record.instance_lines(0, "stdout", b"y" * 100_000 + b"\n")
    record.finish(report)
    shown = poprun("report", record.id, cwd=tmp_path, env={"POPRUN_RUNS_DIR": str(small_disk)})

    # THEN
    assert (True, "No space left on device") == (record.reported, record.incomplete)
    assert (0, "") == (shown.returncode, shown.stderr)
    assert f"run {record.id}: ended with status 3\n" in shown.stdout
    assert "Root cause: instance 4321 on localhost exited with status 3\n" in shown.stdout
    assert "record incomplete (No space left on device)" in shown.stdout
    assert os.path.getsize(Path(record.path) / "report.json") <= 16 << 10
