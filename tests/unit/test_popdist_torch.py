"""popdist.torch in one process: the sampler's sharding, and the collectives with one instance or a fake transport."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

import popdist  # noqa: E402
import popdist.torch as pdt  # noqa: E402
from popdist import env  # noqa: E402

LAUNCH_VARS = (env.NUM_TOTAL_REPLICAS, env.NUM_LOCAL_REPLICAS, env.REPLICA_INDEX_OFFSET, env.INSTANCE_INDEX,
               env.NUM_INSTANCES, env.OMPI_RANK, env.OMPI_SIZE, env.LOCAL_INSTANCE_INDEX)


@pytest.fixture(autouse=True)
def no_launch(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Start outside any launch, and leave nothing open behind."""
    for name in LAUNCH_VARS:
        monkeypatch.delenv(name, raising=False)
    yield
    pdt._STATE.collectives, pdt._STATE.owns_group = None, False
    popdist.finalize()


def as_instance(index: int, *, instances: int, replicas: int) -> dict[str, str]:
    """Return the variables poprun gives instance ``index`` of ``instances`` sharing ``replicas`` replicas."""
    local = replicas // instances
    return {env.NUM_TOTAL_REPLICAS: str(replicas), env.NUM_LOCAL_REPLICAS: str(local),
            env.REPLICA_INDEX_OFFSET: str(index * local), env.INSTANCE_INDEX: str(index),
            env.NUM_INSTANCES: str(instances)}


def launch(monkeypatch: pytest.MonkeyPatch, index: int, *, instances: int, replicas: int) -> None:
    """Make this process instance ``index`` of ``instances`` sharing ``replicas`` replicas."""
    for name, value in as_instance(index, instances=instances, replicas=replicas).items():
        monkeypatch.setenv(name, value)


def batches_of(monkeypatch: pytest.MonkeyPatch, index: int, *, instances: int, replicas: int, n: int,
               **options: object) -> list[list[int]]:
    """Return the local batches instance ``index`` reads in its first epoch."""
    with monkeypatch.context() as patched:
        launch(patched, index, instances=instances, replicas=replicas)
        sampler = pdt.DistributedSampler(n, **options)
        order = list(sampler)
        size = sampler.local_batch_size
    return [order[i:i + size] for i in range(0, len(order), size)]


def global_batches(monkeypatch: pytest.MonkeyPatch, *, instances: int, replicas: int, n: int,
                   **options: object) -> list[list[int]]:
    """Return each step's items, every instance's local batch end to end in instance order."""
    per_instance = [batches_of(monkeypatch, i, instances=instances, replicas=replicas, n=n, **options)
                    for i in range(instances)]
    assert len({len(b) for b in per_instance}) == 1, "instances take different numbers of steps"
    return [[i for batches in per_instance for i in batches[step]] for step in range(len(per_instance[0]))]


def test_import_popdist_does_not_import_torch() -> None:
    """`import popdist` (and its Graphcore framework modules) leaves torch unimported: only popdist.torch imports it."""
    code = "import sys, popdist, popdist.poptorch; print('torch' in sys.modules)"

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)

    assert "False" == done.stdout.strip()


def test_one_instance_reads_whole_batches_in_order() -> None:
    """Without poprun and without shuffling, the sampler yields the items in order, the last partial batch left out."""
    sampler = pdt.DistributedSampler(10, batch_size=3, shuffle=False)

    assert [0, 1, 2, 3, 4, 5, 6, 7, 8] == list(sampler)
    assert 9 == len(sampler)
    assert 3 == sampler.num_steps


@pytest.mark.parametrize(("instances", "replicas"), [(2, 2), (4, 4), (2, 4), (4, 8)])
def test_each_step_reads_the_same_items_whatever_the_instances(monkeypatch, instances, replicas) -> None:
    """The instances' local batches of a step, end to end, are the global batch one process alone would read."""
    # GIVEN the same global batch (16 items) read by one process and by several instances
    options = {"n": 100, "shuffle": True, "seed": 7}
    alone = global_batches(monkeypatch, instances=1, replicas=1, batch_size=16, **options)

    # WHEN several instances share it
    shared = global_batches(monkeypatch, instances=instances, replicas=replicas, batch_size=16 // replicas, **options)

    # THEN every step reads the same items, in the same order, and the remainder (4) is left out
    assert alone == shared
    assert 6 == len(shared)


@given(n=st.integers(0, 60), batch=st.integers(1, 4), shape=st.sampled_from([(1, 1), (2, 2), (3, 3), (2, 4), (3, 6)]),
       drop_last=st.booleans())
def test_instances_share_each_epoch_out_exactly(n, batch, shape, drop_last) -> None:
    """Every item of an epoch is read once, by one instance, and every instance takes the same number of steps."""
    instances, replicas = shape
    with pytest.MonkeyPatch.context() as patched:
        reads = [batches_of(patched, i, instances=instances, replicas=replicas, n=n, batch_size=batch,
                            drop_last=drop_last, seed=3) for i in range(instances)]
    items = sorted(i for batches in reads for batch_items in batches for i in batch_items)
    kept = n if not drop_last else n - n % (batch * replicas)

    assert len(items) == len(set(items)) == kept
    if drop_last:
        assert 1 == len({len(batches) for batches in reads})


def test_without_drop_last_the_remainder_is_shared_evenly(monkeypatch) -> None:
    """With drop_last=False the last, partial global batch goes one item each to the first replicas."""
    lengths = []
    for i in range(4):
        with monkeypatch.context() as patched:
            launch(patched, i, instances=4, replicas=4)
            lengths.append(len(pdt.DistributedSampler(10, batch_size=2, shuffle=False, drop_last=False)))

    assert [3, 3, 2, 2] == lengths


def test_each_iteration_is_a_new_epoch_and_set_epoch_goes_back() -> None:
    """Iterating again draws the next permutation; set_epoch(0) draws the first one again."""
    sampler = pdt.DistributedSampler(50, batch_size=5, seed=1)
    first, second = list(sampler), list(sampler)
    sampler.set_epoch(0)

    assert first != second
    assert sorted(first) == sorted(second)
    assert first == list(sampler)


def test_a_replica_reads_its_slice_of_each_global_batch(monkeypatch) -> None:
    """replica=r yields replica r's slices only, here the second of the instance's two replicas."""
    launch(monkeypatch, 1, instances=2, replicas=4)

    sampler = pdt.DistributedSampler(16, batch_size=2, shuffle=False, replica=3)

    assert [6, 7, 14, 15] == list(sampler)


@pytest.mark.parametrize(("options", "message"), [({"batch_size": 0}, "batch_size must be at least 1"),
                                                  ({"batch_size": 1, "replica": 4}, "replica 4 is out of range")])
def test_wrong_sampler_settings_are_refused(monkeypatch, options, message) -> None:
    """A batch size below 1 or a replica index outside the launch is a ValueError."""
    launch(monkeypatch, 0, instances=2, replicas=4)

    with pytest.raises(ValueError, match=message):
        pdt.DistributedSampler(10, **options)


def test_the_data_loader_batches_hold_the_instances_replicas(monkeypatch) -> None:
    """data_loader's batch_size is per replica, as poptorch.DataLoader's: 2 local replicas of 3 make batches of 6."""
    launch(monkeypatch, 0, instances=2, replicas=4)
    data = torch.utils.data.TensorDataset(torch.arange(30))

    sizes = [len(batch[0]) for batch in pdt.data_loader(data, batch_size=3)]

    assert [6, 6] == sizes


def test_one_instance_needs_no_process_group() -> None:
    """Alone, init opens no process group and every collective is the identity."""
    # GIVEN a model, a tensor and metrics, outside any launch
    model = torch.nn.Linear(3, 2)
    model(torch.ones(1, 3)).sum().backward()
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    grads = [p.grad.clone() for p in model.parameters()]

    # WHEN every collective runs
    pdt.init_process_group()
    pdt.broadcast_parameters(model)
    pdt.all_reduce_gradients(model)
    reduced = pdt.all_reduce(torch.tensor([1.0, 2.0]))
    metrics = pdt.all_reduce_metrics({"loss": 0.5, "seen": 3})
    ran = pdt.execute_on_instances({0}, lambda: "saved")

    # THEN nothing changed, and no torch.distributed group exists
    assert ("single", False) == (pdt.collective_backend(), torch.distributed.is_initialized())
    assert all(torch.equal(weights[k], v) for k, v in model.state_dict().items())
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters(), strict=True))
    assert [1.0, 2.0] == reduced.tolist()
    assert {"loss": 0.5, "seen": 3.0} == metrics
    assert "saved" == ran
    pdt.destroy_process_group()
    assert (False, False) == (pdt.is_initialized(), popdist.is_initialized())


def test_collectives_of_several_instances_need_init(monkeypatch) -> None:
    """With other instances and no init_process_group, a collective says what to call first."""
    launch(monkeypatch, 0, instances=2, replicas=2)

    with pytest.raises(RuntimeError, match=r"init_process_group\(\) first"):
        pdt.all_reduce(torch.ones(1))


class OtherInstance:
    """A fake transport: one other instance, whose contribution to each sum is ``theirs``."""

    name = "fake"

    def __init__(self, theirs: torch.Tensor) -> None:
        self.theirs = theirs
        self.calls = 0

    def all_reduce(self, flat: torch.Tensor, op: str) -> None:
        assert op in {"sum", "mean"}
        self.calls += 1
        flat.add_(self.theirs)

    def broadcast(self, flat: torch.Tensor, root: int) -> None:
        assert 0 == root
        flat.copy_(self.theirs)


def test_gradients_weigh_each_instance_by_its_replicas(monkeypatch) -> None:
    """An instance with 1 of 3 replicas weighs 1/3; the other (2 replicas, already weighted 2/3) adds its part."""
    # GIVEN instance 0 holding 1 of 3 replicas, and a model whose 6 gradients are all 3
    monkeypatch.setenv(env.NUM_TOTAL_REPLICAS, "3")
    monkeypatch.setenv(env.NUM_LOCAL_REPLICAS, "1")
    monkeypatch.setenv(env.NUM_INSTANCES, "2")
    monkeypatch.setenv(env.INSTANCE_INDEX, "0")
    model = torch.nn.Linear(2, 2)
    for p in model.parameters():
        p.grad = torch.full_like(p, 3.0)
    other = OtherInstance(torch.full((6,), 4.0))
    monkeypatch.setattr(pdt._STATE, "collectives", other)

    # WHEN the gradients are reduced
    pdt.all_reduce_gradients(model)

    # THEN each is 3 * 1/3 + 4, in one collective for all of them
    assert all(torch.equal(torch.full_like(p, 5.0), p.grad) for p in model.parameters())
    assert 1 == other.calls


def test_mean_divides_by_the_instances_and_keeps_shapes_and_dtypes(monkeypatch) -> None:
    """all_reduce(op="mean") sums then divides by the instances; broadcast writes back every tensor whole."""
    launch(monkeypatch, 0, instances=2, replicas=2)
    monkeypatch.setattr(pdt._STATE, "collectives", OtherInstance(torch.tensor([3.0, 5.0, 7.0, 9.0])))
    model = torch.nn.Linear(1, 2)  # weight (2, 1) then bias (2,): 4 values, broadcast in one piece

    mean = pdt.all_reduce(torch.tensor([[1.0, 1.0], [1.0, 1.0]]))
    pdt.broadcast_parameters(model)

    assert [[2.0, 3.0], [4.0, 5.0]] == mean.tolist()
    assert ([[3.0], [5.0]], [7.0, 9.0]) == (model.weight.tolist(), model.bias.tolist())


def test_default_backend_is_gloo_on_cpu() -> None:
    """Without CUDA the process group is gloo and the device is the CPU."""
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")

    assert ("gloo", torch.device("cpu")) == (pdt.default_backend(), pdt.device())
