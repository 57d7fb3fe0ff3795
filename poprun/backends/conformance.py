"""
Test support: the conformance checks every backend must pass, as a parametrised pytest suite.

Layer: ``poprun.backends``; imports :mod:`poprun.backends.base` and ``poprun.planner.plan``,
never the spec or the solver (plans are built here directly). pytest is imported only inside
:func:`parametrize`, so importing this module costs nothing at run time. Each check takes a
backend factory and a scratch directory and raises :class:`AssertionError` on failure (also
under ``python -O``). A backend package runs them the way submitit runs ``test_executors``::

    from poprun.backends import conformance

    @conformance.parametrize()
    def test_conformance(check, tmp_path):
        check(MyBackend, tmp_path)

Checks marked ``processes`` run ``sys.executable -c ...`` probes; a test double that starts
no process runs only the others (``parametrize(processes=False)``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from poprun.backends.base import ApplyResult, Backend, Launch, LaunchError, Stream
from poprun.core.record import positional_record
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


def probe_plan(code: str, workdir: Path, *, backend: str, instances: int = 2) -> p.LaunchPlan:
    """Return a plan of ``instances`` instances of ``sys.executable -c code`` on localhost, in ``workdir``."""
    return p.LaunchPlan(
        poprun_version="conformance",
        topology=p.Topology(num_replicas=instances, num_instances=instances, num_ilds=1, ipus_per_replica=1,
                            hosts=("localhost",), num_ipus=instances, replicas_per_instance=1,
                            instances_per_host=instances, instances_per_ild=instances),
        instances=tuple(_instance(i, code, workdir) for i in range(instances)),
        partition=None, offline=True, offline_target=None,
        output=p.Output(tag=False, output_filename=None, only_from_instance=None, print_topology=False,
                        verbosity=0),
        cache=p.Cache(mode="disabled", path=None, per_host=False, remove_at_exit=False),
        mpi=p.Mpi(global_args=(), host_subnet=None, allow_run_as_root=False),
        ssh_keys=p.SshKeyDistribution(enabled=False, key_path=None, key_type=None),
        backend=p.BackendChoice(name=backend, reason="conformance check"), explanation=(), warnings=())


def _instance(index: int, code: str, workdir: Path) -> p.Instance:
    env = p.Environment(set=(("CONFORMANCE_SET", f"value-{index}"), ("POPDIST_INSTANCE_INDEX", str(index))),
                        forward=("PATH", "CONFORMANCE_FORWARDED"), unset=("CONFORMANCE_UNSET",))
    return p.Instance(index=index, host="localhost", local_index=index, ild=0, gcd=index, replica_offset=index,
                      num_local_replicas=1, argv=(sys.executable, "-c", code), cwd=str(workdir), env=env,
                      placement=p.Placement(numa_aware=False, strategy="none"), mpi_local_args=())


def _env_source() -> dict[str, str]:
    return dict(os.environ) | {"CONFORMANCE_FORWARDED": "from-the-shell", "CONFORMANCE_UNSET": "must-not-arrive"}


def _expect(expected: object, actual: object, what: str) -> None:
    if expected != actual:
        msg = f"{what}: expected {expected!r}, got {actual!r}"
        raise AssertionError(msg)


def _wait(launch: Launch, within_s: float = WAIT_S) -> ApplyResult:
    """Return ``launch.wait()``; kill the launch and fail when it takes longer than ``within_s``."""
    box: list[ApplyResult] = []
    waiter = threading.Thread(target=lambda: box.append(launch.wait()), daemon=True)
    waiter.start()
    waiter.join(within_s)
    if not box:
        launch.terminate(0)
        msg = f"the launch did not end within {within_s} s"
        raise AssertionError(msg)
    return box[0]


def _run(factory: BackendFactory, code: str, workdir: Path) -> tuple[ApplyResult, MemorySink]:
    backend, sink = factory(), MemorySink()
    plan = probe_plan(code, workdir, backend=backend.name)
    return _wait(backend.launch(plan, env_source=_env_source(), sink=sink)), sink


def check_declares_a_name(factory: BackendFactory, _workdir: Path) -> None:
    """Check that the backend class declares a non-empty ``name`` (the name plans and the registry use)."""
    name = getattr(type(factory()), "name", None)
    if not isinstance(name, str) or not name:
        msg = f"a backend class declares a non-empty str 'name', found {name!r}"
        raise AssertionError(msg)


def check_every_instance_succeeds(factory: BackendFactory, workdir: Path) -> None:
    """Check that 2 instances exiting 0 give status 0, one status per instance and no failure."""
    result, _ = _run(factory, "pass", workdir)
    _expect((0, (0, 0), (), None), (result.status, result.statuses, result.failures, result.root_cause), "result")


def check_terminate_after_the_end_is_harmless(factory: BackendFactory, workdir: Path) -> None:
    """Check that ``terminate`` after ``wait`` returned raises nothing."""
    backend = factory()
    launch = backend.launch(probe_plan("pass", workdir, backend=backend.name), env_source=_env_source(),
                            sink=MemorySink())
    _wait(launch)
    launch.terminate(0)
    launch.terminate(1.0)


def check_each_instance_runs_its_plan(factory: BackendFactory, workdir: Path) -> None:
    """Check that every instance runs once, in the plan's cwd, with its set, forwarded and unset variables."""
    result, sink = _run(factory, _PROBE, workdir)
    seen = sorted((json.loads(line) for line in sink.lines() if line.startswith("{")), key=lambda r: str(r["index"]))
    expected = [{"index": str(i), "set": f"value-{i}", "forwarded": "from-the-shell", "unset": None,
                 "cwd": str(workdir)} for i in range(2)]
    _expect(0, result.status, "status")
    _expect(expected, seen, "what each instance saw")


def check_exit_status_propagates(factory: BackendFactory, workdir: Path) -> None:
    """Check that when instance 1 exits 3, the launch's status is 3 and instance 1 is the root cause."""
    result, _ = _run(factory, _EXIT_3_ON_1, workdir)
    cause = result.failure(result.root_cause)
    _expect((3, 1, 3), (result.status, result.root_cause, cause and cause.exit_code), "status, root cause, exit code")


def check_signal_is_reported(factory: BackendFactory, workdir: Path) -> None:
    """Check that when instance 1 is killed by SIGKILL, the status is 137 and its failure names the signal."""
    result, _ = _run(factory, _KILLED_ON_1, workdir)
    cause = result.failure(result.root_cause)
    _expect((137, signal.SIGKILL), (result.status, cause and cause.signal), "status and signal")


def check_terminate_stops_every_instance(factory: BackendFactory, workdir: Path) -> None:
    """Check that ``terminate`` stops instances that would run for a minute, none of them a root cause."""
    backend = factory()
    launch = backend.launch(probe_plan(_SLEEP, workdir, backend=backend.name), env_source=_env_source(),
                            sink=MemorySink())
    launch.terminate(1.0)
    result = _wait(launch, within_s=_STOP_S)
    stopped = sorted(f.index for f in result.failures if f.stopped)
    _expect(([0, 1], None), (stopped, result.root_cause), "stopped instances and root cause")


def check_missing_cwd_is_a_launch_error(factory: BackendFactory, workdir: Path) -> None:
    """Check that ``launch`` raises :class:`LaunchError` for a plan whose working directory is gone."""
    backend = factory()
    plan = probe_plan("pass", workdir / "gone", backend=backend.name)
    try:
        launch = backend.launch(plan, env_source=_env_source(), sink=MemorySink())
    except LaunchError:
        return
    _wait(launch)
    msg = "launch() returned for a plan whose working directory does not exist"
    raise AssertionError(msg)


@positional_record
class Check:
    """One conformance check; ``processes`` when it needs the backend to start real processes."""

    run: Callable[[BackendFactory, Path], None]
    processes: bool

    @property
    def name(self) -> str:
        """The check's name without its ``check_`` prefix, for test ids."""
        return self.run.__name__.removeprefix("check_")

    def __call__(self, factory: BackendFactory, workdir: Path) -> None:
        """Run the check on backends made by ``factory``, with scratch directory ``workdir``."""
        self.run(factory, workdir)


CHECKS = (
    Check(check_declares_a_name, processes=False),
    Check(check_every_instance_succeeds, processes=False),
    Check(check_terminate_after_the_end_is_harmless, processes=False),
    Check(check_each_instance_runs_its_plan, processes=True),
    Check(check_exit_status_propagates, processes=True),
    Check(check_signal_is_reported, processes=True),
    Check(check_terminate_stops_every_instance, processes=True),
    Check(check_missing_cwd_is_a_launch_error, processes=True),
)


def checks(*, processes: bool = True) -> tuple[Check, ...]:
    """Return every check, or (``processes`` False) only those that start no real process."""
    return tuple(c for c in CHECKS if processes or not c.processes)


def parametrize(*, processes: bool = True) -> pytest.MarkDecorator:
    """Return ``pytest.mark.parametrize("check", ...)`` over :func:`checks`, with readable ids."""
    import pytest

    chosen = checks(processes=processes)
    return pytest.mark.parametrize("check", chosen, ids=[c.name for c in chosen])


__all__ = ["CHECKS", "BackendFactory", "Check", "MemorySink", "checks", "parametrize", "probe_plan"]
