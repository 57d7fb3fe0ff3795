"""poprun.apply.apply as a library, with the real local backend: the events are the launch, and are JSON."""

import json
import os

import pytest

from poprun.apply import apply
from poprun.backends.conformance import probe_plan
from poprun.core import events
from tests.unit.test_apply import Sink

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]


def test_the_event_stream_of_a_real_launch_is_the_launch(tmp_path):
    """Each instance's pid, its end and the failure, in order, as JSON lines a ledger could append."""
    code = ("import os, sys, time; i = int(os.environ['POPDIST_INSTANCE_INDEX']); print(os.getpid(), flush=True); "
            "time.sleep(i); sys.exit(i * 3)")  # instance 1 fails once instance 0 has ended
    sink = Sink()

    result = apply(probe_plan(code, tmp_path, backend="local", instances=2), sink=sink, env_source=dict(os.environ))

    lines = [json.dumps(events.to_dict(e)) for e in sink.events]
    back = [events.from_dict(json.loads(line)) for line in lines]
    started = {e.index: e.pid for e in back if isinstance(e, events.InstanceStarted)}
    ended = {e.index: e.status for e in back if isinstance(e, events.InstanceEnded)}
    printed = sorted(int(line) for line in sink.lines())
    assert back == sink.events
    assert (sorted(started.values()), {0: 0, 1: 3}) == (printed, ended)
    assert [events.Stopping(reason="instance 1 failed")] == [e for e in back if isinstance(e, events.Stopping)]
    assert (3, events.LaunchEnded(statuses=(0, 3), root_cause=1)) == (result.status, back[-3])
    assert (["run-started", "launch-starting"], ["teardown", "run-ended"]) == ([e.kind for e in back[:2]],
                                                                               [e.kind for e in back[-2:]])


def test_the_example_in_the_docs_runs_a_saved_plan(tmp_path):
    """docs/apply.md's example, run as written on a saved plan of two instances: output, events, status."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    page = (Path(__file__).parents[2] / "docs" / "apply.md").read_text()
    code = re.search(r"```python\n(.*?)```", page, re.DOTALL).group(1)
    saved = subprocess.run([sys.executable, "-m", "poprun.cli.main", "plan", "--format", "json", "-o", "plan.json",
                            "--num-instances", "2", "--num-replicas", "2", "--offline-mode=on", "sh", "-c",
                            'echo hi $POPDIST_INSTANCE_INDEX; exit "$POPDIST_INSTANCE_INDEX"'],
                           cwd=tmp_path, capture_output=True, text=True, check=False)
    assert 0 == saved.returncode, saved.stderr

    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=30,
                         check=False)

    assert 0 == run.returncode, run.stderr
    assert {"stdout: hi 0", "stdout: hi 1"} <= set(run.stdout.splitlines()), run.stdout
    assert "'event': 'launch-ended', 'statuses': [0, 1], 'root_cause': 1" in run.stdout
    assert run.stdout.splitlines()[-1] == "1 1 None"
