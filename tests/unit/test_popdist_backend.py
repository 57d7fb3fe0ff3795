"""popdist's host-side backend: init and its choice, barrier, execute_on_instances, finalize, and MPI."""

import sys
import types

import pytest

import popdist
from popdist import _backend, _rendezvous, env


class RecordingBackend:
    """A backend that records the barriers it is asked for."""

    name = "recording"

    def __init__(self) -> None:
        self.barriers: list[list[int]] = []
        self.closed = False

    def barrier(self, group: frozenset[int], timeout_s: float | None) -> None:  # noqa: ARG002
        self.barriers.append(sorted(group))

    def close(self) -> None:
        self.closed = True


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    """Start outside any launch with no backend, and leave no backend behind."""
    for name in (env.NUM_TOTAL_REPLICAS, env.NUM_LOCAL_REPLICAS, env.REPLICA_INDEX_OFFSET, env.INSTANCE_INDEX,
                 env.NUM_INSTANCES, env.OMPI_RANK, env.OMPI_SIZE, *env.MPI_RUNTIME_MARKERS):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(_backend, "_STATE", _backend._State())


def as_instance(monkeypatch, index: int, count: int) -> None:
    """Make this process instance ``index`` of ``count``."""
    monkeypatch.setenv(env.INSTANCE_INDEX, str(index))
    monkeypatch.setenv(env.NUM_INSTANCES, str(count))


def with_recording_backend() -> RecordingBackend:
    """Install a recording backend as if ``init`` had opened it; return it."""
    backend = RecordingBackend()
    _backend._STATE.backend = backend
    return backend


def test_a_single_instance_needs_nobody():
    """Without poprun, init opens the single backend: barriers return at once, finalize closes it."""
    assert (False, None) == (popdist.is_initialized(), popdist.backend_name())
    popdist.init()
    popdist.barrier()

    assert (True, "single", True) == (popdist.is_initialized(), popdist.backend_name(), popdist.isBackendInitialized())
    popdist.finalizeBackend()
    assert not popdist.isBackendInitialized()


def test_camel_case_backend_functions_are_init_and_finalize():
    """``initializeBackend()`` is ``init()``; a second init keeps the open backend."""
    popdist.initializeBackend()
    first = _backend._STATE.backend
    popdist.init()

    assert first is _backend._STATE.backend
    popdist.finalize()
    popdist.finalize()
    assert not popdist.is_initialized()


def test_unknown_backend_is_refused():
    """``init(backend=...)`` takes auto, mpi or tcp."""
    with pytest.raises(ValueError, match="'auto', 'mpi' or 'tcp', not 'gloo'"):
        popdist.init(backend="gloo")  # type: ignore[arg-type]


def test_an_index_outside_the_launch_is_refused(monkeypatch):
    """An environment that puts this instance outside the launch cannot initialise."""
    as_instance(monkeypatch, 4, 4)

    with pytest.raises(popdist.BackendError, match="instance index 4 is out of range for 4 instances"):
        popdist.init()


def test_barrier_without_init_is_an_error_when_others_exist(monkeypatch):
    """Alone, barrier returns; with other instances and no backend, it says init is needed."""
    popdist.barrier()
    as_instance(monkeypatch, 1, 2)

    with pytest.raises(popdist.BackendError, match=r"needs popdist.init\(\) first"):
        popdist.barrier()


def test_execute_runs_only_on_the_given_instances(monkeypatch):
    """The function runs where asked and returns its result there; elsewhere the call returns None."""
    calls = []
    with_recording_backend()
    as_instance(monkeypatch, 0, 2)
    here = popdist.execute_on_instances({0}, lambda x, *, y: calls.append(x + y) or "done", 1, y=2)
    as_instance(monkeypatch, 1, 2)
    there = popdist.execute_on_instances({0}, calls.append, "never")

    assert ("done", None, [3]) == (here, there, calls)


def test_execute_ends_in_a_barrier_of_every_instance(monkeypatch):
    """After the function, all instances wait; a barrier inside it waits for its instances only."""
    backend = with_recording_backend()
    as_instance(monkeypatch, 1, 4)
    popdist.execute_on_instances({1, 2}, popdist.barrier)

    assert [[1, 2], [0, 1, 2, 3]] == backend.barriers


def test_nested_execute_waits_for_the_enclosing_group(monkeypatch):
    """Inside execute_on_instances({1, 2}), another call ends in a barrier of instances 1 and 2."""
    backend = with_recording_backend()
    as_instance(monkeypatch, 2, 4)
    result = popdist.execute_on_instances({1, 2}, popdist.execute_on_instances, {1}, str, "x")

    assert (None, [[1, 2], [0, 1, 2, 3]]) == (result, backend.barriers)


def test_a_failing_function_skips_the_barrier_and_leaves_no_group(monkeypatch):
    """An exception propagates at once (the launcher stops the others) and the group stack is restored."""
    backend = with_recording_backend()
    as_instance(monkeypatch, 0, 2)

    with pytest.raises(ZeroDivisionError):
        popdist.execute_on_instances({0}, lambda: 1 / 0)
    assert ([], []) == (backend.barriers, _backend._STATE.groups)


def test_execute_refuses_instances_that_do_not_exist(monkeypatch):
    """An index outside range(getNumInstances()) is a ValueError naming it."""
    as_instance(monkeypatch, 0, 2)

    with pytest.raises(ValueError, match="no instance 2, 5: instance indices run from 0 to 1"):
        popdist.execute_on_instances({0, 2, 5}, print)


def test_execute_without_init_warns_once_that_nobody_waits(monkeypatch):
    """Without a backend, execute_on_instances cannot synchronise and says so, once per process."""
    as_instance(monkeypatch, 1, 2)

    with pytest.warns(popdist.PopdistWarning, match=r"no instance waits for instances \[0\]"):
        popdist.execute_on_instances({0}, print)
    assert None is popdist.execute_on_instances({0}, print)


def test_auto_picks_tcp_under_poprun(monkeypatch):
    """poprun's own backends set OMPI_COMM_WORLD_* but start no MPI: init meets over TCP at MASTER_PORT + 1."""
    opened = {}
    monkeypatch.setattr(_rendezvous, "open_tcp", lambda **kwargs: opened.update(kwargs) or RecordingBackend())
    as_instance(monkeypatch, 1, 4)
    monkeypatch.setenv("OMPI_COMM_WORLD_SIZE", "4")
    monkeypatch.setenv("MASTER_ADDR", "pod1")
    monkeypatch.setenv("MASTER_PORT", "4000")
    popdist.init(timeout_s=7)

    assert {"index": 1, "count": 4, "host": "pod1", "port": 4001, "timeout_s": 7} == opened


class FakeCommunicator:
    """The part of an mpi4py communicator the MPI backend uses, recording what happens."""

    def __init__(self, rank: int, size: int, log: list[str], name: str = "world") -> None:
        self.rank, self.size, self.log, self.name = rank, size, log, name

    def Get_rank(self) -> int:  # noqa: N802 - mpi4py's name
        return self.rank

    def Get_size(self) -> int:  # noqa: N802 - mpi4py's name
        return self.size

    def Barrier(self) -> None:  # noqa: N802 - mpi4py's name
        self.log.append(f"barrier {self.name}")

    def Get_group(self) -> types.SimpleNamespace:  # noqa: N802 - mpi4py's name
        return types.SimpleNamespace(Incl=lambda ranks: ranks)

    def Create_group(self, ranks: list[int]) -> "FakeCommunicator":  # noqa: N802 - mpi4py's name
        self.log.append(f"create {ranks}")
        return FakeCommunicator(0, len(ranks), self.log, name=str(ranks))

    def Free(self) -> None:  # noqa: N802 - mpi4py's name
        self.log.append(f"free {self.name}")


@pytest.fixture
def fake_mpi4py(monkeypatch):
    """Install a fake mpi4py whose world has 4 ranks, this one rank 1; return the log of MPI calls."""
    log: list[str] = []
    package, module = types.ModuleType("mpi4py"), types.ModuleType("mpi4py.MPI")
    module.COMM_WORLD = FakeCommunicator(1, 4, log)  # type: ignore[attr-defined]
    package.MPI = module  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "mpi4py", package)
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", module)
    return log


def test_auto_picks_mpi_under_a_real_mpi_launcher(monkeypatch, fake_mpi4py):
    """Started by mpirun (PMIX_RANK) with mpi4py importable, barriers run on MPI communicators."""
    as_instance(monkeypatch, 1, 4)
    monkeypatch.setenv("PMIX_RANK", "1")
    popdist.init()
    popdist.execute_on_instances({1, 2}, popdist.barrier)
    popdist.execute_on_instances({1, 2}, popdist.barrier)
    name = popdist.backend_name()
    popdist.finalize()

    assert "mpi" == name
    assert ["create [1, 2]", "barrier [1, 2]", "barrier world", "barrier [1, 2]", "barrier world",
            "barrier world", "free [1, 2]"] == fake_mpi4py


def test_mpi_ranks_must_agree_with_the_launch(monkeypatch, fake_mpi4py):
    """An MPI world that disagrees with poprun's instance index is refused with both views."""
    as_instance(monkeypatch, 2, 4)

    with pytest.raises(popdist.BackendError, match="MPI says rank 1 of 4, poprun says instance 2 of 4"):
        popdist.init(backend="mpi")


def test_mpi_backend_without_mpi4py_names_it(monkeypatch):
    """Asking for MPI without mpi4py says what to install."""
    as_instance(monkeypatch, 0, 2)
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", None)

    with pytest.raises(popdist.BackendError, match="needs mpi4py"):
        popdist.init(backend="mpi")
