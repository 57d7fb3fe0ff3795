"""
Instance health on the namespace hosts (real sshd): a straggler slowed from outside, a hung instance stopped from outside.

Four instances on h1..h4 (or three, with h4 a spare) run a loop that calls
``popdist.progress(i, 200)``. The test reaches an instance's process on its host the way
poprun's stack reader does: the hosts are network namespaces of this machine, so it finds the
pid by the run's id and the instance's index in ``/proc/PID/environ``. A straggler is slowed to a
quarter of its speed by a SIGSTOP/SIGCONT duty cycle (75 ms stopped in every 100 ms); a hung
instance is stopped (SIGSTOP) for good.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.hosts.test_ssh_backend import PY, wait_for
from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

# argv[1]: the pause of a step in attempt 0 (attempts after it run fast), slept in 20 slices so that a
# duty cycle of stops slows the instance by as much as it is stopped
PROGRAM = """
import os, sys, time, popdist
attempt = int(os.environ.get("POPRUN_RESTART_COUNT", "0"))
pause = float(sys.argv[1]) if attempt == 0 else 0.002
for step in range(1, 201):
    popdist.progress(step, 200)
    for _ in range(20):
        time.sleep(pause / 20)
print("done", os.environ["POPDIST_INSTANCE_INDEX"], flush=True)
"""


def start(hosts: TestHosts, cwd: Path, *args: str) -> subprocess.Popen[str]:
    """Start poprun on the test hosts, its record in ``cwd/runs`` and its events in ``cwd/events.jsonl``."""
    env = os.environ | hosts.env() | {"POPRUN_RUNS_DIR": str(cwd / "runs")}
    return subprocess.Popen([PY, "-m", "poprun.cli.main", "--events", str(cwd / "events.jsonl"), *args], cwd=cwd,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def events(cwd: Path, kind: str | None = None) -> list[dict[str, object]]:
    path = cwd / "events.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    told = [json.loads(line) for line in lines if line.endswith("}")]
    return [e for e in told if kind is None or e["event"] == kind]


def run_id(cwd: Path) -> str:
    """Wait for the run to start; return its id."""
    assert wait_for(lambda: events(cwd, "run-started"), within_s=60), "the run did not start"
    return str(events(cwd, "run-started")[0]["run"])


def instance_pid(run: str, index: int, *, attempt: int = 0, within_s: float = 60) -> int:
    """Return the pid of the Python process of instance ``index`` of ``run`` (in ``attempt``), found by its environment."""
    wanted = {f"POPRUN_RUN_ID={run}".encode(), f"POPDIST_INSTANCE_INDEX={index}".encode(),
              f"POPRUN_RESTART_COUNT={attempt}".encode()}
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            with contextlib.suppress(OSError):
                environ = set(Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"))
                argv0 = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")[0]
                if wanted <= environ and os.path.basename(argv0).startswith(b"python"):
                    return int(entry)
        time.sleep(0.1)
    pytest.fail(f"no process of instance {index} of run {run} (attempt {attempt}) found")


def reported(cwd: Path, index: int, *, at_least: int, within_s: float = 60) -> None:
    """Wait until instance ``index`` was told at step ``at_least`` or beyond (its instance-progress events)."""
    assert wait_for(lambda: any(e["index"] == index and (e["step"] or 0) >= at_least
                                for e in events(cwd, "instance-progress")), within_s=within_s), \
        f"instance {index} never reached step {at_least}"


@contextlib.contextmanager
def duty_cycle(pid: int, *, stopped_s: float = 0.075, period_s: float = 0.1) -> Iterator[None]:
    """Keep ``pid`` stopped ``stopped_s`` of every ``period_s`` while the block runs (a quarter of its speed)."""
    done = threading.Event()

    def cycle() -> None:
        while not done.is_set():
            try:
                os.kill(pid, signal.SIGSTOP)
                time.sleep(stopped_s)
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                return
            time.sleep(period_s - stopped_s)

    thread = threading.Thread(target=cycle, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(5)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def finish(proc: subprocess.Popen[str], timeout: float = 150) -> tuple[str, str]:
    try:
        return proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def report(cwd: Path) -> dict[str, object]:
    (run,) = [d for d in (cwd / "runs").iterdir() if d.is_dir() and not d.is_symlink()]
    return json.loads((run / "report.json").read_text())


def test_an_instance_slowed_to_a_quarter_is_named_a_straggler_within_30_s(test_hosts: TestHosts,
                                                                         tmp_path: Path) -> None:
    """h3's instance under a 75 % stop duty cycle: within 30 s a straggler event names it and h3, ratio about 4."""
    proc = start(test_hosts, tmp_path, "--host", "h1,h2,h3,h4", "--num-replicas", "4", PY, "-c", PROGRAM, "0.05")
    try:
        pid = instance_pid(run_id(tmp_path), 2)
        reported(tmp_path, 2, at_least=1)
        began = time.monotonic()
        with duty_cycle(pid):  # until it is told: then it runs at full speed, and the report keeps its ratio
            assert wait_for(lambda: events(tmp_path, "straggler"), within_s=30), "no straggler told within 30 s"
            took = time.monotonic() - began
            ps = subprocess.run([PY, "-m", "poprun.cli.main", "ps", "--json"], capture_output=True, text=True,
                                env=os.environ | {"POPRUN_RUNS_DIR": str(tmp_path / "runs")}, timeout=60, check=False)
        _, err = finish(proc)
    finally:
        if proc.poll() is None:
            finish(proc)

    assert 0 == proc.returncode, err
    (told,) = events(tmp_path, "straggler")
    assert (2, "h3", 0) == (told["index"], told["host"], told["attempt"]), told
    assert 2.5 < told["ratio"] < 8, told  # a quarter of the speed: about 4, on a loaded machine give or take
    assert took < 30
    (shown,) = json.loads(ps.stdout)
    assert 200 == shown["progress"]["total"] and shown["progress"]["eta_s"] is not None, shown
    progress = {i["index"]: i for i in report(tmp_path)["progress"]["instances"]}
    assert sorted(progress) == [0, 1, 2, 3]
    assert all(progress[i]["step_time_ms"]["median"] > 0 for i in progress)
    assert progress[2]["straggler_ratio"] is not None and progress[0]["straggler_ratio"] is None


def test_a_stopped_instance_is_hung_the_run_ends_124_naming_it_its_host_and_its_stack(test_hosts: TestHosts,
                                                                                    tmp_path: Path) -> None:
    """--heartbeat-timeout 5, instance 1 (h2) stopped: limit-reached names it and h2, its stack is in the report, 124."""
    proc = start(test_hosts, tmp_path, "--host", "h1,h2,h3,h4", "--num-replicas", "4", "--heartbeat-timeout", "5",
                 PY, "-c", PROGRAM, "0.2")
    try:
        pid = instance_pid(run_id(tmp_path), 1)
        reported(tmp_path, 1, at_least=2)
        os.kill(pid, signal.SIGSTOP)
        _, err = finish(proc)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)

    assert 124 == proc.returncode, err
    text = "instance 1 on h2 sent no progress or heartbeat for 5 s (--heartbeat-timeout)"
    assert text in err
    (limit,) = events(tmp_path, "limit-reached")
    assert ("heartbeat", 1, "h2") == (limit["limit"], limit["instance"], limit["host"])
    data = report(tmp_path)
    assert ("heartbeat", text) == (data["limit"], data["limit_text"])
    assert "<string>" in data["stacks"]["1"], data["stacks"]  # where it was stopped: the program's own frames


def test_a_hung_instance_with_a_restart_allowed_restarts_the_run_which_ends_well(test_hosts: TestHosts,
                                                                                tmp_path: Path) -> None:
    """--max-restarts 1: attempt 0 ends as instance 1's hang (124), attempt 1 runs to its end: status 0."""
    proc = start(test_hosts, tmp_path, "--host", "h1,h2,h3,h4", "--num-replicas", "4", "--heartbeat-timeout", "5",
                 "--max-restarts", "1", "--restart-backoff", "0.1", PY, "-c", PROGRAM, "0.2")
    try:
        pid = instance_pid(run_id(tmp_path), 1)
        reported(tmp_path, 1, at_least=2)
        os.kill(pid, signal.SIGSTOP)
        out, err = finish(proc)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)

    assert 0 == proc.returncode, err
    attempts = report(tmp_path)["attempts"]
    assert [(0, 124, 1), (1, 0, None)] == [(a["number"], a["status"], a["root_cause"]) for a in attempts]
    assert "instance 1 hung on h2: silent for 5 s (--heartbeat-timeout)" == attempts[0]["cause"]
    assert 4 == out.count("done ")


def test_a_hung_instance_s_host_is_replaced_by_the_spare(test_hosts: TestHosts, tmp_path: Path) -> None:
    """h1..h3 with h4 spare, --max-restarts 1: instance 1 on h2 hangs; attempt 1 runs on h1, h4, h3 and says why."""
    proc = start(test_hosts, tmp_path, "--host", "h1,h2,h3", "--spare-host", "h4", "--num-replicas", "3",
                 "--heartbeat-timeout", "5", "--max-restarts", "1", "--restart-backoff", "0.1", PY, "-c", PROGRAM, "0.2")
    try:
        pid = instance_pid(run_id(tmp_path), 1)
        reported(tmp_path, 1, at_least=2)
        os.kill(pid, signal.SIGSTOP)
        _, err = finish(proc)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)

    assert 0 == proc.returncode, err
    (replan,) = events(tmp_path, "replan")
    assert (["h2"], ["h4"], ["h1", "h4", "h3"]) == (replan["removed"], replan["added"], replan["hosts"]), replan
    assert "its instance 1 hung (--heartbeat-timeout)" in str(replan["reason"])
    assert [["h1", "h2", "h3"], ["h1", "h4", "h3"]] == [a["hosts"] for a in report(tmp_path)["attempts"]]


def test_a_straggler_under_the_restart_policy_ends_its_attempt_and_its_host_is_replaced(test_hosts: TestHosts,
                                                                                     tmp_path: Path) -> None:
    """--straggler-policy restart, h1..h3 with h4 spare: the slowed instance on h3 ends attempt 0; attempt 1 on h1, h2, h4."""
    proc = start(test_hosts, tmp_path, "--host", "h1,h2,h3", "--spare-host", "h4", "--num-replicas", "3",
                 "--straggler-policy", "restart", "--max-restarts", "1", "--restart-backoff", "0.1",
                 PY, "-c", PROGRAM, "0.05")
    try:
        pid = instance_pid(run_id(tmp_path), 2)
        reported(tmp_path, 2, at_least=1)
        with duty_cycle(pid):
            _, err = finish(proc)
    finally:
        if proc.poll() is None:
            finish(proc)

    assert 0 == proc.returncode, err
    (told,) = events(tmp_path, "straggler")
    assert (2, "h3") == (told["index"], told["host"])
    (limit,) = events(tmp_path, "limit-reached")
    assert ("straggler", 2, "h3") == (limit["limit"], limit["instance"], limit["host"])
    (replan,) = events(tmp_path, "replan")
    assert (["h3"], ["h4"]) == (replan["removed"], replan["added"]), replan
    assert "its instance 2 was a straggler (--straggler-policy restart)" in str(replan["reason"])
    attempts = report(tmp_path)["attempts"]
    assert [(0, 124, 2), (1, 0, None)] == [(a["number"], a["status"], a["root_cause"]) for a in attempts]
