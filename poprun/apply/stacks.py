"""Stub (replaced by stack collection)."""

from __future__ import annotations

from collections.abc import Mapping


def collect_stacks(backend: object, hosts: tuple[str, ...], run_id: str, *, environ: Mapping[str, str],
                   timeout_s: float) -> dict[int, str]:
    """Return no stacks."""
    return {}
