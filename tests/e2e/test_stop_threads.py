"""
A stop signal is acted on whichever of poprun's threads the kernel gives it to.

The kernel gives a signal sent to a process to any thread that does not block it (the main
thread first, unless it already has one pending or the process was stopped); CPython runs the
handler only in the main thread, once that thread leaves its wait. Every thread poprun starts
therefore blocks the stop signals (:mod:`poprun.core.threads`). These tests start a run that
uses every feature with a thread of its own (the status line, the events writer, the limits'
clock, the progress channel, the watch, notifications, the metrics file), then read each
thread's mask from ``/proc`` and send SIGTERM to each thread by its id, as the kernel may.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from poprun.core.threads import STOPS
from tests.conftest import Marked, described
from tests.e2e.test_runs import PY, runs_env

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

# progress every 20 ms for a minute: the channel, the watch and the metrics file all have work
PROGRAM = "import time, popdist\nfor i in range(3000):\n    popdist.progress(i, 3000)\n    time.sleep(0.02)\n"


def _masks(pid: int) -> dict[int, int]:
    """Return {thread id: its blocked signals as a bit mask} of process ``pid``."""
    masks = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        status = (task / "status").read_text()
        line = next(line for line in status.splitlines() if line.startswith("SigBlk:"))
        masks[int(task.name)] = int(line.split()[1], 16)
    return masks


def _started(env: dict[str, str], tmp_path: Path) -> subprocess.Popen[str]:
    """Start a 2-instance run with every threaded feature on; return it once its progress is heard."""
    script = tmp_path / "train.py"
    script.write_text(PROGRAM)
    metrics = tmp_path / "poprun.prom"
    proc = subprocess.Popen([PY, "-m", "poprun.cli.main", "--num-instances", "2", "--num-replicas", "2",
                             "--timeout", "300", "--heartbeat-timeout", "60", "--straggler-policy", "restart",
                             "--max-restarts", "1", "--notify", "cat > /dev/null", "--notify-on", "all",
                             "--metrics-file", str(metrics), "--events", str(tmp_path / "events.jsonl"),
                             PY, str(script)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    deadline = time.monotonic() + 30
    while "instance-progress" not in _read(tmp_path / "events.jsonl") or not metrics.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no progress heard"
        time.sleep(0.05)
    return proc


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def test_every_thread_but_the_main_one_blocks_the_stop_signals(tmp_path: Path, marked: Marked) -> None:
    # GIVEN
    proc = _started(runs_env(marked, tmp_path), tmp_path)
    try:
        # WHEN
        masks = _masks(proc.pid)

        # THEN
        wanted = sum(1 << (sig - 1) for sig in STOPS)
        others = {tid: mask for tid, mask in masks.items() if tid != proc.pid}
        assert len(others) >= 5, described([proc.pid])  # the features' threads are there
        assert {tid: mask & wanted for tid, mask in others.items()} == dict.fromkeys(others, wanted), \
            described([proc.pid])
        assert masks[proc.pid] & wanted == 0
    finally:
        proc.kill()
        proc.communicate()


def test_sigterm_given_to_any_thread_of_a_detached_supervisor_stops_the_run(tmp_path: Path, marked: Marked) -> None:
    """SIGTERM sent to a thread of a run's supervisor by its id (kill(2) then prefers that thread): the run stops."""
    # GIVEN
    env = runs_env(marked, tmp_path)
    script = tmp_path / "train.py"
    script.write_text(PROGRAM)
    started = subprocess.run([PY, "-m", "poprun.cli.main", "--detach", "--num-instances", "2", "--num-replicas", "2",
                              "--heartbeat-timeout", "60", "--metrics-file", str(tmp_path / "poprun.prom"),
                              "--notify", "cat > /dev/null", PY, str(script)],
                             env=env, capture_output=True, text=True, timeout=30, check=False)
    assert 0 == started.returncode, started.stderr
    run = tmp_path / "runs" / started.stdout.strip()
    supervisor = int((run / "supervisor").read_text().split()[0])
    deadline = time.monotonic() + 30
    while "instance-progress" not in _read(run / "events.jsonl"):
        assert time.monotonic() < deadline, "no progress heard"
        time.sleep(0.05)
    threads = sorted(set(_masks(supervisor)) - {supervisor})
    assert threads, described([supervisor])

    # WHEN
    os.kill(threads[0], signal.SIGTERM)  # the oldest thread

    # THEN
    deadline = time.monotonic() + 30
    while not (run / "report.json").exists():
        if time.monotonic() > deadline:
            text = described([supervisor])
            os.kill(supervisor, signal.SIGKILL)
            pytest.fail(f"SIGTERM to thread {threads[0]} was not acted on: {text}")
        time.sleep(0.05)
    assert 143 == json.loads((run / "report.json").read_text())["status"]
    assert {} == marked.survivors(within_s=10.0)


def test_a_stopped_detached_supervisor_takes_sigterm_in_its_main_thread(tmp_path: Path, marked: Marked) -> None:
    """SIGSTOP, then ``poprun stop`` (SIGTERM, SIGCONT): all threads wake at once; only the main one may take it."""
    # GIVEN
    env = runs_env(marked, tmp_path)
    started = subprocess.run([PY, "-m", "poprun.cli.main", "--detach", "--num-instances", "2", "--num-replicas", "2",
                              "--heartbeat-timeout", "60", "sh", "-c", "exec sleep 60"],
                             env=env, capture_output=True, text=True, timeout=30, check=False)
    assert 0 == started.returncode, started.stderr
    run_id = started.stdout.strip()
    supervisor = int((tmp_path / "runs" / run_id / "supervisor").read_text().split()[0])
    wanted = sum(1 << (sig - 1) for sig in STOPS)

    # WHEN
    masks = _masks(supervisor)

    # THEN
    assert all(mask & wanted == wanted for tid, mask in masks.items() if tid != supervisor), described([supervisor])
    os.kill(supervisor, signal.SIGKILL)
