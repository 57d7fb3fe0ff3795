"""
The names of this machine: those that mean the host poprun runs on.

Layer: ``poprun.core``; the standard library only. One definition for the planner (which
hosts get this machine's topology, which plans need no remote backend) and the backends
(which instances start as child processes here): ``localhost``, the loopback addresses, this
host's name and its first label (``pod1`` of ``pod1.example.com``).
"""

from __future__ import annotations

import os

LOOPBACK = ("localhost", "127.0.0.1", "::1")


def local_names() -> tuple[str, ...]:
    """Return the names of this machine (see the module docstring), sorted."""
    name = os.uname().nodename
    return tuple(sorted({*LOOPBACK, name, name.split(".")[0]}))


def is_this_machine(host: str) -> bool:
    """Return whether ``host`` names this machine: localhost, a loopback address, or this host's name."""
    return host in local_names()
