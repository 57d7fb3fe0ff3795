"""Stub (replaced by the port plan): picks a free port pair here."""

from __future__ import annotations

from collections.abc import Mapping

from poprun.core.diagnostic import Diagnostic


def _free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def choose_port(backend: object, host: str, *, environ: Mapping[str, str], avoid: tuple[int, ...] = ()) -> int:
    """Return a port P with P and P+1 free here."""
    import random

    while True:
        port = random.randrange(20000, 30000)  # noqa: S311
        if port not in avoid and _free(port) and _free(port + 1):
            return port


def check_port(backend: object, host: str, port: int, *, environ: Mapping[str, str]) -> Diagnostic | None:
    """Return None."""
    return None
