"""
popdist.torch reports progress: the data loader's batches as steps, the gradient reduction as a heartbeat.

Every call sends here (the send interval is set to 0 and the test clock stands still), so each
report is one datagram, read by the strict parser of ``test_popdist_progress``.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")

import popdist  # noqa: E402
import popdist.torch as pdt  # noqa: E402
from popdist import _contract, _progress  # noqa: E402
from tests.unit.test_popdist_progress import Clock, Receiver, fence, open_channel  # noqa: E402


@pytest.fixture
def channel(monkeypatch) -> Iterator[tuple[Receiver, Clock]]:
    """The channel of ``test_popdist_progress``, one instance, every call sent at once."""
    for name in (_contract.NUM_TOTAL_REPLICAS, _contract.NUM_LOCAL_REPLICAS, _contract.NUM_INSTANCES):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(_progress, "INTERVAL_S", 0.0)
    monkeypatch.setattr(_progress, "FINAL_INTERVAL_S", 0.0)
    with open_channel(monkeypatch) as opened:
        yield opened


def dataset(items: int) -> torch.utils.data.TensorDataset:
    """Return ``items`` items of one feature each."""
    return torch.utils.data.TensorDataset(torch.arange(items, dtype=torch.float32).reshape(items, 1))


def test_the_loader_reports_the_batches_done_of_each_epoch(channel):
    """10 batches: (0 .. 10) of 10 before each batch and at the end, with the epoch as a metric; then epoch 1."""
    receiver, _ = channel
    loader = pdt.data_loader(dataset(40), batch_size=4, shuffle=False)

    batches = [len(list(loader)), len(list(loader))]
    fence(receiver.port)

    got = receiver.until_fence()
    assert [10, 10] == batches
    assert [("p", step, 10, {"epoch": epoch}) for epoch in (0, 1) for step in range(11)] == [
        (d["k"], d["s"], d["n"], d["m"]) for d in got]


def test_once_the_program_reports_its_own_steps_the_loader_only_beats(channel):
    """After ``popdist.progress`` was called by the program, the loader's batches are heartbeats: no two step counts."""
    receiver, _ = channel
    loader = pdt.data_loader(dataset(8), batch_size=4, shuffle=False)
    popdist.progress(1, 100)

    for step, _batch in enumerate(loader, start=2):
        popdist.progress(step, 100, loss=0.5)
    fence(receiver.port)

    got = receiver.until_fence()
    assert [("p", 1), ("h", None), ("p", 2), ("h", None), ("p", 3), ("h", None)] == [(d["k"], d.get("s")) for d in got]


def test_reducing_gradients_beats_a_heartbeat(channel):
    """``all_reduce_gradients`` (one instance: nothing to reduce) still tells poprun the instance is alive."""
    receiver, _ = channel
    model = torch.nn.Linear(2, 1)
    model(torch.ones(1, 2)).sum().backward()

    pdt.all_reduce_gradients(model)
    fence(receiver.port)

    assert [("h", 1)] == [(d["k"], d["c"]) for d in receiver.until_fence()]


def test_without_poprun_the_loader_is_torchs_loader_with_nothing_sent(monkeypatch):
    """No POPRUN_PROGRESS: the loader yields the same batches as torch's own over the same sampler."""
    monkeypatch.delenv(_contract.PROGRESS, raising=False)
    monkeypatch.setattr(_progress, "_SENDER", None)
    data = dataset(12)
    loader = pdt.data_loader(data, batch_size=4, shuffle=False)
    plain = torch.utils.data.DataLoader(data, batch_size=4, sampler=loader.sampler)

    assert [b[0].tolist() for b in plain] == [b[0].tolist() for b in loader]
    assert _progress._SENDER is False
