"""
Sharding ``n`` items across instances or replicas: :func:`shard_range` and :func:`replica_indices`.

Standalone: standard library only; never imports ``poprun``. Shards are contiguous blocks
in index order (instance ``i``'s block comes before instance ``i + 1``'s), so a shard is a
``range`` that slices lists, arrays and file lists alike. ``drop_last=True`` gives every part
``n // parts`` items and leaves the ``n % parts`` last items to nobody, as a data loader with
``drop_last`` does; ``drop_last=False`` gives the first ``n % parts`` parts one item more.
"""

from __future__ import annotations

import os

from popdist import _contract as env

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Literal


def replica_indices() -> range:
    """Return the global indices of this instance's replicas (``range(0, 1)`` without poprun)."""
    first = env.replica_index_offset(os.environ)
    return range(first, first + env.num_local_replicas(os.environ))


def shard_range(
    n: int, *, by: Literal["instance", "replica"] = "instance", index: int | None = None, drop_last: bool = True
) -> range:
    """
    Return the indices of the items, out of ``range(n)``, that belong to one instance or replica.

    Args:
        n: how many items there are.
        by: ``"instance"`` splits them into ``getNumInstances()`` equal parts; ``"replica"``
            into ``getNumTotalReplicas()`` parts, so an instance gets its replicas' parts
            (in proportion to its replicas, also when they are not uniform).
        index: whose part: an instance index (``by="instance"``) or a global replica index
            (``by="replica"``). ``None`` means this instance, or all of this instance's replicas
            (one contiguous block, the union of their parts).
        drop_last: leave the remainder of ``n`` out (every part is the same size).

    Returns:
        A ``range`` of item indices; without poprun, ``range(n)``.

    Raises:
        ValueError: for a negative ``n``, an unknown ``by`` or an index out of range.
    """
    if n < 0:
        raise ValueError(f"cannot shard a negative number of items ({n})")
    first, count, parts = _selection(by, index)
    return range(_start(n, parts, first, drop_last=drop_last), _start(n, parts, first + count, drop_last=drop_last))


def _selection(by: str, index: int | None) -> tuple[int, int, int]:
    """Return ``(first part, number of parts, parts in all)`` for ``shard_range``'s arguments."""
    if by == "instance":
        parts = env.num_instances(os.environ)
        first, count = (env.instance_index(os.environ) if index is None else index), 1
    elif by == "replica":
        parts = env.num_total_replicas(os.environ)
        mine = replica_indices()
        first, count = (mine.start, len(mine)) if index is None else (index, 1)
    else:
        raise ValueError(f"shard by 'instance' or 'replica', not {by!r}")
    if first < 0 or first + count > parts:
        raise ValueError(f"{by} {first} is out of range: there are {parts} ({by} indices 0 to {parts - 1})")
    return first, count, parts


def _start(n: int, parts: int, k: int, *, drop_last: bool) -> int:
    """Return where part ``k`` of ``parts`` starts (``k == parts``: where the last one ends)."""
    size, extra = divmod(n, parts)
    return k * size if drop_last else k * size + min(k, extra)
