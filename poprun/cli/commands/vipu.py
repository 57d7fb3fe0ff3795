"""
``poprun vipu-server``: the emulated V-IPU service (:mod:`poprun.partitions.emulator`).

Layer: ``poprun.cli``. Its options are its rows of the command table
(:mod:`poprun.partitions.serveroption`), read by the flags parser: a bad one is a diagnostic with
its caret, exit 2, before the server module is imported.
"""

from __future__ import annotations

from poprun.cli.session import Session


def vipu_server(args: list[str], _session: Session) -> int:
    """``poprun vipu-server [--host H] [--port P] [--db FILE] [--ipus N] [--ild-size N] ...``: the emulated V-IPU service."""
    from poprun.partitions.serveroption import parse_server_options

    options = parse_server_options(args)
    if options is None:
        from poprun.cli.commands import BY_NAME
        from poprun.cli.helptext import render_command_help

        return _show(render_command_help(BY_NAME["vipu-server"]))
    from poprun.partitions.emulator import run

    return run(options)


def _show(text: str) -> int:
    import sys

    sys.stdout.write(text)
    return 0
