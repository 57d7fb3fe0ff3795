"""
Instance health end to end on this machine: a hung instance (--heartbeat-timeout) and stragglers, through the real CLI.

Each test runs ``python -m poprun.cli.main`` with the local backend, its own runs directory and
an ``--events`` file, and reads what the run left. The programs call ``popdist.progress`` (or
``popdist.heartbeat``); a hang is an instance that stops itself (SIGSTOP), a straggler one that
sleeps four times as long a step. Deadlines are generous: a loaded machine only makes them later.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jsonschema
import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

FAST = ("--restart-backoff", "0.05", "--min-uptime", "0")


def environ(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POPDIST_", "MASTER_", "OMPI_", "POPRUN_"))}
    env["POPRUN_RUNS_DIR"] = str(tmp_path / "runs")
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env | extra


def poprun(tmp_path: Path, *args: str, timeout: float = 120, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "poprun.cli.main", "--events", str(tmp_path / "events.jsonl"), *args],
                          cwd=tmp_path, capture_output=True, text=True, env=environ(tmp_path, **extra),
                          timeout=timeout, check=False)


SCHEMA = json.loads((Path(__file__).parents[2] / "docs" / "events.schema.json").read_text())


def events(tmp_path: Path, kind: str | None = None) -> list[dict[str, object]]:
    """Return the run's events (of ``kind``), each of them checked against the documented schema."""
    told = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    for event in told:
        jsonschema.validate(event, SCHEMA)
    return [e for e in told if kind is None or e["event"] == kind]


def report(tmp_path: Path) -> dict[str, object]:
    (run,) = [p for p in (tmp_path / "runs").iterdir() if p.is_dir() and not p.is_symlink()]
    return json.loads((run / "report.json").read_text())


def program(tmp_path: Path, text: str) -> str:
    path = tmp_path / "prog.py"
    path.write_text(text)
    return str(path)


# Instance 1 of attempt 0 stops itself at step 10 (a hang: no more reports); the others run 60 steps.
HANGS = """
import os, signal, time, popdist
index = int(os.environ["POPDIST_INSTANCE_INDEX"])
attempt = int(os.environ.get("POPRUN_RESTART_COUNT", "0"))
for step in range(1, 61):
    popdist.progress(step, 60)
    if index == 1 and attempt == 0 and step == 10:
        os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(0.05)
"""


@pytest.mark.parametrize("backend", ["local", "offline", "mpirun"])
def test_a_hung_instance_ends_the_run_with_124_naming_it_and_its_host_with_its_stack(tmp_path: Path,
                                                                                    backend: str) -> None:
    """--heartbeat-timeout 2 and instance 1 stopped: limit-reached names it, the report has its stack, status 124."""
    done = poprun(tmp_path, "--backend", backend, "--num-instances", "2", "--num-replicas", "2",
                  "--heartbeat-timeout", "2", sys.executable, program(tmp_path, HANGS))

    assert 124 == done.returncode, done.stderr
    text = "instance 1 on localhost sent no progress or heartbeat for 2 s (--heartbeat-timeout)"
    assert f"poprun: {text}; every instance was stopped" in done.stderr
    assert "call popdist.heartbeat() inside long steps (a checkpoint, an evaluation)" in done.stderr
    (limit,) = events(tmp_path, "limit-reached")
    assert ("heartbeat", 1, "localhost") == (limit["limit"], limit["instance"], limit["host"])
    assert limit["after_ms"] >= 2000
    data = report(tmp_path)
    assert ("heartbeat", text) == (data["limit"], data["limit_text"])
    assert "prog.py" in data["stacks"]["1"]  # where it stopped: faulthandler's dump, or py-spy's


def test_with_a_restart_allowed_a_hung_instance_restarts_the_run_which_succeeds(tmp_path: Path) -> None:
    """--max-restarts 1: the hang is attempt 0's failure (124, instance 1); attempt 1 runs to its end: status 0."""
    done = poprun(tmp_path, "--num-instances", "2", "--num-replicas", "2", "--heartbeat-timeout", "2",
                  "--max-restarts", "1", *FAST, sys.executable, program(tmp_path, HANGS))

    assert 0 == done.returncode, done.stderr
    assert ("poprun: attempt 0 failed: instance 1 hung on localhost: silent for 2 s (--heartbeat-timeout); "
            "restart 1 of 1 in 0.05 s") in done.stderr
    attempts = report(tmp_path)["attempts"]
    assert [(0, 124, 1), (1, 0, None)] == [(a["number"], a["status"], a["root_cause"]) for a in attempts]
    assert [] == [e for e in events(tmp_path, "limit-reached") if e["limit"] != "heartbeat"]


def test_with_the_instance_scope_only_the_hung_instance_restarts(tmp_path: Path) -> None:
    """--restart-scope instance: instance 1 alone is read, ended and started again (its hang is its failure); 0 goes on."""
    done = poprun(tmp_path, "--num-instances", "2", "--num-replicas", "2", "--heartbeat-timeout", "2",
                  "--max-restarts", "1", "--restart-scope", "instance", *FAST, sys.executable, program(tmp_path, HANGS))

    assert 0 == done.returncode, done.stderr
    attempts = report(tmp_path)["attempts"]
    assert [(0, 124, 1), (1, 0, None)] == [(a["number"], a["status"], a["root_cause"]) for a in attempts]
    started = [(e["index"], e["restart"]) for e in events(tmp_path, "instance-started")]
    assert [(0, 0), (1, 0), (1, 1)] == sorted(started)  # instance 0 never started again
    assert [[1]] == [e["instances"] for e in events(tmp_path, "stacks-collected")]
    assert [] == events(tmp_path, "stopping")


def test_with_the_instance_scope_and_the_budget_spent_a_second_hang_ends_the_run(tmp_path: Path) -> None:
    """Instance 1 hangs in every run of it: restarted once alone, then the run ends with 124 naming it."""
    always = HANGS.replace("attempt == 0 and ", "")
    done = poprun(tmp_path, "--num-instances", "2", "--num-replicas", "2", "--heartbeat-timeout", "2",
                  "--max-restarts", "1", "--restart-scope", "instance", *FAST, sys.executable, program(tmp_path, always))

    assert 124 == done.returncode, done.stderr
    data = report(tmp_path)
    assert ("heartbeat", "instance 1 on localhost sent no progress or heartbeat for 2 s (--heartbeat-timeout)") == (
        data["limit"], data["limit_text"])
    assert [(0, 124, 1), (1, 124, 1)] == [(a["number"], a["status"], a["root_cause"]) for a in data["attempts"]]


STRAGGLES = """
import os, time, popdist
index = int(os.environ["POPDIST_INSTANCE_INDEX"])
attempt = int(os.environ.get("POPRUN_RESTART_COUNT", "0"))
for step in range(1, 121):
    popdist.progress(step, 120)
    time.sleep(0.08 if index == 2 and attempt == 0 else 0.02)
"""


def test_an_instance_four_times_slower_is_told_as_a_straggler_with_its_ratio(tmp_path: Path) -> None:
    """4 instances, one sleeping 4 x as long a step: one straggler event names it, ratio about 4; the report keeps it."""
    done = poprun(tmp_path, "--num-instances", "4", "--num-replicas", "4", sys.executable,
                  program(tmp_path, STRAGGLES))

    assert 0 == done.returncode, done.stderr
    (told,) = events(tmp_path, "straggler")
    assert (2, "localhost", 0) == (told["index"], told["host"], told["attempt"])
    assert 3.0 < told["ratio"] < 5.0
    assert 60 <= told["step_time_ms"] <= 4 * told["run_median_ms"] * 1.5
    said = (f"poprun: instance 2 on localhost is a straggler: its median step time {told['step_time_ms']} ms is "
            f"{told['ratio']:.2f} x the run's {told['run_median_ms']} ms")
    assert said in done.stderr.splitlines()
    ratios = {i["index"]: i["straggler_ratio"] for i in report(tmp_path)["progress"]["instances"]}
    assert [None, None, None] == [ratios[0], ratios[1], ratios[3]]
    assert 3.0 < ratios[2] < 5.0


def test_the_restart_policy_without_a_budget_ends_the_run_naming_the_straggler(tmp_path: Path) -> None:
    """--straggler-policy restart and no restart allowed: the run ends with 124, the straggler and its host named."""
    done = poprun(tmp_path, "--num-instances", "4", "--num-replicas", "4", "--straggler-policy", "restart",
                  sys.executable, program(tmp_path, STRAGGLES))

    assert 124 == done.returncode, done.stderr
    assert "poprun: instance 2 on localhost is a straggler: its median step time " in done.stderr
    (limit,) = events(tmp_path, "limit-reached")
    assert ("straggler", 2, "localhost") == (limit["limit"], limit["instance"], limit["host"])
    assert "straggler" == report(tmp_path)["limit"]


def test_the_restart_policy_with_a_budget_restarts_the_attempt(tmp_path: Path) -> None:
    """--straggler-policy restart --max-restarts 1: the straggler's attempt ends as its failure, the next runs evenly."""
    done = poprun(tmp_path, "--num-instances", "4", "--num-replicas", "4", "--straggler-policy", "restart",
                  "--max-restarts", "1", *FAST, sys.executable, program(tmp_path, STRAGGLES))

    assert 0 == done.returncode, done.stderr
    attempts = report(tmp_path)["attempts"]
    assert [(0, 124, 2), (1, 0, None)] == [(a["number"], a["status"], a["root_cause"]) for a in attempts]
    assert "instance 2 was a straggler on localhost" in attempts[0]["cause"]


def test_an_instance_that_reports_once_and_exits_is_not_hung(tmp_path: Path) -> None:
    """Instance 0 reports once and ends at once; instance 1 goes on for twice the limit: no hang, status 0."""
    text = """
import os, time, popdist
popdist.progress(1, 1)
if os.environ["POPDIST_INSTANCE_INDEX"] == "1":
    for step in range(40):
        popdist.heartbeat()
        time.sleep(0.1)
"""
    done = poprun(tmp_path, "--num-instances", "2", "--num-replicas", "2", "--heartbeat-timeout", "2",
                  sys.executable, program(tmp_path, text))

    assert 0 == done.returncode, done.stderr
    assert [] == events(tmp_path, "limit-reached")


def test_heartbeats_alone_keep_an_instance_alive(tmp_path: Path) -> None:
    """An instance that only calls popdist.heartbeat() (every 0.5 s, for 3 x the limit) is neither hung nor a straggler."""
    text = """
import time, popdist
for _ in range(12):
    popdist.heartbeat()
    time.sleep(0.5)
"""
    done = poprun(tmp_path, "--num-instances", "2", "--num-replicas", "2", "--heartbeat-timeout", "2",
                  sys.executable, program(tmp_path, text))

    assert 0 == done.returncode, done.stderr
    assert [] == events(tmp_path, "limit-reached") == events(tmp_path, "straggler")


def test_children_forked_with_the_same_index_do_not_confuse_the_watch(tmp_path: Path) -> None:
    """A program whose forked child reports under the same index while the parent reports too: no hang, status 0."""
    text = """
import os, time, popdist
pid = os.fork()
for step in range(1, 31):
    popdist.progress(step, 30, child=pid == 0)
    time.sleep(0.05)
if pid:
    os.waitpid(pid, 0)
"""
    done = poprun(tmp_path, "--num-instances", "2", "--num-replicas", "2", "--heartbeat-timeout", "2",
                  sys.executable, program(tmp_path, text))

    assert 0 == done.returncode, done.stderr
    assert [] == events(tmp_path, "limit-reached")


def test_forged_datagrams_for_a_silent_instance_do_not_keep_it_alive(tmp_path: Path) -> None:
    """Instance 0 floods poprun's port with datagrams for instance 1 under a wrong token while 1 is stopped: hung all the same."""
    text = """
import json, os, signal, socket, time, popdist
index = int(os.environ["POPDIST_INSTANCE_INDEX"])
host, _, port = os.environ["POPRUN_PROGRESS"].rpartition(":")
popdist.progress(1, 100)
if index == 1:
    time.sleep(0.5)
    os.kill(os.getpid(), signal.SIGSTOP)
sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for n in range(400):
    body = json.dumps({"i": 1, "a": 0, "k": "p", "s": n, "n": 100, "t": time.time(), "c": 1}).encode()
    for token in (b"0" * 32, os.environ["POPRUN_PROGRESS_TOKEN"][:31].encode() + b"x"):
        sock.sendto(b"PRP1 " + token + b" " + body, (host or "127.0.0.1", int(port)))
    popdist.progress(n, 400)
    time.sleep(0.025)
"""
    done = poprun(tmp_path, "--num-instances", "2", "--num-replicas", "2", "--heartbeat-timeout", "2",
                  sys.executable, program(tmp_path, text))

    assert 124 == done.returncode, done.stderr
    (limit,) = events(tmp_path, "limit-reached")
    assert ("heartbeat", 1) == (limit["limit"], limit["instance"])
    assert report(tmp_path)["progress"]["forged"] > 0


def test_a_run_suspended_with_ctrl_z_for_longer_than_the_limit_is_not_hung(tmp_path: Path) -> None:
    """SIGTSTP to poprun (Ctrl-Z) stops it with its instances; continued after 3 x the limit, the run ends well."""
    text = """
import time, popdist
for step in range(1, 81):
    popdist.progress(step, 80)
    time.sleep(0.05)
"""
    proc = subprocess.Popen(
        [sys.executable, "-m", "poprun.cli.main", "--events", str(tmp_path / "events.jsonl"), "--num-instances", "2",
         "--num-replicas", "2", "--heartbeat-timeout", "2", sys.executable, program(tmp_path, text)],
        cwd=tmp_path, env=environ(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "events.jsonl").exists() or not events(tmp_path, "instance-progress"):
            assert time.monotonic() < deadline, "no progress told"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTSTP)
        deadline = time.monotonic() + 30
        while _state(proc.pid) != "T":
            assert time.monotonic() < deadline, "poprun did not stop"
            time.sleep(0.05)
        time.sleep(6)  # 3 x the limit, poprun and its instances stopped
        proc.send_signal(signal.SIGCONT)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    assert 0 == proc.returncode, err
    assert [] == events(tmp_path, "limit-reached")


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        return stat.read().rpartition(")")[2].split()[0]


def test_a_run_without_record_or_heartbeat_limit_imports_no_watch(tmp_path: Path) -> None:
    """POPRUN_RECORD=0 and no --heartbeat-timeout: nothing listens, the watch is not imported; with the limit, it is."""
    from tests.e2e.test_startup import _imported

    status, modules = _imported("--offline-mode=1", "true", cwd=tmp_path, env={"POPRUN_RECORD": "0"})
    limited, with_limit = _imported("--offline-mode=1", "--heartbeat-timeout", "5", "true", cwd=tmp_path,
                                    env={"POPRUN_RECORD": "0"})

    listening = ("poprun.apply.watch", "poprun.apply.channel", "poprun.apply.progress", "poprun.core.progress")
    assert (0, []) == (status, sorted(modules.intersection(listening)))
    assert 0 == limited
    assert {"poprun.apply.watch", "poprun.apply.progress"} <= with_limit
