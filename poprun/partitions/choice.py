"""
The choice of partition provider for a plan: the real ``vipu`` tool or the emulated service.

Layer: ``poprun.partitions``; imports ``poprun.planner.plan``, the settings table
(``poprun.planner.setting``, through which its settings are read) and the provider types of
:mod:`poprun.partitions.provider`. The providers themselves are imported lazily by
:func:`provider_for`, so importing this module costs little.
"""

from __future__ import annotations

import os
import shutil

from poprun.partitions.provider import EMULATOR_DB_ENV, EMULATOR_INVENTORY_ENV, PROVIDER_ENV, UnreachableError
from poprun.planner.setting import setting_value

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from collections.abc import Mapping

    from poprun.partitions.provider import Provider
    from poprun.planner import plan

__all__ = ["provider_for"]


def provider_for(partition: plan.Partition, environ: Mapping[str, str], *,
                 timeout_s: float | None = None) -> Provider:
    """
    Return the provider for the plan's partition section.

    ``POPRUN_PARTITION_PROVIDER``: ``vipu`` (the ``vipu`` tool), ``emulated`` (the emulated
    service at the plan's server host:port, over HTTP), or unset/``auto``: ``vipu`` when the
    tool is on PATH, else ``emulated``. With ``emulated`` and ``POPRUN_VIPU_EMULATOR_DB`` or
    ``POPRUN_VIPU_EMULATOR_INVENTORY`` set, the emulated service runs in this process on that
    SQLite file (``:memory:`` when only the inventory is given): no server, used by tests.
    ``timeout_s`` bounds each request (default: the plan's V-IPU server timeout).

    Raises:
        UnreachableError: the in-process service's inventory or database cannot be read.
    """
    timeout = float(partition.timeout_s) if timeout_s is None else timeout_s
    choice = (setting_value(PROVIDER_ENV, environ) or "auto").strip().lower() or "auto"
    path = environ.get("PATH", os.defpath)
    if choice == "vipu" or (choice == "auto" and shutil.which("vipu", path=path)):
        from poprun.partitions.vipu import VipuProvider

        return VipuProvider(partition.server_host, partition.server_port, timeout_s=timeout, path=path)
    db, inventory = setting_value(EMULATOR_DB_ENV, environ), setting_value(EMULATOR_INVENTORY_ENV, environ)
    if db or inventory:
        import sqlite3

        from poprun.partitions.store import Inventory, Store

        try:
            return Store(db or ":memory:", Inventory.from_file(inventory) if inventory else Inventory(),
                         address=f"{partition.server_host}:{partition.server_port}")
        except (OSError, ValueError, KeyError, TypeError, AttributeError, sqlite3.Error) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"{type(exc).__name__}: {exc}"
            msg = f"cannot open the in-process emulated V-IPU service ({EMULATOR_INVENTORY_ENV}, {EMULATOR_DB_ENV}): {why}"
            raise UnreachableError(msg) from exc
    from poprun.partitions.emulated import EmulatedProvider

    return EmulatedProvider(partition.server_host, partition.server_port, timeout_s=timeout)
