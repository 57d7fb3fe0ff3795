"""
``poprun stop`` of a run that is suspended (Ctrl-Z, SIGSTOP): it ends as any stopped run does, as kill(1) ends a stopped job.

Every launch runs in a ``marked`` environment and keeps its runs in a folder of its own; the
tests suspend real processes and read their states from ``/proc``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import Marked, described
from tests.e2e.test_runs import PY, poprun, runs_env
from tests.golden.harness import assert_golden

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

GOLDEN = Path(__file__).parent / "runs_golden"
READY = 'echo "ready $$"'


def state(pid: int) -> str:
    """Return the state letter of process ``pid`` (``T``: stopped), or "" when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return ""


def await_states(pids: list[int], letter: str, within_s: float = 20) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if all(state(pid) == letter for pid in pids):
            return True
        time.sleep(0.02)
    print(described(pids))  # noqa: T201 - shown with the failure: what each process was doing
    return False




def foreground(env: dict[str, str], script: str) -> tuple[subprocess.Popen[str], list[int]]:
    """Start ``poprun sh -c READY; SCRIPT`` with 2 instances; return it once both are ready, and their pids."""
    proc = subprocess.Popen([PY, "-m", "poprun.cli.main", "--num-instances", "2", "--num-replicas", "2", "sh", "-c",
                             f"{READY}; {script}"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    pids = [int(proc.stdout.readline().split()[1]) for _ in range(2)]
    runs = Path(env["POPRUN_RUNS_DIR"])
    deadline = time.monotonic() + 20  # the launch is poprun's to suspend (its instances too) once it runs
    while '"launch-running"' not in "".join(p.read_text() for p in runs.glob("*/events.jsonl")):
        assert time.monotonic() < deadline, "the launch did not run"
        time.sleep(0.02)
    return proc, pids


def the_report(tmp_path: Path) -> dict[str, object]:
    (run,) = (tmp_path / "runs").iterdir()
    return json.loads((run / "report.json").read_text())


def test_stop_ends_a_run_suspended_with_ctrl_z(tmp_path: Path, marked: Marked) -> None:
    """Ctrl-Z (SIGTSTP) stops poprun and its instances; ``poprun stop`` then ends the run: 0, and the run's 143."""
    # GIVEN a run suspended as Ctrl-Z does
    env = runs_env(marked, tmp_path)
    proc, pids = foreground(env, "exec sleep 60")
    try:
        proc.send_signal(signal.SIGTSTP)
        assert await_states([proc.pid, *pids], "T"), [state(p) for p in (proc.pid, *pids)]

        # WHEN
        stopped = poprun(env, "stop", "last", "--timeout", "30", timeout=60)
        proc.communicate(timeout=30)
    finally:
        proc.kill()

    # THEN
    assert 0 == stopped.returncode, stopped.stderr
    assert stopped.stderr.startswith("poprun: stopped run ") and stopped.stderr.endswith(": it ended with status 143\n")
    assert 143 == proc.returncode
    data = the_report(tmp_path)
    assert (143, [15]) == (data["status"], data["signals"])
    assert {} == marked.survivors(within_s=5.0)


def test_stop_ends_a_run_frozen_with_sigstop_without_waiting_for_the_grace(tmp_path: Path, marked: Marked) -> None:
    """poprun and its instances stopped with SIGSTOP (no handler runs): the instances end by SIGTERM, not SIGKILL."""
    # GIVEN every process of the run frozen, poprun first
    env = runs_env(marked, tmp_path)
    proc, pids = foreground(env, "exec sleep 60")
    try:
        os.kill(proc.pid, signal.SIGSTOP)
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        assert await_states([proc.pid, *pids], "T")

        # WHEN
        stopped = poprun(env, "stop", "last", "--timeout", "30", timeout=60)
        proc.communicate(timeout=30)
    finally:
        proc.kill()

    # THEN each instance was continued after its SIGTERM, so it died of it, before the grace period's SIGKILL
    assert 0 == stopped.returncode, stopped.stderr
    assert (143, [143, 143]) == (proc.returncode, the_report(tmp_path)["statuses"])
    assert {} == marked.survivors(within_s=5.0)


def test_a_second_stop_kills_a_suspended_run_at_once(tmp_path: Path, marked: Marked) -> None:
    """Suspended instances that ignore SIGTERM: the first stop is PR607 with its hint, and the second kills them."""
    # GIVEN
    env = runs_env(marked, tmp_path)
    proc, pids = foreground(env, "trap '' TERM; while :; do sleep 0.05; done")
    try:
        proc.send_signal(signal.SIGTSTP)
        assert await_states([proc.pid, *pids], "T")

        # WHEN
        first = poprun(env, "stop", "last", "--timeout", "1", timeout=60)
        second = poprun(env, "stop", "last", "--timeout", "30", timeout=60)
        proc.communicate(timeout=30)
    finally:
        proc.kill()

    # THEN
    assert 1 == first.returncode, first.stderr
    assert "error[PR607]: run did not stop in time" in first.stderr
    assert "again kills every instance at once" in first.stderr
    assert 0 == second.returncode, second.stderr
    assert 143 == proc.returncode
    assert [137, 137] == the_report(tmp_path)["statuses"]  # killed, not waited for: the second stop's SIGKILL
    assert {} == marked.survivors(within_s=5.0)


@pytest.mark.parametrize("how", [signal.SIGTSTP, signal.SIGSTOP])
def test_stop_ends_a_suspended_detached_run(tmp_path: Path, marked: Marked, how: signal.Signals) -> None:
    """A detached run whose supervisor was suspended: ``poprun stop`` ends it, and nothing of it is left."""
    # GIVEN
    env = runs_env(marked, tmp_path)
    started = poprun(env, "--detach", "--num-instances", "2", "--num-replicas", "2", "sh", "-c", "exec sleep 60",
                     timeout=30)
    assert 0 == started.returncode, started.stderr
    run_id = started.stdout.strip()
    supervisor = int((tmp_path / "runs" / run_id / "supervisor").read_text().split()[0])
    os.kill(supervisor, how)
    assert await_states([supervisor], "T")

    # WHEN
    stopped = poprun(env, "stop", run_id, "--timeout", "30", timeout=60)

    # THEN
    assert 0 == stopped.returncode, stopped.stderr
    assert f"poprun: stopped run {run_id}: it ended with status 143\n" == stopped.stderr
    assert {} == marked.survivors(within_s=5.0)


def test_stop_of_a_run_whose_supervisor_ignores_sigterm_says_so_at_once(tmp_path: Path, marked: Marked) -> None:
    """poprun started with SIGTERM ignored (it keeps it so): stop is PR618 at once, not PR607 'stop again' forever."""
    # GIVEN
    env = runs_env(marked, tmp_path)
    launch = f"trap '' TERM; exec {PY} -m poprun.cli.main --num-instances 2 --num-replicas 2 sh -c 'echo ready; exec sleep 60'"
    proc = subprocess.Popen(["sh", "-c", launch], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert "ready" in proc.stdout.readline()
        (run,) = (tmp_path / "runs").iterdir()

        # WHEN
        began = time.monotonic()
        stopped = poprun(env, "stop", run.name, "--timeout", "1", timeout=60)
        took = time.monotonic() - began
    finally:
        proc.kill()
        proc.communicate(timeout=30)

    # THEN
    assert_golden(GOLDEN / "PR618_stop_a_run_whose_supervisor_ignores_sigterm",
                  f"{stopped.stderr}exit {stopped.returncode}\n".replace(run.name, "RUN").replace(str(proc.pid), "N"))
    assert took < 30
    assert {} == marked.survivors(within_s=5.0)  # its watchdog ended every instance when poprun was killed


def test_a_killed_supervisor_not_yet_reaped_is_lost_not_running(tmp_path: Path, marked: Marked) -> None:
    """poprun SIGKILLed, its parent yet to reap it (a zombie): ps says lost, and stop says so at once (PR603)."""
    # GIVEN
    env = runs_env(marked, tmp_path)
    proc, _ = foreground(env, "exec sleep 60")
    try:
        os.kill(proc.pid, signal.SIGKILL)
        assert await_states([proc.pid], "Z")

        # WHEN
        listed = poprun(env, "ps", "--json", timeout=60)
        stopped = poprun(env, "stop", "last", "--timeout", "30", timeout=60)
    finally:
        proc.kill()
        proc.communicate(timeout=30)

    # THEN
    assert ["lost"] == [run["state"] for run in json.loads(listed.stdout)]
    assert 1 == stopped.returncode, stopped.stderr
    assert "error[PR603]: run is not running" in stopped.stderr
    assert {} == marked.survivors(within_s=5.0)  # its watchdog ended every instance
