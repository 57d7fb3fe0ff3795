"""
NUMA memory policy for the next child: prefer an instance's own NUMA nodes (Linux ``set_mempolicy``).

Layer: ``poprun.process``; the standard library (ctypes, already loaded by the watchdog).

A child inherits the memory policy of the thread that starts it, as it inherits its CPU
affinity; :func:`prefer` sets this thread's before a start and :func:`prefer` with None
restores the default after. The policy is *preferred* (``MPOL_PREFERRED_MANY``, Linux 5.15;
``MPOL_PREFERRED`` with the first node on older kernels): memory comes from the instance's
nodes, and from the others when they are full, which is the PopRun guide's "prefers to allocate
memory from its associated NUMA node, it may allocate from other nodes" (section 2.5).
Elsewhere (another architecture, no such call) nothing is set and the kernel's default, local
allocation on the node of the CPU that first touches the memory, does nearly the same.
"""

from __future__ import annotations

import contextlib
import ctypes
import os

_SET_MEMPOLICY = {"x86_64": 238, "aarch64": 237}.get(os.uname().machine)
_MPOL_DEFAULT, _MPOL_PREFERRED, _MPOL_PREFERRED_MANY = 0, 1, 5
_libc: ctypes.CDLL | None = None


def prefer(nodes: tuple[int, ...] | None) -> bool:
    """Make this thread's memory policy prefer ``nodes`` (None or empty: the default); return whether it took."""
    global _libc  # noqa: PLW0603 - one handle on libc, made on first use
    if _SET_MEMPOLICY is None:
        return False
    with contextlib.suppress(OSError, AttributeError):
        _libc = _libc or ctypes.CDLL(None, use_errno=True)
        if not nodes:
            return _call(_MPOL_DEFAULT, ())
        return _call(_MPOL_PREFERRED_MANY, nodes) or _call(_MPOL_PREFERRED, nodes[:1])
    return False


def _call(mode: int, nodes: tuple[int, ...]) -> bool:
    assert _libc is not None
    words = (max(nodes, default=0) // 64) + 1
    mask = (ctypes.c_ulong * words)()
    for node in nodes:
        mask[node // 64] |= 1 << (node % 64)
    maxnode = words * 64 + 1 if nodes else 0
    return int(_libc.syscall(_SET_MEMPOLICY, mode, mask if nodes else None, ctypes.c_ulong(maxnode))) == 0
