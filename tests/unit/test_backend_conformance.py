"""The conformance suite over the built-in backends and the RecordingBackend, and the double's playback."""

import signal

import pytest

from poprun.backends import conformance
from poprun.backends.base import LaunchError
from poprun.backends.conformance import MemorySink, probe_plan
from poprun.backends.local import LocalBackend
from poprun.backends.offline import OfflineBackend
from poprun.backends.registry import BackendRegistry
from poprun.backends.testing import Outcome, RecordingBackend
from poprun.cli.run import run_plan
from tests.runids import without_run_id

pytestmark = pytest.mark.timeout(60)


@pytest.mark.e2e
@conformance.parametrize_backends({"local": LocalBackend, "offline": OfflineBackend})
def test_built_in_backend_passes_the_conformance_suite(factory, check, tmp_path):
    """The local and offline backends pass every check, with real probe processes (ssh, mpirun, slurm: tests/e2e)."""
    check(factory, tmp_path)


@conformance.parametrize(RecordingBackend)
def test_recording_backend_passes_the_checks_without_processes(check, tmp_path):
    """The test double passes every check its (empty) capabilities allow: those that need no real process."""
    check(RecordingBackend, tmp_path)


def test_capabilities_decide_which_checks_apply():
    """A backend's declared capabilities, not its name, choose its checks: mpirun and slurm do not check before start."""
    from poprun.backends.mpirun.backend import MpirunBackend
    from poprun.backends.slurm.backend import SlurmBackend
    from poprun.backends.ssh.backend import SshBackend

    every = [c.name for c in conformance.checks()]
    found = {b.name: [c.name for c in conformance.checks(b)]
             for b in (LocalBackend, OfflineBackend, SshBackend, MpirunBackend, SlurmBackend, RecordingBackend)}

    assert {"local": every, "offline": every, "ssh": every, "mpirun": every[:-2], "slurm": every[:-2],
            "recording": every[:4]} == found


def test_conformance_ids_name_the_checks():
    """Each check has a readable id; those without processes are a subset."""
    names = [c.name for c in conformance.checks()]

    assert ["declares_a_name", "every_instance_succeeds", "terminate_after_the_end_is_harmless",
            "forward_after_the_end_is_harmless", "each_instance_runs_its_plan", "exit_status_propagates",
            "signal_is_reported", "terminate_stops_every_instance", "forward_reaches_every_instance",
            "missing_cwd_is_a_launch_error", "restarts_the_failed_instance_alone"] == names
    assert names[:4] == [c.name for c in conformance.checks(processes=False)]


def test_a_failing_check_says_what_differs(tmp_path):
    """A backend whose instance 1 exits 3 fails the 'every instance succeeds' check with the values."""
    with pytest.raises(AssertionError, match=r"result: expected \(0, \(0, 0\), \(\), None\), got \(3, \(0, 3\)"):
        conformance.checks()[1](lambda: RecordingBackend({1: 3}), tmp_path)


def launch(backend, tmp_path, **env):
    plan = probe_plan("pass", tmp_path, backend=backend.name)
    sink = MemorySink()
    return backend.launch(plan, env_source=env, sink=sink), sink, plan


def test_recording_backend_records_the_plan_and_each_environment(tmp_path):
    """The plan is recorded as given, and each instance's environment follows the local backend's rule."""
    backend = RecordingBackend()
    _, _, plan = launch(backend, tmp_path, CONFORMANCE_FORWARDED="yes", CONFORMANCE_UNSET="no", OTHER="1")
    env = backend.launches[0].environment(1)

    assert (plan,) == backend.plans
    assert ("yes", None, "value-1", "1") == (env.get("CONFORMANCE_FORWARDED"), env.get("CONFORMANCE_UNSET"),
                                             env["CONFORMANCE_SET"], env["OTHER"])


def test_recording_backend_plays_back_an_exit_code(tmp_path):
    """Instance 1 scripted to exit 3: status 3, root cause 1, instance 0 exits 0."""
    result = launch(RecordingBackend({1: 3}), tmp_path)[0].wait()

    assert ((0, 3), 3, 1, 3) == (result.statuses, result.status, result.root_cause, result.failure(1).exit_code)


def test_recording_backend_plays_back_a_signal_and_output(tmp_path):
    """A scripted SIGKILL gives 137; the instance's lines reach the sink and the failure's tail."""
    outcome = Outcome(signal=signal.SIGKILL, stdout=b"loading\n", stderr=b"out of memory\n")
    running, sink, _ = launch(RecordingBackend({0: outcome}), tmp_path)
    result = running.wait()

    assert (137, signal.SIGKILL, ("loading", "out of memory")) == (
        result.status, result.failure(0).signal, result.failure(0).tail)
    assert [("stdout", b"loading\n"), ("stderr", b"out of memory\n")] == sink.written


def test_recording_backend_stops_the_others_after_a_failure(tmp_path):
    """An instance running until stopped ends with SIGTERM, stopped, after another fails; the failure is the cause."""
    result = launch(RecordingBackend({0: 2, 1: Outcome(until_stopped=True)}), tmp_path)[0].wait()

    assert ([(0, 2, None, False), (1, None, signal.SIGTERM, True)], 0) == (
        [(f.index, f.exit_code, f.signal, f.stopped) for f in result.failures], result.root_cause)


def test_recording_backend_terminate_without_grace_kills(tmp_path):
    """terminate(0) ends instances running until stopped with SIGKILL; no root cause; the grace is recorded."""
    backend = RecordingBackend({0: Outcome(until_stopped=True), 1: Outcome(until_stopped=True)})
    running = launch(backend, tmp_path)[0]
    running.terminate(0)
    result = running.wait()

    assert ((137, 137), None, [0]) == (result.statuses, result.root_cause, backend.running[0].terminations)


def test_recording_backend_refuses_to_wait_for_ever(tmp_path):
    """Waiting on an instance that runs until stopped, with nothing to stop it, is a RuntimeError."""
    running = launch(RecordingBackend({1: Outcome(until_stopped=True)}), tmp_path)[0]

    with pytest.raises(RuntimeError, match="instance 1 runs until stopped, and nothing stops it"):
        running.wait()


def test_recording_backend_raises_a_scripted_launch_error_after_recording(tmp_path):
    """With ``error``, the plan is recorded and the error raised."""
    backend = RecordingBackend(error=LaunchError("program 'x' not found", status=127))

    with pytest.raises(LaunchError, match="program 'x' not found"):
        launch(backend, tmp_path)
    assert 1 == len(backend.plans)


def test_run_plan_with_the_recording_backend_starts_no_process(tmp_path, capsys):
    """run_plan gives the root cause's status and reports the failure, all without a process."""
    backend = RecordingBackend({1: Outcome(exit_code=3, stderr=b"bad input\n")})
    plan = probe_plan("pass", tmp_path, backend="local")
    status = run_plan(plan, registry=BackendRegistry({"local": lambda: backend}), env_source={})

    assert (3, (plan,)) == (status, tuple(map(without_run_id, backend.plans)))
    assert "Root cause: instance 1 on localhost exited with status 3" in capsys.readouterr().err
