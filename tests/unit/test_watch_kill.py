"""Ending one instance alone: the kill script touches only the processes of that run, instance and restart count."""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from poprun.apply.stacks import end_instance, kill_script

RUN = "20990101-000000-abcdef"


def sleeper(**env: str) -> subprocess.Popen[bytes]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("POPRUN_", "POPDIST_"))}
    return subprocess.Popen(["sleep", "60"], env=clean | env)


def test_only_the_instance_of_that_run_and_restart_count_is_killed_even_stopped():
    """A stopped target dies; the same index of another run, or of another restart, and another index live on."""
    target = sleeper(POPRUN_RUN_ID=RUN, POPDIST_INSTANCE_INDEX="1", POPRUN_RESTART_COUNT="0")
    others = [sleeper(POPRUN_RUN_ID=RUN, POPDIST_INSTANCE_INDEX="1", POPRUN_RESTART_COUNT="1"),
              sleeper(POPRUN_RUN_ID=RUN + "x", POPDIST_INSTANCE_INDEX="1", POPRUN_RESTART_COUNT="0"),
              sleeper(POPRUN_RUN_ID=RUN, POPDIST_INSTANCE_INDEX="11", POPRUN_RESTART_COUNT="0")]
    try:
        time.sleep(0.2)  # each has exec'd sleep with its environment
        os.kill(target.pid, 19)  # SIGSTOP: a hung instance

        why = end_instance(object(), "localhost", RUN, 1, 0, environ=os.environ, timeout_s=30)

        assert "" == why
        assert -9 == target.wait(timeout=10)
        assert [None, None, None] == [p.poll() for p in others]
    finally:
        for proc in (target, *others):
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("run", ["", "a b", "x;rm -rf /", "$(id)", "-x"])
def test_a_run_id_that_is_not_one_is_refused_before_any_script(run):
    """The run id travels into the script quoted, and only once it is checked to be a run id."""
    with pytest.raises(ValueError, match="is not a run id"):
        kill_script(run, 1, 0)
