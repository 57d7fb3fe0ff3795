"""The apply step as a library: its events, its result, its stops, and the view of how it ended."""

import json
import signal
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from poprun.apply import Control, apply
from poprun.backends.base import LaunchError
from poprun.backends.conformance import MemorySink, probe_plan
from poprun.backends.registry import BackendRegistry
from poprun.backends.testing import Outcome, RecordingBackend
from poprun.cli.run import exit_status
from poprun.core import events
from poprun.core.diagnostic import error, warning
from poprun.core.outcome import ApplyError, ApplyResult, InstanceFailure
from poprun.core.record import evolve
from poprun.core.span import COMMAND_LINE, SourceSpan
from poprun.planner.plan import Cache
from poprun.render.outcome import render_outcome


class Sink(MemorySink):
    """Keeps the output and every event, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[events.Event] = []

    def event(self, event: events.Event) -> None:
        self.events.append(event)

    def kinds(self) -> list[str]:
        return [e.kind for e in self.events]


def _apply(backend, plan, **kwargs):
    sink = Sink()
    result = apply(plan, sink=sink, registry=BackendRegistry({plan.backend.name: lambda: backend}), env_source={},
                   **kwargs)
    return result, sink


def test_a_successful_apply_reports_its_steps_as_events(tmp_path):
    """Starting, running, ended: in order, with the backend and the instance count; the result is the backend's."""
    result, sink = _apply(RecordingBackend(), probe_plan("pass", tmp_path, backend="local", instances=3))

    assert ["run-started", "launch-starting", "launch-running", "launch-ended", "teardown", "run-ended"] == sink.kinds()
    assert events.RunStarted(run="", backend="local", instances=3, hosts=("localhost",)) == sink.events[0]
    starting = sink.events[1]
    assert isinstance(starting, events.LaunchStarting)
    run_id = dict(starting.variables)["TORCHELASTIC_RUN_ID"]  # a run without a record still has an id for torchrun's
    assert events.LaunchStarting(backend="local", instances=3, variables=(
        ("POPRUN_RESTART_COUNT", "0"), ("TORCHELASTIC_RESTART_COUNT", "0"), ("TORCHELASTIC_RUN_ID", run_id))) == starting
    assert events.LaunchEnded(statuses=(0, 0, 0)) == sink.events[-3]
    assert events.RunEnded(status=0) == sink.events[-1]
    assert (0, None, (), ()) == (result.status, result.error, result.signals, result.warnings)


def test_the_temporary_cache_is_made_passed_in_every_environment_and_removed(tmp_path):
    """A temporary cache: made here (0o700), in every instance's environment and the event, removed at the end."""
    backend = RecordingBackend()
    plan = evolve(probe_plan("pass", tmp_path, backend="local"),
                  cache=Cache(mode="temporary", path=None, per_host=False, remove_at_exit=True))

    _, sink = _apply(backend, plan)

    starting = sink.events[1]
    assert isinstance(starting, events.LaunchStarting) and starting.cache is not None
    assert ("POPDIST_EXECUTABLE_CACHE_PATH", starting.cache) in starting.variables
    assert {starting.cache} == {i.env.get("POPDIST_EXECUTABLE_CACHE_PATH") for i in backend.plans[0].instances}
    assert not (tmp_path / starting.cache).exists()


def test_an_unknown_backend_is_error_with_125(tmp_path):
    """No backend of the plan's name: nothing runs, 125; the run starts and ends, and nothing between."""
    sink = Sink()
    result = apply(probe_plan("pass", tmp_path, backend="nosuch"), sink=sink, registry=BackendRegistry({}),
                   env_source={})

    assert result.error is not None and 125 == result.error.status
    assert "nosuch" in result.error.message
    assert ["run-started", "run-ended"] == [e.kind for e in sink.events]
    assert 125 == sink.events[-1].status and "nosuch" in sink.events[-1].error


def test_a_launch_error_is_error_with_its_status(tmp_path):
    """The backend could not launch: its status and message, the launch announced but never running."""
    result, sink = _apply(RecordingBackend(error=LaunchError("program 'x' not found", status=127)),
                          probe_plan("pass", tmp_path, backend="local"))

    assert ApplyError(status=127, message="program 'x' not found") == result.error
    assert ["run-started", "launch-starting", "teardown", "run-ended"] == sink.kinds()
    assert events.RunEnded(status=127, error="program 'x' not found") == sink.events[-1]


def test_a_failure_is_told_as_stopping_once(tmp_path):
    """Instance events pass through; the first failure is told as the reason for stopping, once."""
    backend = _Emitting({0: 3, 1: 4})
    result, sink = _apply(backend, probe_plan("pass", tmp_path, backend="local"))

    assert [events.Stopping(reason="instance 0 failed")] == [e for e in sink.events if isinstance(e, events.Stopping)]
    assert ["run-started", "launch-starting", "instance-started", "instance-started", "launch-running",
            "instance-ended", "stopping", "instance-ended", "launch-ended", "teardown", "run-ended"] == sink.kinds()
    assert ["localhost", "localhost"] == [e.host for e in sink.events if isinstance(e, events.InstanceStarted)]
    assert 3 == result.status


def test_a_stop_from_another_thread_before_the_launch_stops_it_as_soon_as_it_exists(tmp_path):
    """Control.stop from a thread before the launch: the launch is terminated once started, with the grace."""
    backend = RecordingBackend({0: Outcome(until_stopped=True)})
    control = Control(grace_s=2.0)
    stopper = threading.Thread(target=control.stop, args=(signal.SIGTERM,))
    stopper.start()
    stopper.join()

    result, sink = _apply(backend, probe_plan("pass", tmp_path, backend="local"), control=control)

    assert [2.0] == backend.running[0].terminations
    assert (signal.SIGTERM,) == result.signals
    assert events.Stopping(reason="received SIGTERM") in sink.events


def test_a_second_stop_kills_at_once(tmp_path):
    """Two stops once the launch runs: SIGTERM with the grace, then no grace."""
    backend = RecordingBackend({0: Outcome(until_stopped=True)})
    control = Control(grace_s=2.0)

    class StopTwice(Sink):
        def event(self, event):
            super().event(event)
            if isinstance(event, events.LaunchRunning):
                control.stop(signal.SIGINT)
                control.stop(signal.SIGINT)

    sink = StopTwice()
    result = apply(probe_plan("pass", tmp_path, backend="local"), sink=sink, control=control, env_source={},
                   registry=BackendRegistry({"local": lambda: backend}))

    assert [2.0, 0] == backend.running[0].terminations
    assert (signal.SIGINT, signal.SIGINT) == result.signals
    assert 1 == sum(isinstance(e, events.Stopping) for e in sink.events)
    assert 130 == exit_status(result, failed_output=False)


class _StoppedWhileStarting(RecordingBackend):
    """A backend whose launch is stopped (Control.stop in the main thread, as a signal handler) while it starts."""

    def __init__(self, control, *, started_first):
        super().__init__({0: Outcome(until_stopped=True)})
        self.control, self.started_first = control, started_first
        self.unwound = False

    def launch(self, plan, *, env_source, sink, **kwargs):
        if self.started_first:
            sink.event(events.InstanceStarted(index=0, pid=100))
        try:
            self.control.stop(signal.SIGINT)
        except BaseException:
            self.unwound = True
            raise
        return super().launch(plan, env_source=env_source, sink=sink, **kwargs)


def test_a_stop_once_an_instance_started_waits_for_the_launch_and_gives_the_grace(tmp_path):
    """Ctrl-C after an instance of the attempt started, before the launch returned: SIGTERM with the grace, not an unwind."""
    control = Control(grace_s=2.0)
    backend = _StoppedWhileStarting(control, started_first=True)

    result, _ = _apply(backend, probe_plan("pass", tmp_path, backend="local"), control=control)

    assert (False, [2.0]) == (backend.unwound, backend.running[0].terminations)
    assert (signal.SIGINT,) == result.signals
    assert 130 == exit_status(result, failed_output=False)


def test_a_stop_before_any_instance_started_unwinds_the_start(tmp_path):
    """Ctrl-C while the backend starts and no instance runs yet (a preflight on a silent host): it unwinds at once."""
    control = Control(grace_s=2.0)
    backend = _StoppedWhileStarting(control, started_first=False)

    result, _ = _apply(backend, probe_plan("pass", tmp_path, backend="local"), control=control)

    assert (True, []) == (backend.unwound, backend.running)
    assert 130 == exit_status(result, failed_output=False)


def test_a_closed_output_stream_stops_the_launch_once_as_sigpipe(tmp_path):
    """output_closed twice: one SIGPIPE, one termination with the grace; exit 141 and nothing said."""
    backend = RecordingBackend({0: Outcome(until_stopped=True)})
    control = Control(grace_s=2.0)

    class Closing(Sink):
        def event(self, event):
            super().event(event)
            if isinstance(event, events.LaunchRunning):
                control.output_closed("stdout")
                control.output_closed("stderr")

    sink = Closing()
    result = apply(probe_plan("pass", tmp_path, backend="local"), sink=sink, control=control, env_source={},
                   registry=BackendRegistry({"local": lambda: backend}))

    assert ([2.0], (signal.SIGPIPE,)) == (backend.running[0].terminations, result.signals)
    assert events.Stopping(reason="stdout was closed") in sink.events
    assert (141, "") == (exit_status(result, failed_output=False), render_outcome(result))


class _Emitting(RecordingBackend):
    """A RecordingBackend whose launch also tells each instance starting and ending, as real backends do."""

    def launch(self, plan, *, env_source, sink, **kwargs):
        launch = super().launch(plan, env_source=env_source, sink=sink, **kwargs)
        for instance in plan.instances:
            sink.event(events.InstanceStarted(index=instance.index, pid=100 + instance.index))
        wait = launch.wait

        def wait_and_tell():
            result = wait()
            for index, status in enumerate(result.statuses):
                sink.event(events.InstanceEnded(index=index, pid=100 + index, exit_code=status,
                                                stopped=index != result.root_cause and status != 0))
            return result

        launch.wait = wait_and_tell
        return launch


# -- the events as data --------------------------------------------------------------------

SAMPLES = [
    events.RunStarted(run="20261124-235501-3f9a01", backend="local", instances=2, hosts=("a", "b")),
    events.InstanceStarted(index=0, pid=12, host="h1"),
    events.InstanceOutputTruncated(index=1, kept=1024),
    events.HostChecked(host="h2", ok=False, problem="PR409: 'h2' cannot run the program"),
    events.HealthChecked(host="h3", ok=False, outcome="failed", status=1, ms=210, tail=("gpu 3: ECC errors", "\\x1b[31m")),
    events.HostConnected(host="h3", ms=3400, attempts=2, slow=True),
    events.PhaseEnded(phase="connect", ms=1210, detail="64 hosts through 8 relays, 8 connections at a time"),
    events.Teardown(),
    events.RunEnded(status=3, root_cause=1),
    events.InstanceEnded(index=1, pid=13, signal=9, stopped=True),
    events.PartitionAcquiring(partition="p1"),
    events.PartitionAcquired(),
    events.PartitionReleased(partition="p1"),
    events.LaunchStarting(backend="ssh", instances=4, variables=(("A", "1"), ("B", "x y")), cache="/tmp/c"),
    events.LaunchRunning(),
    events.Stopping(reason="received SIGINT"),
    events.LaunchEnded(statuses=(0, 3), root_cause=1),
    events.AttemptStarted(attempt=1, master_port=29731, chosen=True),
    events.AttemptEnded(attempt=0, status=3, root_cause=1, restart=True, delay_ms=1000,
                        reason="instance 1 exited with 3 on h1; restart 1 of 3 in 1 s"),
    events.Replan(attempt=1, removed=("h3",), added=("h5",), hosts=("h1", "h2", "h5", "h4"), instances=4, replicas=8,
                  reason="h5 replaces h3 (h3: stopped answering (PR411))"),
    events.LimitReached(limit="signal", after_ms=50_000, signal=10),
    events.StacksCollected(instances=(0, 2), how="py-spy"),
    events.MpiWithoutLauncher(index=1, library="/usr/lib/x86_64-linux-gnu/libmpi.so.40"),
    events.InstanceProgressed(index=3, host="h3", attempt=1, step=120, total=200, step_time_ms=20.5, eta_ms=1640,
                              metrics=(("loss", 0.25), ("lr", None), ("phase", "warm-up"))),
]


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: e.kind)
def test_every_event_round_trips_through_json(event):
    """to_dict is JSON, versioned and named by kind; from_dict gives the same event back."""
    data = json.loads(json.dumps(events.to_dict(event)))

    assert (events.VERSION, event.kind) == (data["v"], data["event"])
    assert event == events.from_dict(data)


def test_every_kind_has_a_sample_and_a_unique_name():
    """A new kind of event gets a sample here (and so a round-trip test)."""
    kinds = [cls.kind for cls in events._KINDS.values()]

    assert sorted(kinds) == sorted({e.kind for e in SAMPLES}) == sorted(set(kinds))


@pytest.mark.parametrize("data", [{"v": 1, "event": "from-the-future"}, {"v": 2, "event": "launch-running"},
                                  {"event": "launch-running"}, {}])
def test_an_unknown_kind_or_version_reads_as_none(data):
    """A reader skips what it does not know instead of guessing."""
    assert events.from_dict(data) is None


@given(st.text(), st.lists(st.tuples(st.text(), st.text()), max_size=5))
def test_any_text_round_trips(reason, variables):
    """Any text (quotes, newlines, NUL) survives JSON and back."""
    for event in (events.Stopping(reason=reason),
                  events.LaunchStarting(backend="local", instances=1, variables=tuple(variables))):
        assert event == events.from_dict(json.loads(json.dumps(events.to_dict(event))))


# -- how it ended, as told and as an exit status --------------------------------------------

FAILED = ApplyResult(statuses=(0, 3), root_cause=1,
                     failures=(InstanceFailure(index=1, host="h1", exit_code=3, tail=("bad input",)),))


@pytest.mark.parametrize(("result", "failed_output", "text", "status"), [
    (ApplyResult(statuses=(0,)), False, "", 0),
    (ApplyResult(statuses=(0,)), True, "", 1),
    (FAILED, False, ("poprun: 1 instance failed\n  instance 1 on h1: exited with status 3\n    | bad input\n"
                     "Root cause: instance 1 on h1 exited with status 3\n"), 3),
    (ApplyResult(statuses=(255, 143), root_cause=0, failures=(
        InstanceFailure(index=0, host="h2", exit_code=255, lost=True, via="h1"),
        InstanceFailure(index=1, host="h3", signal=15, stopped=True))), False,
     ("poprun: 2 instances failed\n  instance 0 on h2: lost: host h1, the relay it was reached through, stopped "
      "answering\n  instance 1 on h3: killed by SIGTERM (stopped by poprun)\nRoot cause: error[PR411]: host h1 "
      "stopped answering (the relay through which instance 0 on h2 was reached); every other instance was stopped\n"),
     125),
    (ApplyResult(statuses=(143,), signals=(signal.SIGTERM,)), False, "poprun: stopped by SIGTERM\n", 143),
    (ApplyResult(statuses=(), error=ApplyError(status=127, message="program 'x' not found")), False,
     "poprun: program 'x' not found\n", 127),
    (ApplyResult(statuses=(), error=ApplyError(status=130, signal=2, message="stopped by SIGINT"),
                 signals=(2,)), False, "poprun: stopped by SIGINT\n", 130),
], ids=["success", "output-lost", "failure", "relay-lost", "stopped", "not-found", "stopped-before"])
def test_outcome_text_and_exit_status(result, failed_output, text, status):
    """The view and the exit status of each way an apply ends."""
    assert (text, status) == (render_outcome(result), exit_status(result, failed_output=failed_output))


def test_diagnostics_come_first_then_the_warnings_of_the_end():
    """Nothing started for a coded reason: its diagnostics, then what releasing the partition warned about."""
    result = ApplyResult(statuses=(), error=ApplyError(status=125, diagnostics=(error("PR500", "no server", detail="d", span=SourceSpan(file=COMMAND_LINE, key_path="--vipu-partition"), hint="h"),)),
                         warnings=(warning("PR508", "partition left", detail="d", span=SourceSpan(file=COMMAND_LINE, key_path="--vipu-partition"), hint="h"),))

    text = render_outcome(result)

    assert text.index("PR500") < text.index("PR508")
    assert 125 == exit_status(result, failed_output=False)
