"""
Test support: the conformance checks every backend must pass, as a parametrised pytest suite.

Layer: ``poprun.backends``; imports :mod:`poprun.backends.base` and ``poprun.planner.plan`` (with
the traits and settings tables), never the spec or the solver (plans are built here directly,
with the backend's traits and the settings it reads, from the target's environment). pytest is imported only inside
:func:`parametrize`, so importing this module costs nothing at run time. Each check takes a
backend factory, a scratch directory and a :class:`Target` (where the instances run: this
machine by default) and raises :class:`AssertionError` on failure (also under ``python -O``).
A backend package runs them the way submitit runs ``test_executors``::

    from poprun.backends import conformance

    @conformance.parametrize(MyBackend)
    def test_conformance(check, tmp_path):
        check(MyBackend, tmp_path)

A check that needs more than the protocol promises names the capability it needs
(:data:`~poprun.backends.base.PROCESSES`: the instances are real processes that run
``sys.executable -c ...`` probes; :data:`~poprun.backends.base.CHECKS_BEFORE_START`: a plan that
cannot start raises from ``launch``; :data:`~poprun.backends.base.RESTARTS_INSTANCES`: ``launch``
takes a :class:`~poprun.backends.base.Restarter` and starts a failed instance again alone), and
runs only on backends that declare it in their ``capabilities``. A test double that starts no process declares none and runs only the others.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from poprun.backends.base import (
    CHECKS_BEFORE_START,
    PROCESSES,
    RESTARTS_INSTANCES,
    ApplyResult,
    Backend,
    Event,
    InstanceEnded,
    InstanceStarted,
    Launch,
    LaunchError,
    Stream,
    capabilities,
)
from poprun.core.record import evolve, positional_record, record
from poprun.core.threads import spawn
from poprun.planner import plan as p

if TYPE_CHECKING:
    import pytest

BackendFactory = Callable[[], Backend]
WAIT_S = 20.0  # the longest any check waits for a launch to end
_STOP_S = 10.0  # the longest a launch may take to end after terminate(1.0)
_PROBE = ("import json, os, sys; print(json.dumps({'index': os.environ.get('POPDIST_INSTANCE_INDEX'), "
          "'set': os.environ.get('CONFORMANCE_SET'), 'forwarded': os.environ.get('CONFORMANCE_FORWARDED'), "
          "'unset': os.environ.get('CONFORMANCE_UNSET'), 'cwd': os.getcwd()}))")
_EXIT_3_ON_1 = "import os, sys; sys.exit(3 if os.environ['POPDIST_INSTANCE_INDEX'] == '1' else 0)"
_KILLED_ON_1 = ("import os, signal; i = os.environ['POPDIST_INSTANCE_INDEX']; "
                "os.kill(os.getpid(), signal.SIGKILL) if i == '1' else None")
_SLEEP = "import time; time.sleep(60)"
# Each instance says it is ready once its SIGUSR1 handler is in place, then says which signal it got (within 15 s)
_FORWARDED = ("import signal, time; got = []; signal.signal(signal.SIGUSR1, lambda n, _f: got.append(n)); "
              "print('ready', flush=True)\n"
              "deadline = time.monotonic() + 15\n"
              "while not got and time.monotonic() < deadline: time.sleep(0.01)\n"
              "print(f'got {got[0]}' if got else 'got nothing', flush=True)")
# Instance 1 fails on its first run and, started again (POPRUN_RESTART_COUNT=1), leaves a file that
# instance 0 waits for: instance 0 ends well only if it ran on meanwhile (a shared working directory)
_FAILS_ONCE_ON_1 = ("import os, sys, time; i = os.environ['POPDIST_INSTANCE_INDEX']; "
                    "n = os.environ.get('POPRUN_RESTART_COUNT', '0'); print(f'run {i} {n}', flush=True)\n"
                    "if i == '1': open('restarted', 'w').close() if n == '1' else None; sys.exit(0 if n == '1' else 5)\n"
                    "deadline = time.monotonic() + 15\n"
                    "while not os.path.exists('restarted') and time.monotonic() < deadline: time.sleep(0.02)\n"
                    "sys.exit(0 if os.path.exists('restarted') else 7)")


class MemorySink:
    """An output sink that keeps every write, in order."""

    def __init__(self) -> None:
        self.written: list[tuple[Stream, bytes]] = []

    def write(self, stream: Stream, data: bytes) -> None:
        """Keep ``data``."""
        self.written.append((stream, data))

    def data(self, stream: Stream = "stdout") -> bytes:
        """Return everything written to ``stream``."""
        return b"".join(d for s, d in self.written if s == stream)

    def lines(self, stream: Stream = "stdout") -> list[str]:
        """Return the lines written to ``stream``."""
        return self.data(stream).decode().splitlines()


class EventSink(MemorySink):
    """A :class:`MemorySink` that also keeps every event (an :class:`~poprun.backends.base.EventSink`)."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[Event] = []

    def event(self, event: Event) -> None:
        """Keep ``event``."""
        self.events.append(event)


class RestartOnce:
    """
    A :class:`~poprun.backends.base.Restarter` double: instance ``index`` starts again once, after ``delay_s``.

    Its restarted run gets ``POPRUN_RESTART_COUNT=1``. ``asked`` keeps what :meth:`restart_after` was asked.
    """

    def __init__(self, index: int = 1, delay_s: float = 0.1) -> None:
        self.index, self.delay_s, self.restarted = index, delay_s, False
        self.asked: list[tuple[InstanceEnded, float]] = []

    def restart_after(self, ended: InstanceEnded, uptime_s: float) -> float | None:
        """Return ``delay_s`` for the first failure of instance ``index``, else None."""
        self.asked.append((ended, uptime_s))
        return self.delay_s if ended.index == self.index and not self.restarted else None

    def prepare(self, index: int) -> dict[str, str]:
        """Return the restart count of the run to come (instance ``index`` is this double's)."""
        _expect(self.index, index, "the instance prepared")
        self.restarted = True
        return {"POPRUN_RESTART_COUNT": "1"}


@record
class Target:
    """
    Where the checks run a backend's instances: instance ``i`` on ``hosts[i % len(hosts)]``.

    ``env`` is added to the launching environment (an ssh configuration, a Slurm allocation's
    variables). The working directory and ``sys.executable`` must exist at the same paths on
    every host (a shared file system).
    """

    hosts: tuple[str, ...] = ("localhost",)
    env: tuple[tuple[str, str], ...] = ()


LOCAL = Target()


def probe_plan(code: str, workdir: Path, *, backend: str, instances: int = 2,
               hosts: tuple[str, ...] = ("localhost",), environ: Mapping[str, str] | None = None) -> p.LaunchPlan:
    """
    Return a plan of ``instances`` instances of ``sys.executable -c code`` over ``hosts`` (round robin), in ``workdir``.

    With ``environ``, the plan's backend record carries the built-in's traits and the settings
    it reads as ``environ`` sets them (:func:`planned_backend`), as the solver would record them.
    """
    placed = [hosts[i % len(hosts)] for i in range(instances)]
    used = tuple(dict.fromkeys(placed))
    return p.LaunchPlan(
        poprun_version="conformance",
        topology=p.Topology(num_replicas=instances, num_instances=instances, num_ilds=1, ipus_per_replica=1,
                            hosts=used, num_ipus=instances, replicas_per_instance=1,
                            instances_per_host=instances // len(used), instances_per_ild=instances),
        instances=tuple(_instance(i, code, workdir, placed) for i in range(instances)),
        partition=None, offline=True, offline_target=None,
        output=p.Output(tag=False, output_filename=None, only_from_instance=None, print_topology=False,
                        verbosity=0),
        cache=p.Cache(mode="disabled", path=None, per_host=False, remove_at_exit=False),
        mpi=p.Mpi(global_args=(), host_subnet=None, allow_run_as_root=False),
        ssh_keys=p.SshKeyDistribution(enabled=False, key_path=None, key_type=None),
        backend=_probe_choice(backend, environ), explanation=(), warnings=())


def _probe_choice(name: str, environ: Mapping[str, str] | None) -> p.BackendChoice:
    choice = p.BackendChoice(name=name, reason="conformance check")
    return choice if environ is None else planned_backend(None, choice, environ)


def _instance(index: int, code: str, workdir: Path, placed: list[str]) -> p.Instance:
    env = p.Environment(set=(("CONFORMANCE_SET", f"value-{index}"), ("POPDIST_INSTANCE_INDEX", str(index))),
                        forward=("PATH", "CONFORMANCE_FORWARDED"), unset=("CONFORMANCE_UNSET",))
    host = placed[index]
    return p.Instance(index=index, host=host, local_index=placed[:index].count(host), ild=0, gcd=index,
                      replica_offset=index, num_local_replicas=1, argv=(sys.executable, "-c", code), cwd=str(workdir),
                      env=env, placement=p.Placement(numa_aware=False, strategy="none"), mpi_local_args=())


def _env_source(target: Target) -> dict[str, str]:
    return (dict(os.environ) | dict(target.env)
            | {"CONFORMANCE_FORWARDED": "from-the-shell", "CONFORMANCE_UNSET": "must-not-arrive"})


def _expect(expected: object, actual: object, what: str) -> None:
    if expected != actual:
        msg = f"{what}: expected {expected!r}, got {actual!r}"
        raise AssertionError(msg)


def _wait(launch: Launch, within_s: float = WAIT_S) -> ApplyResult:
    """Return ``launch.wait()``; kill the launch and fail when it takes longer than ``within_s``."""
    box: list[ApplyResult] = []
    waiter = spawn(lambda: box.append(launch.wait()))
    waiter.join(within_s)
    if not box:
        launch.terminate(0)
        msg = f"the launch did not end within {within_s} s"
        raise AssertionError(msg)
    return box[0]


def _plan(backend: Backend, code: str, workdir: Path, target: Target) -> p.LaunchPlan:
    """Return the probe plan of ``code`` for ``backend``, with its traits and its settings as the target's environment sets them."""
    plan = probe_plan(code, workdir, backend=backend.name, hosts=target.hosts)
    return evolve(plan, backend=planned_backend(backend, plan.backend, _env_source(target)))


def planned_backend(backend: object, choice: p.BackendChoice, environ: Mapping[str, str]) -> p.BackendChoice:
    """
    Return ``choice`` with ``backend``'s traits and the settings it reads, decided from ``environ`` as the solver does.

    ``backend``: the backend object (a plugin's declared traits and settings), or None for the
    built-in named by ``choice`` (the table's).

    Raises:
        AssertionError: when ``environ`` sets one of them to a value it does not take (PR225).
    """
    from poprun.planner.setting import Setting, backend_rows, plan_settings
    from poprun.planner.trait import builtin_traits, traits_of

    declared = getattr(backend, "settings", ())
    rows = backend_rows(choice.name, tuple(r for r in declared if isinstance(r, Setting)))
    settings, problems = plan_settings(rows, environ)
    if problems:
        raise AssertionError("; ".join(d.detail for d in problems))
    traits = traits_of(backend) if backend is not None else builtin_traits(choice.name)
    return evolve(choice, traits=traits, settings=settings)


def _run(factory: BackendFactory, code: str, workdir: Path, target: Target) -> tuple[ApplyResult, MemorySink]:
    backend, sink = factory(), MemorySink()
    return _wait(backend.launch(_plan(backend, code, workdir, target), env_source=_env_source(target), sink=sink)), sink


def check_declares_a_name(factory: BackendFactory, _workdir: Path, _target: Target = LOCAL) -> None:
    """Check that the backend class declares a non-empty ``name`` (the name plans and the registry use)."""
    name = getattr(factory().__class__, "name", None)  # not type(): a plugin's guard shows the plugin's class
    if not isinstance(name, str) or not name:
        msg = f"a backend class declares a non-empty str 'name', found {name!r}"
        raise AssertionError(msg)


def check_every_instance_succeeds(factory: BackendFactory, workdir: Path, target: Target = LOCAL) -> None:
    """Check that 2 instances exiting 0 give status 0, one status per instance and no failure."""
    result, _ = _run(factory, "pass", workdir, target)
    _expect((0, (0, 0), (), None), (result.status, result.statuses, result.failures, result.root_cause), "result")


def check_terminate_after_the_end_is_harmless(factory: BackendFactory, workdir: Path, target: Target = LOCAL) -> None:
    """Check that ``terminate`` after ``wait`` returned raises nothing."""
    backend = factory()
    launch = backend.launch(_plan(backend, "pass", workdir, target), env_source=_env_source(target),
                            sink=MemorySink())
    _wait(launch)
    launch.terminate(0)
    launch.terminate(1.0)


def check_forward_after_the_end_is_harmless(factory: BackendFactory, workdir: Path, target: Target = LOCAL) -> None:
    """Check that the launch declares ``forward`` and that calling it after ``wait`` returned raises nothing."""
    backend = factory()
    launch = backend.launch(_plan(backend, "pass", workdir, target), env_source=_env_source(target),
                            sink=MemorySink())
    _wait(launch)
    launch.forward(signal.SIGUSR1)
    launch.forward(signal.SIGCONT)


def check_each_instance_runs_its_plan(factory: BackendFactory, workdir: Path, target: Target = LOCAL) -> None:
    """Check that every instance runs once, in the plan's cwd, with its set, forwarded and unset variables."""
    result, sink = _run(factory, _PROBE, workdir, target)
    seen = sorted((json.loads(line) for line in sink.lines() if line.startswith("{")), key=lambda r: str(r["index"]))
    expected = [{"index": str(i), "set": f"value-{i}", "forwarded": "from-the-shell", "unset": None,
                 "cwd": str(workdir)} for i in range(2)]
    _expect(0, result.status, "status")
    _expect(expected, seen, "what each instance saw")


def check_exit_status_propagates(factory: BackendFactory, workdir: Path, target: Target = LOCAL) -> None:
    """Check that when instance 1 exits 3, the launch's status is 3 and instance 1 is the root cause."""
    result, _ = _run(factory, _EXIT_3_ON_1, workdir, target)
    cause = result.failure(result.root_cause)
    _expect((3, 1, 3), (result.status, result.root_cause, cause and cause.exit_code), "status, root cause, exit code")


def check_signal_is_reported(factory: BackendFactory, workdir: Path, target: Target = LOCAL) -> None:
    """Check that when instance 1 is killed by SIGKILL, the status is 137 and its failure names the signal."""
    result, _ = _run(factory, _KILLED_ON_1, workdir, target)
    cause = result.failure(result.root_cause)
    _expect((137, signal.SIGKILL), (result.status, cause and cause.signal), "status and signal")


def check_terminate_stops_every_instance(factory: BackendFactory, workdir: Path, target: Target = LOCAL) -> None:
    """Check that ``terminate`` stops instances that would run for a minute, none of them a root cause."""
    backend = factory()
    launch = backend.launch(_plan(backend, _SLEEP, workdir, target), env_source=_env_source(target),
                            sink=MemorySink())
    launch.terminate(1.0)
    result = _wait(launch, within_s=_STOP_S)
    stopped = sorted(f.index for f in result.failures if f.stopped)
    _expect(([0, 1], None), (stopped, result.root_cause), "stopped instances and root cause")


def check_forward_reaches_every_instance(factory: BackendFactory, workdir: Path, target: Target = LOCAL) -> None:
    """Check that ``forward(SIGUSR1)`` reaches every running instance (``--signal``), which handles it and ends well."""
    backend, sink = factory(), MemorySink()
    launch = backend.launch(_plan(backend, _FORWARDED, workdir, target), env_source=_env_source(target), sink=sink)
    began = time.monotonic()  # both handlers in place first: what a real --signal meets, seconds in
    while sink.lines().count("ready") < 2 and time.monotonic() - began < WAIT_S:  # noqa: PLR2004 - two instances
        time.sleep(0.05)
    launch.forward(signal.SIGUSR1)
    result = _wait(launch)
    got = sorted(line for line in sink.lines() if line.startswith("got "))
    _expect((0, [f"got {int(signal.SIGUSR1)}"] * 2), (result.status, got), "status, and what each instance got")


def check_missing_cwd_is_a_launch_error(factory: BackendFactory, workdir: Path, target: Target = LOCAL) -> None:
    """Check that ``launch`` raises :class:`LaunchError` for a plan whose working directory is gone."""
    backend = factory()
    plan = _plan(backend, "pass", workdir / "gone", target)
    try:
        launch = backend.launch(plan, env_source=_env_source(target), sink=MemorySink())
    except LaunchError:
        return
    _wait(launch)
    msg = "launch() returned for a plan whose working directory does not exist"
    raise AssertionError(msg)


def check_restarts_the_failed_instance_alone(factory: BackendFactory, workdir: Path, target: Target = LOCAL) -> None:
    """
    Check that instance 1, failing once and started again by the restarter, ends well while instance 0 runs on.

    The events say that instance 1 ended restarting, then started again (``restart=1``), and
    that instance 0 started once and was never stopped; the statuses are those of the last runs.
    """
    backend, sink, restarter = factory(), EventSink(), RestartOnce()
    plan = _plan(backend, _FAILS_ONCE_ON_1, workdir, target)
    launch = backend.launch(plan, env_source=_env_source(target), sink=sink, restarter=restarter)  # type: ignore[call-arg]
    result = _wait(launch)
    seen = [(type(e).__name__, e.index, getattr(e, "restart", None), getattr(e, "restarting", None))
            for e in sink.events if isinstance(e, InstanceStarted | InstanceEnded)]
    _expect((0, (0, 0), ()), (result.status, result.statuses, result.failures), "status, statuses, failures")
    _expect([("InstanceStarted", 1, 0, None), ("InstanceEnded", 1, None, True), ("InstanceStarted", 1, 1, None),
             ("InstanceEnded", 1, None, False)], [s for s in seen if s[1] == 1], "instance 1's events")
    _expect([("InstanceStarted", 0, 0, None), ("InstanceEnded", 0, None, False)], [s for s in seen if s[1] == 0],
            "instance 0's events")
    _expect([(1, 5)], [(e.index, e.status) for e, _ in restarter.asked], "what the restarter was asked")
    _expect(["run 0 0", "run 1 0", "run 1 1"], sorted(line for line in sink.lines() if line.startswith("run ")),
            "the runs")


@positional_record
class Check:
    """One conformance check; ``needs``: the capabilities a backend must declare for it to apply."""

    run: Callable[[BackendFactory, Path, Target], None]
    needs: frozenset[str] = frozenset()

    @property
    def name(self) -> str:
        """The check's name without its ``check_`` prefix, for test ids."""
        return self.run.__name__.removeprefix("check_")

    @property
    def processes(self) -> bool:
        """Whether the check runs real processes (it needs :data:`~poprun.backends.base.PROCESSES`)."""
        return PROCESSES in self.needs

    def applies_to(self, backend: object) -> bool:
        """Return whether ``backend`` (a backend, its class or factory) declares every capability this check needs."""
        return self.needs <= capabilities(backend)

    def __call__(self, factory: BackendFactory, workdir: Path, target: Target = LOCAL) -> None:
        """Run the check on backends made by ``factory``, with scratch directory ``workdir``, on ``target``."""
        self.run(factory, workdir, target)


_REAL = frozenset({PROCESSES})
CHECKS = (
    Check(check_declares_a_name),
    Check(check_every_instance_succeeds),
    Check(check_terminate_after_the_end_is_harmless),
    Check(check_forward_after_the_end_is_harmless),
    Check(check_each_instance_runs_its_plan, _REAL),
    Check(check_exit_status_propagates, _REAL),
    Check(check_signal_is_reported, _REAL),
    Check(check_terminate_stops_every_instance, _REAL),
    Check(check_forward_reaches_every_instance, _REAL),
    Check(check_missing_cwd_is_a_launch_error, frozenset({PROCESSES, CHECKS_BEFORE_START})),
    Check(check_restarts_the_failed_instance_alone, frozenset({PROCESSES, RESTARTS_INSTANCES})),
)


def checks(backend: object = None, *, processes: bool = True) -> tuple[Check, ...]:
    """
    Return the checks that apply to ``backend`` (a backend, its class or factory), by its capabilities.

    Without ``backend``: every check, or (``processes`` False) only those that start no real process.
    """
    if backend is not None:
        return tuple(c for c in CHECKS if c.applies_to(backend))
    return tuple(c for c in CHECKS if processes or not c.processes)


def parametrize(backend: object = None, *, processes: bool = True) -> pytest.MarkDecorator:
    """Return ``pytest.mark.parametrize("check", ...)`` over :func:`checks`, with readable ids."""
    import pytest

    chosen = checks(backend, processes=processes)
    return pytest.mark.parametrize("check", chosen, ids=[c.name for c in chosen])


def parametrize_backends(factories: Mapping[str, BackendFactory]) -> pytest.MarkDecorator:
    """
    Return ``pytest.mark.parametrize(("factory", "check"), ...)``: each backend with the checks that apply to it.

    ``factories`` maps a name (for test ids: ``local-signal_is_reported``) to a backend class
    or factory; which checks apply is read from the class's ``capabilities``.
    """
    import pytest

    cases = [pytest.param(factory, check, id=f"{name}-{check.name}")
             for name, factory in factories.items() for check in checks(factory)]
    return pytest.mark.parametrize(("factory", "check"), cases)


__all__ = ["CHECKS", "LOCAL", "BackendFactory", "Check", "EventSink", "MemorySink", "RestartOnce", "Target", "checks",
           "parametrize", "parametrize_backends", "planned_backend", "probe_plan"]
