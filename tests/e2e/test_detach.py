"""
``poprun --detach``, ``attach``, ``logs -f`` and ``stop``: a run that goes on without a terminal, found again by its id.

Every launch runs in a ``marked`` environment, so that each of its processes can be found by its
marker, and keeps its runs in a folder of its own.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import Marked
from tests.e2e.test_runs import PY, poprun, runs_env
from tests.golden.harness import assert_golden

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

GOLDEN = Path(__file__).parent / "runs_golden"
TICKING = 'i=0; while :; do i=$((i + 1)); echo "tick $i of $POPDIST_INSTANCE_INDEX"; sleep 0.05; done'


def detach(env: dict[str, str], script: str, *, instances: int = 2) -> subprocess.CompletedProcess[str]:
    """Run ``poprun --detach sh -c SCRIPT``: it must return (and let go of its pipes) at once."""
    return poprun(env, "--detach", "--num-instances", str(instances), "--num-replicas", str(instances),
                  "sh", "-c", script, timeout=10)


def follow(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    """Start ``poprun ARGS`` (attach, logs -f) with its output piped."""
    return subprocess.Popen([PY, "-m", "poprun.cli.main", *args], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_a_detached_run_is_attached_then_stopped_with_nothing_left_running(tmp_path: Path, marked: Marked) -> None:
    """--detach prints the id and returns 0; attach and logs -f follow it; stop ends it (143 to attach), nothing is left."""
    # GIVEN a detached run
    env = runs_env(marked, tmp_path)
    started = detach(env, TICKING)
    run_id = started.stdout.strip()
    assert (0, "") == (started.returncode, started.stderr)
    assert re.fullmatch(r"\d{8}-\d{6}-[0-9a-f]{6}", run_id)
    assert len(marked.alive()) >= 3

    # WHEN it is attached and followed, then stopped
    attached, followed = follow(env, "attach", run_id), follow(env, "logs", "-f", run_id[:17])
    assert attached.stdout is not None
    first = attached.stdout.readline()
    stopped = poprun(env, "stop", run_id)
    attached.communicate(timeout=20)
    logged, _ = followed.communicate(timeout=20)

    # THEN
    assert first.startswith("tick ")
    assert (0, f"poprun: stopped run {run_id}: it ended with status 143\n") == (stopped.returncode, stopped.stderr)
    assert 143 == attached.returncode
    assert (0, True) == (followed.returncode, "tick 1 of 0\n" in logged)
    assert {} == marked.survivors(within_s=3.0)
    assert "poprun: stopped by SIGTERM\n" in poprun(env, "report", run_id).stdout


def test_ctrl_c_detaches_attach_and_the_run_goes_on(tmp_path: Path, marked: Marked) -> None:
    """SIGINT to ``poprun attach``: it exits 130 saying so, and the run is still running."""
    # GIVEN
    env = runs_env(marked, tmp_path)
    run_id = detach(env, TICKING).stdout.strip()
    attached = follow(env, "attach", run_id)
    assert attached.stdout is not None
    attached.stdout.readline()

    # WHEN
    attached.send_signal(signal.SIGINT)
    _, err = attached.communicate(timeout=10)
    time.sleep(0.2)
    state = poprun(env, "ps").stdout.splitlines()[1].split()[1]

    # THEN
    assert 130 == attached.returncode
    assert f"poprun: detached from {run_id}" in err
    assert "running" == state
    assert 0 == poprun(env, "stop", run_id).returncode
    assert {} == marked.survivors(within_s=3.0)


def test_a_detached_launch_that_cannot_start_says_why_with_its_status(tmp_path: Path, marked: Marked) -> None:
    """--detach of a program that does not exist: poprun's diagnostic and exit 127, no id, nothing left."""
    env = runs_env(marked, tmp_path)

    started = poprun(env, "--detach", "--num-instances", "2", "--num-replicas", "2", "/no/such/program", timeout=10)

    assert (127, "") == (started.returncode, started.stdout)
    assert "/no/such/program" in started.stderr
    assert "Traceback" not in started.stderr
    assert {} == marked.survivors(within_s=3.0)


def test_a_run_that_does_not_stop_in_time_is_pr607_and_a_second_stop_kills_it(tmp_path: Path,
                                                                                marked: Marked) -> None:
    """Instances that ignore SIGTERM outlast ``stop --timeout 1`` (PR607, exit 1); a second stop kills them at once."""
    # GIVEN
    env = runs_env(marked, tmp_path)
    run_id = detach(env, f"trap '' TERM; {TICKING}").stdout.strip()

    # WHEN
    first = poprun(env, "stop", run_id, "--timeout", "1")
    second = poprun(env, "stop", run_id, "--timeout", "5")

    # THEN
    assert_golden(GOLDEN / "PR607_instances_that_ignore_sigterm_outlast_the_timeout",
                  re.sub(r"PID \d+", "PID N", f"{first.stderr}exit {first.returncode}\n".replace(run_id, "RUN")))
    assert 0 == second.returncode
    assert {} == marked.survivors(within_s=3.0)


def test_detach_of_a_saved_plan(tmp_path: Path, marked: Marked) -> None:
    """``poprun apply --detach PLAN.json`` detaches the saved plan's launch; ``logs -f`` then shows all it printed."""
    env = runs_env(marked, tmp_path)
    plan = tmp_path / "plan.json"
    made = poprun(env, "plan", "--format", "json", "-o", str(plan), "sh", "-c", "sleep 0.3; echo saved")
    assert 0 == made.returncode, made.stderr

    started = poprun(env, "apply", "--detach", str(plan), timeout=10)
    logged = poprun(env, "logs", "-f", started.stdout.strip())

    assert (0, 0, "saved\n") == (started.returncode, logged.returncode, logged.stdout)


def test_a_detached_run_holds_no_descriptor_its_caller_passed_down(tmp_path: Path, marked: Marked) -> None:
    """A caller's pipe passed as fd 3 (``3>&1`` in a script whose output is captured) is not held by the run."""
    # GIVEN a script that passes its stdout pipe down as fd 3 too
    env = runs_env(marked, tmp_path)
    script = f"{PY} -m poprun.cli.main --detach sh -c 'sleep 30' 3>&1"

    # WHEN its output is captured (which ends only once every holder of the pipe has closed it)
    started = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=10, check=False)

    # THEN
    assert (0, "") == (started.returncode, started.stderr)
    assert 0 == poprun(env, "stop", started.stdout.strip()).returncode
    assert {} == marked.survivors(within_s=3.0)
