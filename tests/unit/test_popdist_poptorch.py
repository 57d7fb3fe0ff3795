"""
popdist.poptorch.Options against a faithful double of PopTorch's option classes (tests/doubles/poptorch).

The double follows graphcore/poptorch sdk/poptorch/2.4.0 to 3.4.0: ``OptionsDict`` refuses unknown
options exactly as PopTorch does, so what popdist does to PopTorch's objects is checked here. The
``test_popdist_*`` tests are PopTorch's own ``tests/popdist_test.py``, rewritten.
"""

import copy
import pickle
import sys
from pathlib import Path

import pytest

import popdist.poptorch
from popdist import env

DOUBLES = Path(__file__).parent.parent / "doubles"


@pytest.fixture(autouse=True)
def poptorch(monkeypatch):
    """Start outside any launch, with the PopTorch double importable and no Options class built yet; return it."""
    for name in (env.NUM_TOTAL_REPLICAS, env.NUM_LOCAL_REPLICAS, env.REPLICA_INDEX_OFFSET, env.INSTANCE_INDEX,
                 env.NUM_INSTANCES, env.NUM_IPUS_PER_REPLICA, env.OMPI_RANK, env.OMPI_SIZE,
                 env.VIPU_API_PARTITION_ID, env.EXECUTABLE_CACHE_PATH, "POPTORCH_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)
    for name in [name for name in sys.modules if name == "poptorch" or name.startswith("poptorch.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(DOUBLES))
    monkeypatch.setattr(popdist.poptorch._Cache, "options", None)
    import poptorch as module  # the double, found through the path set just above

    return module


def launch(monkeypatch, **extra: str) -> None:
    """Make this process instance 2 of 4 on a partition, with 2 of the 8 replicas, 2 IPUs each, as poprun does."""
    for name, value in {env.NUM_TOTAL_REPLICAS: "8", env.NUM_LOCAL_REPLICAS: "2", env.REPLICA_INDEX_OFFSET: "4",
                        env.INSTANCE_INDEX: "2", env.NUM_INSTANCES: "4", env.NUM_IPUS_PER_REPLICA: "2",
                        env.OMPI_RANK: "2", env.OMPI_SIZE: "4", env.VIPU_API_PARTITION_ID: "p16", **extra}.items():
        monkeypatch.setenv(name, value)


def test_the_double_refuses_unknown_options_as_poptorch_does(poptorch):
    """PopTorch's OptionsDict: an unknown public option is an AssertionError naming the valid ones; no arguments."""
    with pytest.raises(AssertionError) as caught:
        poptorch.Options().Distributed.disable = None
    with pytest.raises(TypeError):
        poptorch.Options(2)

    assert ("Invalid option disable, valid options are dict_keys(['num_distributed_processes', "
            "'distributed_process_id', 'ipuof_configs'])") == str(caught.value)


def test_popdist_blocked_options():
    """PopTorch's test_blocked_options: the five calls poprun decides raise RuntimeError naming the call."""
    opts = popdist.poptorch.Options(ipus_per_replica=2)

    with pytest.raises(RuntimeError, match=r"Cannot call `useIpuId` with popdist\.poptorch\.Options"):
        opts.useIpuId(1)
    with pytest.raises(RuntimeError, match=r"Cannot call `replicationFactor` with popdist\.poptorch\.Options"):
        opts.replicationFactor(1)
    with pytest.raises(RuntimeError, match=r"Cannot call `Distributed.disable` with popdist\.poptorch\.Options"):
        opts.Distributed.disable()
    with pytest.raises(RuntimeError,
                       match=r"Cannot call `Distributed.setEnvVarNames` with popdist\.poptorch\.Options"):
        opts.Distributed.setEnvVarNames("A", "B")
    with pytest.raises(RuntimeError,
                       match=r"Cannot call `Distributed.configureProcessId` with popdist\.poptorch\.Options"):
        opts.Distributed.configureProcessId(1)


def test_popdist_getters():
    """PopTorch's test_getters: without poprun, process 0 of 1."""
    opts = popdist.poptorch.Options(ipus_per_replica=2)

    assert 0 == opts.Distributed.processId
    assert 1 == opts.Distributed.numProcesses


def test_popdist_freeze():
    """PopTorch's test_to_dict (its part that needs no IPU): not frozen when made, frozen with Distributed after _freeze."""
    opts = popdist.poptorch.Options(ipus_per_replica=2)
    opts.checkIsFrozen()
    opts._freeze()

    with pytest.raises(AttributeError, match=r"Can't modify frozen Options"):
        opts.checkIsFrozen()
    with pytest.raises(AttributeError, match=r"Can't modify frozen Options"):
        opts.Distributed.checkIsFrozen()


@pytest.mark.parametrize(("args", "kwargs", "ipu_id"), [
    ((), {}, None),
    ((), {"ipus_per_replica": 2}, 26),
    ((2,), {}, 26),
], ids=["Options()", "Options(ipus_per_replica=2)", "Options(2)"])
def test_each_call_form_takes_the_launch(monkeypatch, poptorch, args, kwargs, ipu_id):
    """Every call form: local replication factor, instance index and count; with IPUs per replica, the device."""
    launch(monkeypatch)
    opts = popdist.poptorch.Options(*args, **kwargs)

    assert isinstance(opts, poptorch.Options)
    assert (2, 2, 4) == (opts.replication_factor, opts.Distributed.processId, opts.Distributed.numProcesses)
    assert ipu_id == (opts.ipu_id if opts.exists("ipu_id") else None)


@pytest.mark.parametrize(("args", "kwargs"), [((), {}), ((), {"ipus_per_replica": 4}), ((4,), {})])
def test_what_programs_do_next_works(monkeypatch, args, kwargs):
    """What graphcore/examples do right after: seed, cache, gradient accumulation, device iterations, progress bar."""
    launch(monkeypatch)
    opts = popdist.poptorch.Options(*args, **kwargs)
    opts.randomSeed(42)
    opts.enableExecutableCaching("./cachedir")
    opts.Training.gradientAccumulation(8)
    opts.deviceIterations(4)
    opts.showCompilationProgressBar(popdist.getInstanceIndex() == 0)

    assert (42, 8, 4, "./cachedir", False) == (opts.random_seed, opts.Training.gradient_accumulation,
                                                opts.device_iterations, opts._Popart.options["cachePath"],
                                                opts._show_compilation_progress_bar)


def test_poprun_executable_cache_is_enabled(monkeypatch):
    """With --executable-cache-path (POPDIST_EXECUTABLE_CACHE_PATH), executable caching is on, in that folder."""
    launch(monkeypatch, **{env.EXECUTABLE_CACHE_PATH: "/tmp/cache"})

    assert {"cachePath": "/tmp/cache", "enableEngineCaching": True}.items() <= (
        popdist.poptorch.Options()._Popart.options.items())


def test_offline_selects_no_device(monkeypatch):
    """Offline (no V-IPU partition), there is no device to select, as real PopDist's offline support did."""
    launch(monkeypatch)
    monkeypatch.delenv(env.VIPU_API_PARTITION_ID)

    assert not popdist.poptorch.Options(2).exists("ipu_id")


def test_without_poprun_is_one_process_with_one_replica(poptorch):
    """Without poprun, ``Options(2)`` is process 0 of 1, replication 1, on no chosen IPU; the class is named Options."""
    opts = popdist.poptorch.Options(2)

    assert (0, 1, 1) == (opts.Distributed.processId, opts.Distributed.numProcesses, opts.replication_factor)
    assert not opts.exists("ipu_id")
    assert "Options" == type(opts).__name__ == type(opts).__qualname__
    assert popdist.poptorch.Options is type(opts)


@pytest.mark.parametrize("duplicate", [lambda opts: opts.clone(), copy.deepcopy,
                                       lambda opts: pickle.loads(pickle.dumps(opts))],  # noqa: S301 - our own bytes
                         ids=["clone", "deepcopy", "pickle"])
def test_a_copy_keeps_the_launch_and_the_refusals(monkeypatch, duplicate):
    """PopTorch clones the options it is given: the copy has the same values and still refuses what poprun decides."""
    launch(monkeypatch)
    copied = duplicate(popdist.poptorch.Options(2))

    assert (2, 2, 4, 26) == (copied.replication_factor, copied.Distributed.processId,
                             copied.Distributed.numProcesses, copied.ipu_id)
    with pytest.raises(RuntimeError, match=r"Cannot call `Distributed.disable`"):
        copied.Distributed.disable()
    with pytest.raises(RuntimeError, match=r"Cannot call `replicationFactor`"):
        copied.replicationFactor(1)
