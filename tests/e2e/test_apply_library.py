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
    code = "import os, sys; print(os.getpid(), flush=True); sys.exit(int(os.environ['POPDIST_INSTANCE_INDEX']) * 3)"
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
    assert (3, events.LaunchEnded(statuses=(0, 3), root_cause=1)) == (result.status, back[-1])
    assert "launch-starting" == back[0].kind
