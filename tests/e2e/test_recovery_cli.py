"""
Recovery end to end, through the real CLI and real processes: restarts, time limits, stacks, the port plan.

Each test runs ``python -m poprun.cli.main`` in a subprocess with its own runs directory and
reads what the run left: its exit status, its stderr, ``report.json`` and ``events.jsonl``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]
FAST = ("--restart-backoff", "0.05", "--min-uptime", "0")  # restarts at once, no crash-loop guard


def poprun(*args: str, cwd: Path, env: dict[str, str] | None = None,
           timeout: float = 60) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("POPDIST_", "MASTER_", "OMPI_", "POPRUN_"))}
    environ["POPRUN_RUNS_DIR"] = str(cwd / "runs")
    environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{environ.get('PATH', '')}"
    return subprocess.run([sys.executable, "-m", "poprun.cli.main", *args], cwd=cwd, capture_output=True, text=True,
                          env={**environ, **(env or {})}, timeout=timeout, check=False)


def the_run(cwd: Path) -> Path:
    made = [p for p in (cwd / "runs").iterdir() if p.is_dir() and not p.is_symlink()]
    assert len(made) == 1, made
    return made[0]


def report(cwd: Path) -> dict[str, object]:
    return json.loads((the_run(cwd) / "report.json").read_text())


def events(cwd: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (the_run(cwd) / "events.jsonl").read_text().splitlines()]


def program(tmp_path: Path, text: str, name: str = "prog.py") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


FLAKY = """
import os, sys
count = int(os.environ["POPRUN_RESTART_COUNT"])
index = os.environ["POPDIST_INSTANCE_INDEX"]
print(f"instance {index} attempt {count} port {os.environ['MASTER_PORT']}", flush=True)
sys.exit(3 if index == "1" and count == 0 else 0)
"""


def test_a_failure_on_the_first_attempt_is_restarted_and_the_run_succeeds(tmp_path: Path) -> None:
    """Instance 1 fails once: every instance starts again, status 0, two attempts in the report and in the logs."""
    done = poprun("--num-instances", "2", "--num-replicas", "2", "--max-restarts", "2", *FAST,
                  sys.executable, program(tmp_path, FLAKY), cwd=tmp_path)

    assert 0 == done.returncode, done.stderr
    assert "poprun: attempt 0 failed: instance 1 exited with 3 on localhost; restart 1 of 2 in 0.05 s" in done.stderr
    attempts = report(tmp_path)["attempts"]
    assert [(0, 3, 1), (1, 0, None)] == [(a["number"], a["status"], a["root_cause"]) for a in attempts]
    run = the_run(tmp_path)
    assert "attempt 1" in (run / "latest" / "logs" / "1.stdout").read_text()
    assert "attempt 0" in (run / "attempts" / "0" / "logs" / "1.stdout").read_text()
    kinds = [e["event"] for e in events(tmp_path)]
    assert 2 == kinds.count("attempt-started") == kinds.count("attempt-ended")
    # a new port for each attempt, recorded in the events and the report
    ports = [e["master_port"] for e in events(tmp_path) if e["event"] == "attempt-started"]
    assert ports == [a["master_port"] for a in attempts] and len(set(ports)) == 2
    # torchrun's contract: the restart count, the budget, the run id
    logs = poprun("logs", "last", cwd=tmp_path)
    assert "attempt 1" in logs.stdout


def test_torchruns_variables_are_set(tmp_path: Path) -> None:
    """GROUP_RANK and the rest, with torchrun's values for 2 instances on one host; the run id is poprun's."""
    show = ("import os; print(' '.join(f'{k}={os.environ.get(k)}' for k in ('RANK', 'GROUP_RANK', 'GROUP_WORLD_SIZE', "
            "'ROLE_RANK', 'ROLE_WORLD_SIZE', 'ROLE_NAME', 'TORCHELASTIC_RESTART_COUNT', 'TORCHELASTIC_MAX_RESTARTS', "
            "'TORCHELASTIC_RUN_ID')))")
    done = poprun("--num-instances", "2", "--num-replicas", "2", "--max-restarts", "1", "--only-output-from-instance",
                  "1", sys.executable, "-c", show, cwd=tmp_path)

    assert 0 == done.returncode, done.stderr
    run = the_run(tmp_path).name
    assert (f"RANK=1 GROUP_RANK=0 GROUP_WORLD_SIZE=1 ROLE_RANK=1 ROLE_WORLD_SIZE=2 ROLE_NAME=default "
            f"TORCHELASTIC_RESTART_COUNT=0 TORCHELASTIC_MAX_RESTARTS=1 TORCHELASTIC_RUN_ID={run}\n") == done.stdout


def test_a_crash_loop_ends_by_the_guard(tmp_path: Path) -> None:
    """A program that always fails at once: three quick failures in a row end the run, with a clear message."""
    done = poprun("--num-instances", "1", "--num-replicas", "1", "--max-restarts", "10", "--restart-backoff", "0.05",
                  "--min-uptime", "30", "--crash-loop", "3", "sh", "-c", "exit 4", cwd=tmp_path)

    assert 4 == done.returncode
    assert ("not restarted: crash loop: 3 failures in a row, each within 30 s of its start (--crash-loop 3, "
            "--min-uptime 30)") in done.stderr
    assert 3 == len(report(tmp_path)["attempts"])
    assert "poprun: 3 attempts" in done.stderr


def test_a_status_never_retried_ends_at_once(tmp_path: Path) -> None:
    """Status 2 (a usage error) is never retried by default: one attempt, and the reason."""
    done = poprun("--num-instances", "1", "--num-replicas", "1", "--max-restarts", "5", *FAST, "sh", "-c", "exit 2",
                  cwd=tmp_path)

    assert 2 == done.returncode
    assert "not restarted: status 2 is never retried (--never-retry)" in done.stderr
    assert 1 == len(report(tmp_path)["attempts"])


def test_the_budget_counts_for_the_whole_run(tmp_path: Path) -> None:
    """Different instances failing share one budget: 2 restarts, then the run ends with the last failure."""
    text = "import os, sys; sys.exit(5 if os.environ['POPDIST_INSTANCE_INDEX'] == os.environ['POPRUN_RESTART_COUNT'] else 0)"
    done = poprun("--num-instances", "4", "--num-replicas", "4", "--max-restarts", "2", *FAST, sys.executable, "-c",
                  text, cwd=tmp_path)

    assert 5 == done.returncode
    assert [0, 1, 2] == [a["root_cause"] for a in report(tmp_path)["attempts"]]
    assert "all 2 restarts of the run are used (--max-restarts)" in done.stderr


def test_the_pre_restart_command_runs_before_each_restart_and_its_failure_ends_the_run(tmp_path: Path) -> None:
    """The health check sees the restart count; when it fails, nothing starts again."""
    check = 'echo "check $POPRUN_RESTART_COUNT" >> checks.txt; [ "$POPRUN_RESTART_COUNT" -lt 2 ]'
    done = poprun("--num-instances", "1", "--num-replicas", "1", "--max-restarts", "5", *FAST, "--pre-restart", check,
                  "sh", "-c", "echo run >> runs.txt; exit 7", cwd=tmp_path)

    assert 7 == done.returncode
    assert "check 1\ncheck 2\n" == (tmp_path / "checks.txt").read_text()
    assert "run\nrun\n" == (tmp_path / "runs.txt").read_text()
    assert "the pre-restart command failed with status 1" in done.stderr


def test_instance_scope_restarts_only_the_failed_instance(tmp_path: Path) -> None:
    """--restart-scope instance: instance 1 starts again alone; instance 0 runs on, started once."""
    text = """
import os, sys, time
index, count = os.environ["POPDIST_INSTANCE_INDEX"], os.environ["POPRUN_RESTART_COUNT"]
print(f"instance {index} pid {os.getpid()} count {count}", flush=True)
if index == "1" and count == "0":
    sys.exit(9)
time.sleep(1.0 if index == "0" else 0.1)
"""
    done = poprun("--num-instances", "2", "--num-replicas", "2", "--max-restarts", "1", "--restart-scope", "instance",
                  *FAST, sys.executable, program(tmp_path, text), cwd=tmp_path)

    assert 0 == done.returncode, done.stderr
    started = [e["index"] for e in events(tmp_path) if e["event"] == "instance-started"]
    assert [0, 1, 1] == sorted(started)
    assert 1 == done.stdout.count("instance 0 pid")
    assert "instance 1 pid" in done.stdout and "count 1" in done.stdout
    assert [e for e in events(tmp_path) if e["event"] == "instance-ended" and e["restarting"]]


HANG = """
import os, time
def hang_here():
    time.sleep(600)
print("ready", flush=True)
if os.environ["POPDIST_INSTANCE_INDEX"] == "1":
    hang_here()
time.sleep(600)
"""


def _gone(pids: list[int]) -> bool:
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        return False
    return True


def test_a_stalled_run_ends_with_the_hung_instances_stack_and_nothing_left(tmp_path: Path) -> None:
    """No output for the stall timeout: status 124, instance 1's stack (hang_here) in the report, every process gone."""
    done = poprun("--num-instances", "2", "--num-replicas", "2", "--stall-timeout", "2", sys.executable,
                  program(tmp_path, HANG), cwd=tmp_path)

    assert 124 == done.returncode, done.stderr
    assert "no instance wrote output for 2 s (--stall-timeout)" in done.stderr
    data = report(tmp_path)
    assert "stall" == data["limit"]
    assert "hang_here" in data["stacks"]["1"], data["stacks"]
    assert "hang_here" in done.stderr
    pids = [e["pid"] for e in events(tmp_path) if e["event"] == "instance-started"]
    assert _gone(pids)


def test_the_timeout_ends_the_run_with_124_and_the_signal_comes_first(tmp_path: Path) -> None:
    """--signal USR1@1 with --timeout 2.5: the program hears SIGUSR1 a second before; the run ends 124."""
    text = """
import signal, time, sys
def checkpoint(*_):
    print("checkpointing", flush=True)
signal.signal(signal.SIGUSR1, checkpoint)
while True:
    time.sleep(0.05)
"""
    done = poprun("--num-instances", "1", "--num-replicas", "1", "--timeout", "2.5", "--signal", "USR1@1",
                  sys.executable, program(tmp_path, text), cwd=tmp_path)

    assert 124 == done.returncode, done.stderr
    assert "checkpointing\n" == done.stdout
    assert "the run timed out after 2.5 s (--timeout)" in done.stderr
    assert ["signal", "timeout"] == [e["limit"] for e in events(tmp_path) if e["event"] == "limit-reached"]


def test_a_busy_master_port_the_user_set_stops_the_launch_before_it_starts(tmp_path: Path) -> None:
    """-x MASTER_PORT=P with P listening here: a coded diagnostic, status 125, and the program never ran."""
    with socket.socket() as server:
        server.bind(("0.0.0.0", 0))  # noqa: S104 - any address: as a rendezvous would
        server.listen()
        port = server.getsockname()[1]
        done = poprun("--num-instances", "1", "--num-replicas", "1", f"--mpi-local-args=-x MASTER_PORT={port}", "sh", "-c",
                      "echo ran", cwd=tmp_path)

    assert (125, "") == (done.returncode, done.stdout)
    assert "PR440" in done.stderr


def test_two_runs_at_once_get_different_ports_and_both_train(tmp_path: Path) -> None:
    """The popdist.torch example twice at once on this host, MASTER_PORT left to poprun: both meet and train."""
    pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    argv = [sys.executable, "-m", "poprun.cli.main", "--num-instances", "2", "--num-replicas", "2",
            "--offline-mode=1", sys.executable, str(ROOT / "examples" / "train_digits.py"), "--steps", "5"]
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("POPDIST_", "MASTER_", "OMPI_"))}
    procs = []
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        procs.append(subprocess.Popen(argv, cwd=tmp_path / name, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env={**environ, "POPRUN_RUNS_DIR": str(tmp_path / name / "runs")}))
    outs = [proc.communicate(timeout=150) for proc in procs]

    assert [0, 0] == [proc.returncode for proc in procs], outs
    ports = {e["master_port"] for name in ("a", "b") for e in events(tmp_path / name) if e["event"] == "attempt-started"}
    assert 2 == len(ports)


def test_a_training_run_resumes_from_its_checkpoint_to_the_same_weights(tmp_path: Path) -> None:
    """examples/train_resume.py: a crash at step 25 and a restart end with the uninterrupted run's weights."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("sklearn")
    script = str(ROOT / "examples" / "train_resume.py")
    common = ("--num-instances", "2", "--num-replicas", "2", "--offline-mode=1")
    whole = poprun(*common, sys.executable, script, "--checkpoint", "whole.ckpt", "--save", "whole.pt",
                   cwd=tmp_path, timeout=150)
    crashed = poprun(*common, "--max-restarts", "2", "--restart-backoff", "0.1", sys.executable, script,
                     "--checkpoint", "crashed.ckpt", "--crash-at-step", "25", "--save", "crashed.pt",
                     cwd=tmp_path, timeout=150)

    assert (0, 0) == (whole.returncode, crashed.returncode), (whole.stderr, crashed.stderr)
    assert "crashing at step 25 on purpose" in crashed.stdout
    summary = json.loads(crashed.stdout.strip().splitlines()[-1])
    assert (1, 20) == (summary["attempt"], summary["resumed_at_step"])
    a, b = torch.load(tmp_path / "whole.pt"), torch.load(tmp_path / "crashed.pt")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), "the resumed run's weights differ from the uninterrupted run's"


def test_a_stop_during_the_back_off_starts_nothing_more(tmp_path: Path) -> None:
    """SIGTERM to poprun while it waits to restart: no new attempt, status 143, the wait cut short."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("POPDIST_", "MASTER_", "OMPI_", "POPRUN_"))}
    proc = subprocess.Popen([sys.executable, "-m", "poprun.cli.main", "--num-instances", "1", "--num-replicas", "1",
                             "--max-restarts", "3", "--restart-backoff", "30", "--min-uptime", "0", "sh", "-c",
                             "echo started >> starts.txt; exit 1"], cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**environ, "POPRUN_RUNS_DIR": str(tmp_path / "runs")})
    deadline = time.monotonic() + 20  # the attempt ended: the back-off runs (a restart is told only once it begins)
    while '"launch-ended"' not in "".join(p.read_text() for p in (tmp_path / "runs").glob("*/events.jsonl")):
        assert time.monotonic() < deadline, "the first attempt did not end"
        time.sleep(0.05)
    began = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=20)

    assert time.monotonic() - began < 10
    assert 143 == proc.returncode, err
    assert "started\n" == (tmp_path / "starts.txt").read_text()


def test_without_py_spy_the_stall_report_holds_faulthandlers_stack_and_no_instance_is_blamed(tmp_path: Path) -> None:
    """py-spy out of reach: poprun sets PYTHONFAULTHANDLER, the dump is the stack, and the SIGABRTs blame no instance."""
    base_python = os.path.realpath(sys.executable)  # no py-spy beside it (py-spy is in the virtual environment)
    no_py_spy = ":".join(d for d in os.environ.get("PATH", "").split(":") if not Path(d, "py-spy").exists())
    done = poprun("--num-instances", "2", "--num-replicas", "2", "--stall-timeout", "1.5", base_python,
                  program(tmp_path, HANG), cwd=tmp_path, env={"PATH": no_py_spy})

    assert 124 == done.returncode, done.stderr
    data = report(tmp_path)
    assert "Fatal Python error" in data["stacks"]["1"] and "in hang_here" in data["stacks"]["1"], data["stacks"]
    assert (None, [True, True]) == (data["root_cause"], [f["stopped"] for f in data["failures"]])
    assert "Root cause" not in done.stderr
    assert [] == [p.name for p in tmp_path.iterdir() if p.name.startswith("core")]
