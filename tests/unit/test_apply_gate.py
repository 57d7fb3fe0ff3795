"""The teardown gate (launch(gate=)): apply's relay never waits, the gate does; old plugins get none; the run's state."""

import threading
import time

import pytest

from poprun.apply import Control, apply
from poprun.apply.attempts import Run, RunState
from poprun.apply.control import Stopped
from poprun.apply.limits import Gate
from poprun.apply.relay import Relay
from poprun.backends._plugin import Plugin, make
from poprun.backends.base import accepts_keyword
from poprun.backends.conformance import MemorySink, probe_plan
from poprun.backends.registry import BackendRegistry
from poprun.backends.testing import Outcome, RecordingBackend
from poprun.core import events

pytestmark = pytest.mark.timeout(60)

_HELD_S = 30.0  # far longer than any call that "returns at once" may take, even on a loaded machine


class Sink(MemorySink):
    """Keeps the output and every event, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[events.Event] = []

    def event(self, event: events.Event) -> None:
        self.events.append(event)


def test_an_event_returns_at_once_while_the_gate_holds_the_teardown(tmp_path):
    """A failure's instance-ended passes through the relay at once; only the gate's caller waits, until a stop releases it."""
    # GIVEN a gate closed for a long time (stacks being read under a time limit)
    plan = probe_plan("pass", tmp_path, backend="local")
    sink = Sink()
    relay, gate = Relay(plan, sink, None, {}), Gate()
    gate.close_until(time.monotonic() + _HELD_S)
    # WHEN the backend tells a failure, then awaits the gate in its teardown thread
    began = time.monotonic()
    relay.event(events.InstanceEnded(index=1, pid=42, exit_code=3))
    told_within = time.monotonic() - began
    waiter = threading.Thread(target=gate.wait, daemon=True)
    waiter.start()
    waiter.join(0.2)
    held = waiter.is_alive()
    gate.release()
    waiter.join(_HELD_S)

    # THEN
    assert told_within < _HELD_S / 3
    assert [events.InstanceEnded(index=1, pid=42, exit_code=3),
            events.Stopping(reason="instance 1 failed")] == sink.events
    assert (True, False) == (held, waiter.is_alive())


def test_an_open_gate_returns_at_once():
    """A gate never closed, or closed until a time past, lets the teardown go on."""
    gate = Gate()
    gate.wait()
    gate.close_until(time.monotonic() - 1)
    gate.wait()


def test_apply_hands_the_backend_its_gate_which_a_failure_awaits(tmp_path):
    """The test double, like a backend, awaits apply's gate once after a failure, before the others end."""
    backend = RecordingBackend({0: Outcome(until_stopped=True), 1: 3})
    sink = Sink()

    result = apply(probe_plan("pass", tmp_path, backend="local"), sink=sink, env_source={},
                   registry=BackendRegistry({"local": lambda: backend}))

    assert (3, 1) == (result.status, backend.running[0].gated)


class OldPluginBackend:
    """A plugin written before the gate: its launch has no ``gate`` parameter."""

    name = "old"

    def __init__(self) -> None:
        self.double = RecordingBackend({1: 3})

    def launch(self, plan, *, env_source, sink, cache=None):
        return self.double.launch(plan, env_source=env_source, sink=sink, cache=cache)


@pytest.mark.parametrize("guarded", [False, True], ids=["registered", "entry-point"])
def test_a_plugin_without_a_gate_parameter_is_not_given_one(tmp_path, guarded):
    """A backend whose launch() lacks ``gate`` runs as before (no TypeError), registered directly or as a plugin."""
    old = OldPluginBackend()
    backend = make(lambda: old, Plugin("old", "old_backend:make", None)) if guarded else old
    plan = probe_plan("pass", tmp_path, backend="old")

    result = apply(plan, sink=Sink(), env_source={}, registry=BackendRegistry({"old": lambda: backend}))

    assert (3, None, 0) == (result.status, result.error, old.double.running[0].gated)


def test_accepts_keyword_reads_the_signature():
    """A named parameter or **kwargs takes the keyword; a method's self does not count; a builtin takes none."""

    def named(plan, *, gate=None):
        pass

    def anything(plan, **keywords):
        pass

    def neither(plan, *, cache=None):
        pass

    assert [True, True, False, False, True, False] == [
        accepts_keyword(named, "gate"), accepts_keyword(anything, "gate"), accepts_keyword(neither, "gate"),
        accepts_keyword(len, "gate"), accepts_keyword(RecordingBackend().launch, "gate"),
        accepts_keyword(OldPluginBackend().launch, "self")]


def test_a_stop_raises_only_while_nothing_of_the_attempt_runs():
    """STARTING raises Stopped in the main thread; STARTED, WAITING and ENDED note the stop; FINISHED changes nothing."""
    seen = {}
    for state in RunState:
        control = Control()
        run = Run(control, tell=lambda _why: None, gate=Gate())
        run.state = state
        control.bind(run)
        try:
            control.stop(15)
        except Stopped:
            seen[state.name] = "raised"
        else:
            seen[state.name] = "noted"

    assert {"STARTING": "raised", "STARTED": "noted", "RUNNING": "noted", "WAITING": "noted", "ENDED": "noted",
            "FINISHED": "noted"} == seen


def test_the_run_state_moves_as_its_docstring_says(tmp_path):
    """STARTING, STARTED when an instance starts, RUNNING with the launch, WAITING or ENDED after it, FINISHED last."""
    control = Control()
    run = Run(control, tell=lambda _why: None, gate=Gate())
    launch = RecordingBackend().launch(probe_plan("pass", tmp_path, backend="local"), env_source={}, sink=MemorySink())
    seen = [run.state]
    run.instance_started()
    seen.append(run.state)
    run.running(launch)
    seen.append(run.state)
    run.launch_ended(restarts=True)
    seen.append(run.state)
    run.launching()
    seen.append(run.state)
    run.running(launch)
    run.launch_ended(restarts=False)
    seen.append(run.state)
    run.finish()
    seen.append(run.state)

    assert [RunState.STARTING, RunState.STARTED, RunState.RUNNING, RunState.WAITING, RunState.STARTING,
            RunState.ENDED, RunState.FINISHED] == seen
    assert run.launch is None
