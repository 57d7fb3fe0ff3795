"""
Which Poplar device an instance attaches to: :func:`device_id`, the model behind ``getDeviceId``.

Standalone: standard library only; never imports ``poprun``. Without IPUs there is no device
server to ask, so the id is computed from the launch, in the layout of a Poplar device list
for a partition of ``P`` IPUs: first the ``P`` single-IPU devices (ids ``0..P-1``), then the
``P/2`` two-IPU devices, then the ``P/4`` four-IPU devices, and so on up to one device with
all ``P`` IPUs. An instance owns ``L * R`` IPUs (``L`` local replicas of ``R`` IPUs each)
starting at IPU ``offset * R``; its device is the ``S``-IPU device holding them, ``S = L * R``:

    device_id = P + P/2 + ... + 2*S  (the ids of all smaller devices)  +  offset * R // S

On a POD16 launched with 8 replicas, 4 instances and 2 IPUs per replica (P = 16, S = 4),
instance ``i`` gets ``16 + 8 + i = 24 + i``, the Poplar 4-IPU device ids real poprun printed;
with 64 replicas on 16 instances of 4 (P = 64, S = 4), instance ``i`` gets ``96 + i``, the
children of the 64-IPU parent device 126. Poplar only makes devices of ``2**k`` IPUs, so ``S``
and ``P`` are rounded up to a power of two (a case real PopDist had no device for).
"""

from __future__ import annotations

import os

from popdist import _contract as env


def device_id(ipus_per_replica: int | None = None) -> int:
    """
    Return the id of the Poplar device this instance attaches to (the module docstring's formula).

    Args:
        ipus_per_replica: IPUs per replica; ``None`` or 0 reads ``POPDIST_NUM_IPUS_PER_REPLICA``.

    Returns:
        The device id; 0 for a single-IPU run without poprun.
    """
    per_replica = ipus_per_replica or env.num_ipus_per_replica(os.environ)
    return poplar_device_id(
        first_ipu=env.replica_index_offset(os.environ) * per_replica,
        num_ipus=env.num_local_replicas(os.environ) * per_replica,
        partition_ipus=env.num_total_replicas(os.environ) * per_replica,
    )


def poplar_device_id(*, first_ipu: int, num_ipus: int, partition_ipus: int) -> int:
    """
    Return the id of the device of ``num_ipus`` IPUs that holds IPU ``first_ipu`` of the partition.

    Raises:
        ValueError: when a count is not positive or ``first_ipu`` is negative.
    """
    if num_ipus < 1 or partition_ipus < 1 or first_ipu < 0:
        raise ValueError(f"no Poplar device holds {num_ipus} IPUs from IPU {first_ipu} of {partition_ipus}")
    size = _power_of_two_at_least(num_ipus)
    total = max(_power_of_two_at_least(partition_ipus), size)
    smaller = sum(total >> k for k in range(size.bit_length() - 1))
    return smaller + first_ipu // size


def _power_of_two_at_least(n: int) -> int:
    return 1 << (n - 1).bit_length()


def devices() -> tuple[int, ...]:
    """
    Return this instance's accelerators as the program numbers them (``POPDIST_DEVICES``): ``(0, 1)``.

    With ``poprun --devices-per-instance`` the instance sees only its devices, numbered from 0
    (``--device-visibility own`` or ``local-rank-zero``), or every device of its host and these
    are its own among them (``all``). () when poprun assigned none.
    """
    return env.devices(os.environ)
