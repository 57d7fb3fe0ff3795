"""popdist's view of the devices poprun gave the instance: POPDIST_DEVICES, devices(), getDevices(), popdist.torch.device()."""

from __future__ import annotations

import pytest

import popdist
from popdist import _contract


@pytest.mark.parametrize(("value", "expected"), [
    ("0", (0,)), ("2,3", (2, 3)), (" 0,1 ", (0, 1)), ("", ()), ("a,b", ()), ("0,,1", ()), ("-1", ()),
    ("1" * 7, ()), ("$(id)", ()), ("0,1\n2", ()),
    # digits of other scripts: int() refuses some ('²') and reads others ('٣' is 3): neither is poprun's
    ("\u00b2", ()), ("0,\u00b9", ()), ("\u0663", ()), ("\uff11", ()),
    ("0,0", ()),  # one device named twice is not a list poprun writes
])
def test_the_contract_reads_a_list_of_indices_or_nothing(value: str, expected: tuple) -> None:
    """Indices only; anything else (a forged or garbled value) is no device, never an exception."""
    assert expected == _contract.devices({"POPDIST_DEVICES": value})


def test_devices_and_get_devices_read_the_instances_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    """popdist.devices() is a tuple, getDevices() the camelCase list; () and [] without poprun's devices."""
    monkeypatch.setenv("POPDIST_DEVICES", "2,3")
    assert ((2, 3), [2, 3], [2, 3]) == (popdist.devices(), popdist.getDevices(), popdist.popdist_core.getDevices())
    monkeypatch.delenv("POPDIST_DEVICES")
    assert ((), []) == (popdist.devices(), popdist.getDevices())


def test_torch_device_is_the_first_of_its_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    """
    popdist.torch.device(): the CPU without CUDA; with it, cuda:<first of POPDIST_DEVICES>, else the old rule.

    No GPU exists here: torch.cuda's answers are set to those of a host with 8 GPUs (the only
    two calls device() makes), a faithful model of what CUDA reports.
    """
    torch = pytest.importorskip("torch")
    import popdist.torch as pt

    monkeypatch.setenv("POPDIST_DEVICES", "4,5")
    monkeypatch.setenv("POPDIST_LOCAL_INSTANCE_INDEX", "1")
    assert torch.device("cpu") == pt.device()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert torch.device("cuda", 4) == pt.device()
    monkeypatch.setenv("POPDIST_DEVICES", "9")  # not a device this process sees: the local index's
    assert torch.device("cuda", 1) == pt.device()
    monkeypatch.delenv("POPDIST_DEVICES")
    assert torch.device("cuda", 1) == pt.device()
