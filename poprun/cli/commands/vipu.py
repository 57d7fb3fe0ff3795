"""
``poprun vipu-server``: the emulated V-IPU service (:mod:`poprun.partitions.emulator`).

Layer: ``poprun.cli``.
"""

from __future__ import annotations

from poprun.cli.session import Session


def vipu_server(args: list[str], _session: Session) -> int:
    """``poprun vipu-server [--host H] [--port P] [--db FILE] [--ipus N] [--ild-size N]``: the emulated V-IPU service."""
    from poprun.partitions.emulator import main as serve

    return serve(args)
