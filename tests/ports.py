"""Free TCP ports for tests and benchmarks that start distributed programs (test support, stdlib only)."""

from __future__ import annotations

import socket


def free_port_pair() -> int:
    """Return a port ``p`` with ``p`` and ``p + 1`` free: torch meets on MASTER_PORT, popdist on the next."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        with socket.socket() as other:
            try:
                other.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
