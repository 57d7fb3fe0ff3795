"""
Faults and teardown through the real CLI, checked in the process table (``/proc``).

Every launch here runs in a ``marked`` environment, so that each process of it (poprun, its
watchdog, the instances and what they start in the background) can be found by its marker.
Instances are ``sh -c`` scripts that start a grandchild (``sleep 60 &``) and print
``ready <index> <pid> <cache dir>`` once running.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import Marked, described

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

PY = sys.executable
READY = 'echo "ready $POPDIST_INSTANCE_INDEX $$ $POPDIST_EXECUTABLE_CACHE_PATH"'
RUN_WITH_GRANDCHILD = f"{READY}; sleep 60 & sleep 60"


def start(marked: Marked, cwd: Path, script: str, *, instances: int = 4) -> subprocess.Popen[str]:
    """Start ``poprun sh -c SCRIPT`` with ``instances`` instances, stdout and stderr piped."""
    return subprocess.Popen([PY, "-m", "poprun.cli.main", "--num-instances", str(instances),
                             "--num-replicas", str(instances), "sh", "-c", script],
                            cwd=cwd, env=marked.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def await_ready(proc: subprocess.Popen[str], count: int) -> dict[int, tuple[int, str]]:
    """Read poprun's stdout until ``count`` instances said ready; return {index: (pid, cache dir)}."""
    assert proc.stdout is not None
    found: dict[int, tuple[int, str]] = {}
    while len(found) < count:
        line = proc.stdout.readline()
        assert line, "poprun ended before every instance was ready"
        if line.startswith("ready "):
            _, index, pid, cache = line.split()
            found[int(index)] = (int(pid), cache)
    return found


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str, float]:
    """Wait for poprun; return its status, the rest of its stdout and stderr, and the time.time() it ended."""
    try:
        out, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        print(described([proc.pid]))  # noqa: T201 - shown with the failure: where poprun waits, and its signal masks
        raise
    return proc.returncode, out, err, time.time()


def cache_gone(path: str, *, within_s: float) -> bool:
    """Return whether ``path`` is gone, waiting up to ``within_s``."""
    deadline = time.monotonic() + within_s
    while Path(path).exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return not Path(path).exists()


def test_instance_exiting_3_makes_poprun_exit_3_with_nothing_left_within_1_s(tmp_path: Path, marked: Marked) -> None:
    """Instance 1 exits 3: the three others and their grandchildren are gone and poprun exits 3 within 1 s."""
    # GIVEN
    script = (f'if [ "$POPDIST_INSTANCE_INDEX" = 1 ]; then {READY}; sleep 0.3; echo "failing at $(date +%s.%N)"; '
              f"exit 3; fi; {RUN_WITH_GRANDCHILD}")
    proc = start(marked, tmp_path, script)
    caches = {cache for _, cache in await_ready(proc, 4).values()}

    # WHEN
    status, out, err, ended = finish(proc)

    # THEN
    failed_at = float(re.findall(r"failing at ([\d.]+)", out)[0])
    assert (3, {}) == (status, marked.alive())
    assert ended - failed_at < 1.0
    assert "Root cause: instance 1 on localhost exited with status 3" == err.splitlines()[-1]
    assert [True] == [cache_gone(c, within_s=0) for c in caches]


def test_instance_killed_by_sigkill_makes_poprun_exit_137_and_say_sigkill(tmp_path: Path, marked: Marked) -> None:
    """An instance SIGKILLed from outside: poprun exits 137, the report names SIGKILL, nothing is left."""
    proc = start(marked, tmp_path, RUN_WITH_GRANDCHILD)
    ready = await_ready(proc, 4)
    pid, cache = ready[2]

    os.kill(pid, signal.SIGKILL)
    status, _, err, _ = finish(proc)

    assert (137, {}) == (status, marked.alive())
    assert f"  instance 2 on localhost (PID {pid}): killed by SIGKILL (possibly out of memory)\n" in err
    assert "Root cause: instance 2 on localhost killed by SIGKILL (possibly out of memory)" == err.splitlines()[-1]
    assert cache_gone(cache, within_s=0)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_poprun_leaves_nothing_running_and_exits_128_plus_n(tmp_path: Path, marked: Marked,
                                                                         sig: signal.Signals) -> None:
    """SIGINT (Ctrl-C) or SIGTERM to poprun: every instance and grandchild is gone; exit 130 or 143."""
    proc = start(marked, tmp_path, RUN_WITH_GRANDCHILD)
    ready = await_ready(proc, 4)

    sent = time.time()
    proc.send_signal(sig)
    status, _, err, ended = finish(proc)

    assert (128 + sig, f"poprun: stopped by {sig.name}\n", {}) == (status, err, marked.alive())
    assert ended - sent < 1.0
    assert cache_gone(ready[0][1], within_s=0)


def test_sigkilled_poprun_leaves_no_process_of_the_launch_after_1_s(tmp_path: Path, marked: Marked) -> None:
    """kill -9 of poprun: within 1 s its watchdog has killed every instance and grandchild and removed the cache."""
    # GIVEN
    proc = start(marked, tmp_path, RUN_WITH_GRANDCHILD)
    ready = await_ready(proc, 4)
    deadline = time.monotonic() + 5
    while len(marked.alive()) < 1 + 1 + 4 * 3 and time.monotonic() < deadline:  # poprun, its watchdog, 4 x sh + 2 sleeps
        time.sleep(0.01)

    # WHEN
    proc.kill()
    finish(proc)

    # THEN
    assert {} == marked.survivors(within_s=1.0)
    assert cache_gone(ready[0][1], within_s=1.0)


def test_second_interrupt_kills_instances_that_ignore_sigterm(tmp_path: Path, marked: Marked) -> None:
    """Instances that ignore SIGTERM survive the first Ctrl-C (5 s grace); a second one kills them at once."""
    proc = start(marked, tmp_path, f"trap '' TERM; {READY}; while :; do sleep 0.05; done", instances=2)
    await_ready(proc, 2)

    proc.send_signal(signal.SIGINT)
    time.sleep(0.3)
    still = proc.poll()
    sent = time.time()
    proc.send_signal(signal.SIGINT)
    status, _, _, ended = finish(proc)

    assert (None, 130, {}) == (still, status, marked.alive())
    assert ended - sent < 1.0


def test_descendant_that_left_the_group_dies_with_the_launch(tmp_path: Path, marked: Marked) -> None:
    """A background process that made its own session (setsid) is killed when the launch ends (subreaper)."""
    script = f"setsid sleep 60 & {READY}; sleep 0.2"
    proc = start(marked, tmp_path, script, instances=2)
    await_ready(proc, 2)

    status, _, err, _ = finish(proc)

    assert (0, "", {}) == (status, err, marked.alive())
