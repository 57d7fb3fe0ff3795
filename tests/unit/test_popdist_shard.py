"""popdist's sharding helpers: shard_range by instance and by replica, replica_indices, and their laws."""

from unittest import mock

import pytest
from hypothesis import given
from hypothesis import strategies as st

import popdist
from popdist import env


@pytest.fixture(autouse=True)
def no_launch(monkeypatch):
    """Start every test outside any launch, whatever launched pytest."""
    for name in (env.NUM_TOTAL_REPLICAS, env.NUM_LOCAL_REPLICAS, env.REPLICA_INDEX_OFFSET, env.INSTANCE_INDEX,
                 env.NUM_INSTANCES, env.OMPI_RANK, env.OMPI_SIZE):
        monkeypatch.delenv(name, raising=False)


def launched(instances: int, per_instance: int, index: int) -> mock._patch_dict:
    """Return a context in which this process is instance ``index`` of ``instances`` with ``per_instance`` replicas."""
    return mock.patch.dict("os.environ", {
        env.NUM_TOTAL_REPLICAS: str(instances * per_instance), env.NUM_LOCAL_REPLICAS: str(per_instance),
        env.REPLICA_INDEX_OFFSET: str(index * per_instance), env.INSTANCE_INDEX: str(index),
        env.NUM_INSTANCES: str(instances)})


def shards(n: int, instances: int, per_instance: int, *, by: str, drop_last: bool) -> list[range]:
    """Return every instance's shard of ``n`` items, each computed as that instance would."""
    found = []
    for index in range(instances):
        with launched(instances, per_instance, index):
            found.append(popdist.shard_range(n, by=by, drop_last=drop_last))  # type: ignore[arg-type]
    return found


launches = st.tuples(st.integers(0, 500), st.integers(1, 16), st.integers(1, 8))


def test_without_poprun_everything_is_ours():
    """A single instance with one replica owns every item, and replica 0."""
    assert (range(10), range(10), range(1)) == (
        popdist.shard_range(10), popdist.shard_range(10, by="replica"), popdist.replica_indices())


def test_hands_on_example_shards():
    """1562 batches on 4 instances of 2 replicas: 390 per instance, 195 per replica, 2 left over."""
    with launched(4, 2, 3):
        mine, replica = popdist.shard_range(1562), popdist.shard_range(1562, by="replica", index=7)
        indices = popdist.replica_indices()

    assert (range(1170, 1560), range(1365, 1560), range(6, 8)) == (mine, replica, indices)


def test_keeping_the_remainder_gives_the_first_parts_one_more():
    """``drop_last=False`` spreads ``n % parts`` items over the first parts."""
    assert [range(4), range(4, 7), range(7, 10)] == shards(10, 3, 1, by="instance", drop_last=False)


def test_index_selects_another_part():
    """``index=`` gives another instance's (or replica's) part, from any instance."""
    with launched(4, 2, 0):
        assert range(50, 75) == popdist.shard_range(100, index=2)
        assert range(12, 24) == popdist.shard_range(100, by="replica", index=1)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"n": -1}, "negative number of items"),
    ({"n": 4, "by": "host"}, "'instance' or 'replica', not 'host'"),
    ({"n": 4, "index": 4}, "instance 4 is out of range: there are 4"),
    ({"n": 4, "by": "replica", "index": -1}, "replica -1 is out of range: there are 8"),
])
def test_wrong_arguments_are_refused(kwargs, message):
    """A negative count, an unknown ``by`` or an index out of range is a ValueError that says so."""
    with launched(4, 2, 0), pytest.raises(ValueError, match=message):
        popdist.shard_range(**kwargs)


@given(launches)
def test_instance_shards_partition_the_items_minus_the_remainder(launch):
    """By instance with drop_last: shards are disjoint, in order, equal in size, and cover all but n % instances."""
    n, instances, per_instance = launch
    found = shards(n, instances, per_instance, by="instance", drop_last=True)

    assert list(range(n - n % instances)) == [i for shard in found for i in shard]
    assert {n // instances} == {len(shard) for shard in found}


@given(launches)
def test_shards_without_drop_last_cover_everything(launch):
    """Without drop_last, shards by instance or by replica cover range(n) exactly, sizes within one of each other."""
    n, instances, per_instance = launch
    for by, parts in (("instance", 1), ("replica", per_instance)):
        found = shards(n, instances, per_instance, by=by, drop_last=False)

        assert list(range(n)) == [i for shard in found for i in shard]
        assert max(map(len, found)) - min(map(len, found)) <= parts


@given(launches)
def test_an_instance_by_replica_is_the_union_of_its_replicas_shards(launch):
    """By replica, an instance's block is its replicas' shards end to end, each n // replicas long."""
    n, instances, per_instance = launch
    total = instances * per_instance
    for index in range(instances):
        with launched(instances, per_instance, index):
            block = popdist.shard_range(n, by="replica")
            parts = [popdist.shard_range(n, by="replica", index=r) for r in popdist.replica_indices()]

        assert list(block) == [i for part in parts for i in part]
        assert {n // total} == {len(part) for part in parts}
