"""popdist: the public names, the documented defaults without poprun, and the camelCase API."""

import popdist
from popdist import compat
from popdist.env import from_environ


def test_public_names_match_the_exports():
    """``__all__`` lists exactly the public names of the package."""
    public = {name for name in dir(popdist) if not name.startswith("_")} - {"compat", "env", "annotations", "os"}

    assert sorted(public) == sorted(popdist.__all__)


def test_defaults_without_poprun():
    """Without the launcher's variables, popdist reads a single instance with a single replica."""
    config = from_environ({})

    assert (False, 1, 1, 1, 0, 0, 0, 1) == (
        config.is_set, config.num_total_replicas, config.num_local_replicas, config.num_ipus_per_replica,
        config.replica_index_offset, config.local_instance_index, config.instance_index, config.num_instances)


def test_instance_index_falls_back_on_mpi_and_on_replica_arithmetic():
    """Real poprun left the index to MPI; without it, offset / local replicas gives it (as third-party readers did)."""
    base = {"POPDIST_NUM_TOTAL_REPLICAS": "8", "POPDIST_NUM_LOCAL_REPLICAS": "2", "POPDIST_REPLICA_INDEX_OFFSET": "6"}

    assert (3, 4) == (from_environ(base).instance_index, from_environ(base).num_instances)
    assert 1 == from_environ({**base, "OMPI_COMM_WORLD_RANK": "1"}).instance_index


def test_camel_case_api_reads_the_environment(monkeypatch):
    """``popdist.getNumTotalReplicas()`` and friends read the process environment at call time."""
    monkeypatch.setenv("POPDIST_NUM_TOTAL_REPLICAS", "16")
    monkeypatch.setenv("POPDIST_NUM_LOCAL_REPLICAS", "4")
    monkeypatch.setenv("POPDIST_NUM_IPUS_PER_REPLICA", "2")
    monkeypatch.setenv("POPDIST_REPLICA_INDEX_OFFSET", "8")

    assert (True, 16, 4, 8, 2) == (popdist.isPopdistEnvSet(), popdist.getNumTotalReplicas(),
                                   popdist.getNumLocalReplicas(), popdist.getReplicaIndexOffset(),
                                   popdist.getNumIpusPerReplica())
    assert (2, 4) == (popdist.getInstanceIndex(), popdist.getNumInstances())
    assert compat.checkNumIpusPerReplica(2)
    assert not compat.checkNumIpusPerReplica(4)


def test_garbage_values_fall_back_on_defaults():
    """A variable that is not a number reads as its default, never an exception."""
    assert 1 == from_environ({"POPDIST_NUM_TOTAL_REPLICAS": "lots"}).num_total_replicas
