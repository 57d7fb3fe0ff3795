"""poprun.apply.apply under a hostile caller: a sink that raises or is slow, stops from other threads, a reused Control."""

import os
import signal
import threading
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from poprun.apply import Control, apply
from poprun.backends.conformance import probe_plan
from poprun.backends.registry import BackendRegistry
from poprun.backends.testing import Outcome, RecordingBackend
from poprun.core import events
from tests.unit.test_apply import Sink

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]
SLEEPS = "import time; print('up', flush=True); time.sleep(30)"


def _alive(pids):
    """Return those of ``pids`` that still run (a zombie counts as gone)."""
    alive = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                if stat.read().rsplit(")", 1)[1].split()[0] != "Z":
                    alive.append(pid)
        except OSError:
            pass
    return alive


class _RaisingAt(Sink):
    """A sink whose event() raises at the first event of one kind."""

    def __init__(self, kind):
        super().__init__()
        self.kind = kind

    def event(self, event):
        super().event(event)
        if event.kind == self.kind:
            raise RuntimeError(f"the sink failed at {event.kind}")


@pytest.mark.parametrize("kind", ["instance-started", "launch-running", "instance-ended"])
def test_a_sink_that_raises_leaves_no_instance_running(tmp_path, kind):
    """The sink's exception comes out of apply(), and only once every instance has been stopped."""
    sink = _RaisingAt(kind)
    code = SLEEPS if kind != "instance-ended" else "import os, sys; sys.exit(int(os.environ['POPDIST_INSTANCE_INDEX']))"

    with pytest.raises(RuntimeError, match=kind):
        apply(probe_plan(code, tmp_path, backend="local", instances=2), sink=sink, env_source=dict(os.environ),
              control=Control(grace_s=0.2))

    pids = [e.pid for e in sink.events if isinstance(e, events.InstanceStarted)]
    assert pids
    assert [] == _alive(pids)


class _Slow(Sink):
    """A sink that takes its time over every line and event."""

    def write(self, stream, data):
        time.sleep(0.01)
        super().write(stream, data)

    def event(self, event):
        time.sleep(0.01)
        super().event(event)


def test_a_slow_sink_gets_every_line_and_event_in_order(tmp_path):
    """Nothing is dropped or reordered because the sink is slow; every instance starts before it ends."""
    code = "import os; i = os.environ['POPDIST_INSTANCE_INDEX']; [print(i, n, flush=True) for n in range(50)]"
    sink = _Slow()

    result = apply(probe_plan(code, tmp_path, backend="local", instances=3), sink=sink, env_source=dict(os.environ))

    assert 0 == result.status
    for index in range(3):
        assert [f"{index} {n}" for n in range(50)] == [line for line in sink.lines() if line.startswith(f"{index} ")]
    _assert_ordered(sink.events, launched=True)


def _assert_ordered(seen, *, launched):
    kinds = [e.kind for e in seen]
    assert 1 == kinds.count("launch-starting")
    assert kinds.count("stopping") <= 1
    assert ("run-started", "run-ended") == (kinds[0], kinds[-1])
    assert 1 == kinds.count("run-started") == kinds.count("run-ended")
    if launched:
        assert 1 == kinds.count("launch-ended")
        assert ["launch-ended", "teardown", "run-ended"] == kinds[-3:]
        started = {e.index: n for n, e in enumerate(seen) if isinstance(e, events.InstanceStarted)}
        for n, e in enumerate(seen):
            if isinstance(e, events.InstanceEnded) and e.index in started:
                assert started[e.index] < n


@pytest.mark.parametrize("when", ["before", "during"])
def test_a_stop_from_another_thread_stops_the_launch(tmp_path, when):
    """Control.stop from another thread, before apply() or while the instances run: every instance stops, 128+N."""
    control = Control(grace_s=0.2)
    sink = Sink()
    if when == "before":
        threading.Thread(target=control.stop, args=(signal.SIGTERM,)).start()
    else:
        threading.Timer(1.0, control.stop, (signal.SIGTERM,)).start()

    result = apply(probe_plan(SLEEPS, tmp_path, backend="local", instances=2), sink=sink, env_source=dict(os.environ),
                   control=control)

    assert ((signal.SIGTERM,), None) == (result.signals, result.root_cause)
    assert [events.Stopping(reason="received SIGTERM")] == [e for e in sink.events if isinstance(e, events.Stopping)]
    assert [] == _alive([e.pid for e in sink.events if isinstance(e, events.InstanceStarted)])
    _assert_ordered(sink.events, launched=True)


def test_a_stop_after_the_launch_and_a_second_stop_change_nothing(tmp_path):
    """Stopping an apply that has returned, twice, neither raises nor tells of stopping."""
    control = Control()
    sink = Sink()
    result = apply(probe_plan("pass", tmp_path, backend="local"), sink=sink, env_source={}, control=control)

    threading.Thread(target=control.stop, args=(signal.SIGINT,)).start()
    control.stop(signal.SIGINT)
    control.output_closed("stdout")
    control.output_closed("stdout")

    assert 0 == result.status
    assert [] == [e for e in sink.events if isinstance(e, events.Stopping)]


def test_output_closed_from_the_backends_thread_stops_the_launch_once(tmp_path):
    """A sink whose reader is gone calls output_closed from the backend's thread: one stop, SIGPIPE, no instance left."""
    control = Control(grace_s=0.2)

    class Closed(Sink):
        def write(self, stream, _data):
            control.output_closed(stream)
            control.output_closed(stream)

    sink = Closed()
    result = apply(probe_plan("import time; print('x', flush=True); time.sleep(30)", tmp_path, backend="local",
                              instances=2), sink=sink, env_source=dict(os.environ), control=control)

    assert (signal.SIGPIPE,) == result.signals
    assert 1 == [e.kind for e in sink.events].count("stopping")
    assert [] == _alive([e.pid for e in sink.events if isinstance(e, events.InstanceStarted)])


def test_a_control_that_stopped_keeps_the_next_apply_stopped(tmp_path):
    """A Control is one per apply: used again after a stop, the second launch is stopped at once too (not run)."""
    control = Control(grace_s=0)
    backend = RecordingBackend({0: Outcome(until_stopped=True)})
    registry = BackendRegistry({"local": lambda: backend})
    plan = probe_plan("pass", tmp_path, backend="local")
    threading.Thread(target=control.stop, args=(signal.SIGTERM,)).start()
    first = apply(plan, sink=Sink(), registry=registry, env_source={}, control=control)

    second = apply(plan, sink=Sink(), registry=registry, env_source={}, control=control)

    assert (128 + signal.SIGKILL, 128 + signal.SIGKILL) == (first.statuses[0], second.statuses[0])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(outcomes=st.lists(st.sampled_from([Outcome(), Outcome(exit_code=3), Outcome(signal=9),
                                          Outcome(until_stopped=True)]), min_size=1, max_size=4),
       stop=st.booleans())
def test_events_are_ordered_whatever_the_instances_do(tmp_path, outcomes, stop):
    """One run-started (first) and run-ended (last), one launch-starting and launch-ended, at most one stopping."""
    if any(o.until_stopped for o in outcomes) and not any(o.exit_code or o.signal for o in outcomes) and not stop:
        outcomes = [*outcomes, Outcome(exit_code=1)]  # something must end it
    backend = RecordingBackend(dict(enumerate(outcomes)))
    control = Control(grace_s=0)
    if stop:
        threading.Thread(target=control.stop, args=(signal.SIGINT,)).start()
    sink = Sink()

    apply(probe_plan("pass", tmp_path, backend="local", instances=len(outcomes)), sink=sink,
          registry=BackendRegistry({"local": lambda: backend}), env_source={}, control=control)

    _assert_ordered(sink.events, launched=True)
