"""popdist: the public names, the documented defaults without poprun, the camelCase API and device ids."""

import os
import subprocess
import sys
import types

import pytest

import popdist
import popdist.popdist_core
from popdist import compat, env
from popdist._device import poplar_device_id
from popdist.env import from_environ

LAUNCHER_VARIABLES = [v for k, v in vars(env).items() if k.isupper() and isinstance(v, str) and k != "DEFAULT_MASTER_ADDR"]
PUBLIC_SUBMODULES = {"compat", "config", "env", "popdist_core", "poptorch", "tensorflow", "popart", "torch"}


@pytest.fixture(autouse=True)
def no_launch(monkeypatch):
    """Start every test outside any launch, whatever launched pytest."""
    for name in [*LAUNCHER_VARIABLES, *env.MPI_RUNTIME_MARKERS]:
        monkeypatch.delenv(name, raising=False)


def launch(monkeypatch, **variables: str) -> None:
    """Set the given POPDIST_<NAME> variables, as poprun would (``total="8"`` sets POPDIST_NUM_TOTAL_REPLICAS)."""
    names = {"total": env.NUM_TOTAL_REPLICAS, "local": env.NUM_LOCAL_REPLICAS, "ipus": env.NUM_IPUS_PER_REPLICA,
             "offset": env.REPLICA_INDEX_OFFSET, "local_index": env.LOCAL_INSTANCE_INDEX,
             "index": env.INSTANCE_INDEX, "instances": env.NUM_INSTANCES, "uniform": env.UNIFORM_REPLICAS_PER_INSTANCE}
    for key, value in variables.items():
        monkeypatch.setenv(names[key], value)


def test_public_names_match_the_exports():
    """``__all__`` lists exactly the public names of the package that are not submodules."""
    public = {name for name in dir(popdist) if not name.startswith("_")}
    modules = {name for name in public if isinstance(getattr(popdist, name), types.ModuleType)}

    assert sorted(public - modules) == sorted(popdist.__all__)
    assert modules <= PUBLIC_SUBMODULES


def test_every_name_in_all_resolves():
    """Every exported name, the lazily imported ones included, is an attribute of the package."""
    assert all(getattr(popdist, name) is not None for name in popdist.__all__)


def test_unknown_attribute_is_an_attribute_error():
    """A missing name raises AttributeError, as for any module."""
    with pytest.raises(AttributeError, match="no attribute 'getRank'"):
        _ = popdist.getRank


def test_import_is_light():
    """``import popdist`` imports no sockets, threads, dataclasses, typing or framework."""
    heavy = ["socket", "selectors", "threading", "dataclasses", "typing", "json", "poptorch", "tensorflow", "popart",
             "mpi4py", "popdist.config", "popdist.poptorch"]
    code = f"import sys, popdist; print([m for m in {heavy!r} if m in sys.modules])"

    assert "[]\n" == subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout


def test_defaults_without_poprun():
    """Without the launcher's variables, popdist reads a single instance with a single replica."""
    config = from_environ({})

    assert (False, 1, 1, 1, 0, 0, 0, 1, True) == (
        config.is_set, config.num_total_replicas, config.num_local_replicas, config.num_ipus_per_replica,
        config.replica_index_offset, config.local_instance_index, config.instance_index, config.num_instances,
        config.uniform_replicas_per_instance)


def test_camel_case_defaults_without_poprun():
    """Every camelCase function returns its documented default when nothing is set."""
    assert (False, 1, 1, 1, 0, 0, 1, 0, True, 0) == (
        popdist.isPopdistEnvSet(), popdist.getNumTotalReplicas(), popdist.getNumLocalReplicas(),
        popdist.getNumIpusPerReplica(), popdist.getReplicaIndexOffset(), popdist.getInstanceIndex(),
        popdist.getNumInstances(), popdist.getLocalInstanceIndex(), popdist.isUniformReplicasPerInstance(),
        popdist.getDeviceId())
    assert popdist.checkNumIpusPerReplica(4)


def test_current_reads_the_environment_at_call_time(monkeypatch):
    """``popdist.current()`` is a frozen value read when called, never cached."""
    before = popdist.current()
    launch(monkeypatch, total="8", local="2", offset="4", index="2", instances="4")
    after = popdist.current()

    assert (0, 2) == (before.instance_index, after.instance_index)
    with pytest.raises(AttributeError):
        after.instance_index = 3  # type: ignore[misc]


def test_env_module_still_exports_the_config():
    """``from popdist.env import from_environ, PopdistConfig`` keeps working (they live in popdist.config)."""
    from popdist.env import PopdistConfig

    assert isinstance(env.from_environ({}), PopdistConfig)
    with pytest.raises(AttributeError):
        _ = env.no_such_name


def test_instance_index_falls_back_on_mpi_and_on_replica_arithmetic():
    """Real poprun left the index to MPI; without it, offset / local replicas gives it (as third-party readers did)."""
    base = {"POPDIST_NUM_TOTAL_REPLICAS": "8", "POPDIST_NUM_LOCAL_REPLICAS": "2", "POPDIST_REPLICA_INDEX_OFFSET": "6"}

    assert (3, 4) == (from_environ(base).instance_index, from_environ(base).num_instances)
    assert 1 == from_environ({**base, "OMPI_COMM_WORLD_RANK": "1"}).instance_index


def test_camel_case_api_reads_the_environment(monkeypatch):
    """``popdist.getNumTotalReplicas()`` and friends read the process environment at call time."""
    launch(monkeypatch, total="16", local="4", ipus="2", offset="8", local_index="1", uniform="0")

    assert (True, 16, 4, 8, 2, 1, False) == (
        popdist.isPopdistEnvSet(), popdist.getNumTotalReplicas(), popdist.getNumLocalReplicas(),
        popdist.getReplicaIndexOffset(), popdist.getNumIpusPerReplica(), popdist.getLocalInstanceIndex(),
        popdist.isUniformReplicasPerInstance())
    assert (2, 4) == (popdist.getInstanceIndex(), popdist.getNumInstances())
    assert compat.checkNumIpusPerReplica(2)
    assert not compat.checkNumIpusPerReplica(4)


def test_popdist_core_is_the_older_spelling_of_the_same_functions(monkeypatch):
    """``popdist.popdist_core.getInstanceIndex()`` and friends are the camelCase API, under its old module."""
    launch(monkeypatch, total="8", local="2", offset="6", index="3", instances="4", ipus="2")
    core = popdist.popdist_core

    assert (3, 4, 8, popdist.getDeviceId()) == (core.getInstanceIndex(), core.getNumInstances(),
                                                 core.getNumTotalReplicas(), core.getDeviceId())
    assert all(getattr(core, name) is getattr(popdist, name) for name in core.__all__)


def test_garbage_values_fall_back_on_defaults():
    """A variable that is not a number reads as its default, never an exception."""
    assert 1 == from_environ({"POPDIST_NUM_TOTAL_REPLICAS": "lots"}).num_total_replicas
    assert 0 == from_environ({"POPDIST_REPLICA_INDEX_OFFSET": "-3"}).replica_index_offset


@pytest.mark.parametrize(("instance", "expected"), [(0, 24), (1, 25), (2, 26), (3, 27)])
def test_device_id_of_the_hands_on_example(monkeypatch, instance, expected):
    """8 replicas of 2 IPUs on 4 instances (a POD16): instance i attaches to 4-IPU device 24 + i."""
    launch(monkeypatch, total="8", local="2", ipus="2", offset=str(2 * instance), index=str(instance),
           instances="4", local_index=str(instance))

    assert expected == popdist.getDeviceId() == popdist.getDeviceId(2) == popdist.device_id()


def test_device_id_takes_both_spellings_of_ipus_per_replica(monkeypatch):
    """``getDeviceId(4)``, ``getDeviceId(ipusPerReplica=4)`` and ``getDeviceId(ipus_per_replica=4)`` agree."""
    launch(monkeypatch, total="4", local="1", offset="1", index="1", instances="4")

    assert 25 == compat.getDeviceId(4) == compat.getDeviceId(ipusPerReplica=4) == compat.getDeviceId(ipus_per_replica=4)


@pytest.mark.parametrize(("first", "size", "partition", "expected"), [
    (0, 1, 1, 0),        # a single IPU
    (5, 1, 16, 5),       # single-IPU devices come first
    (4, 2, 16, 18),      # then the 16 / 2 = 8 two-IPU devices, from 16
    (60, 4, 64, 111),    # 64 + 32 + 60 / 4: the last 4-IPU child of a POD64
    (0, 64, 64, 126),    # the whole POD64: the parent device real poprun prepared (126)
    (3, 3, 9, 16 + 8),   # 3 IPUs round up to a 4-IPU device, 9 to a 16-IPU partition
])
def test_poplar_device_ids_follow_the_device_list_layout(first, size, partition, expected):
    """Device ids count all smaller devices first, then this size's devices in IPU order."""
    assert expected == poplar_device_id(first_ipu=first, num_ipus=size, partition_ipus=partition)


def test_no_device_for_zero_ipus():
    """A device of no IPUs is a programming error."""
    with pytest.raises(ValueError, match="no Poplar device"):
        poplar_device_id(first_ipu=0, num_ipus=0, partition_ipus=4)


def test_master_address_defaults_to_torchruns(monkeypatch):
    """MASTER_ADDR and MASTER_PORT default to localhost:29500, as torchrun's do."""
    assert ("localhost", 29500) == env.master_address(os.environ)
    monkeypatch.setenv("MASTER_ADDR", "pod1")
    monkeypatch.setenv("MASTER_PORT", "4000")

    assert ("pod1", 4000) == env.master_address(os.environ)


def test_only_a_real_mpi_launcher_counts_as_mpi():
    """poprun's OMPI_COMM_WORLD_* variables do not mean that an MPI runtime started us; PMIx's do."""
    assert not env.launched_by_mpi({"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "1"})
    assert env.launched_by_mpi({"OMPI_COMM_WORLD_SIZE": "4", "PMIX_RANK": "1"})


def test_env_reexports_every_name_and_reader_of_the_contract() -> None:
    """popdist.env offers every variable name and reader of popdist._contract, the same objects."""
    import types

    from popdist import _contract

    declared = {name for name, value in vars(_contract).items() if not name.startswith("_")
                and isinstance(value, (str, int, tuple, types.FunctionType))
                and name != "TYPE_CHECKING"}

    assert sorted(declared) == sorted(_contract.__all__)
    assert all(getattr(env, name) is getattr(_contract, name) for name in _contract.__all__)


@pytest.mark.parametrize(("variables", "expected"), [
    ({}, 0), ({"POPRUN_RESTART_COUNT": "2"}, 2), ({"TORCHELASTIC_RESTART_COUNT": "3"}, 3),
    ({"POPRUN_RESTART_COUNT": "1", "TORCHELASTIC_RESTART_COUNT": "5"}, 1), ({"POPRUN_RESTART_COUNT": "x"}, 0),
    ({"POPRUN_RESTART_COUNT": "-4"}, 0),
])
def test_restart_count_is_poprun_s_then_torchrun_s_then_0(monkeypatch, variables, expected):
    """getRestartCount reads POPRUN_RESTART_COUNT, then TORCHELASTIC_RESTART_COUNT; 0 when unset or garbage."""
    for name in ("POPRUN_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, value)

    assert expected == popdist.getRestartCount()
