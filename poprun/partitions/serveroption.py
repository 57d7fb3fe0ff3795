"""
``poprun vipu-server``'s options: its rows of the command table, read by the flags parser.

Layer: ``poprun.partitions``; imports ``poprun.core`` and :mod:`poprun.planner.flags` only, so
that the command table (``poprun.cli.commands``) takes these rows without importing the server.
:func:`parse_server_options` serves both ``poprun vipu-server`` and the module entry point
``python -m poprun.partitions.emulator``; the ranges are checked by the server itself
(:func:`poprun.partitions.emulator.run`: one line, exit 2).
"""

from __future__ import annotations

from collections.abc import Sequence

from poprun.core.diagnostic import DiagnosticError, error
from poprun.core.record import record
from poprun.core.span import SourceSpan
from poprun.planner.flags import CommandOption, parse_arguments

REQUEST_TIMEOUT_S = 10.0  # to read one request in total (also an idle connection's life), and to write its answer
USAGE = ("vipu-server [--host H] [--port P] [--db FILE] [--ipus N] [--ild-size N] [--inventory FILE] "
         "[--request-timeout SECONDS]")
OPTIONS: tuple[CommandOption, ...] = (
    CommandOption("host", ("--host",), "H", "address to listen on (default 127.0.0.1)"),
    CommandOption("port", ("--port",), "P", "port to listen on; 0 picks a free one (default 8090)"),
    CommandOption("db", ("--db",), "FILE", "SQLite file of the partitions (made if missing)"),
    CommandOption("ipus", ("--ipus",), "N", "IPUs of the inventory (default 64, a Pod64)"),
    CommandOption("ild_size", ("--ild-size",), "N", "IPUs per IPU-Link domain (default 16)"),
    CommandOption("inventory", ("--inventory",), "FILE", "a JSON inventory file (ipus, ild_size, partitions, faults)"),
    CommandOption("request_timeout", ("--request-timeout",), "SECONDS", "time a client has to send a whole request "
                  "(and then to read its answer); an idle connection is closed after it too "
                  f"(default {REQUEST_TIMEOUT_S:g})"),
)


@record
class ServerOptions:
    """What ``poprun vipu-server`` was asked for (its defaults: a Pod64 on 127.0.0.1:8090)."""

    host: str = "127.0.0.1"
    port: int = 8090
    db: str = "vipu-server.sqlite"
    ipus: int = 64
    ild_size: int = 16
    inventory: str | None = None
    request_timeout: float = REQUEST_TIMEOUT_S


def parse_server_options(argv: Sequence[str]) -> ServerOptions | None:
    """
    Return the options of ``poprun vipu-server ARGV``, or None when ``--help`` was asked for.

    Diagnostics:
        PR101, PR104, PR112 (:func:`~poprun.planner.flags.parse_arguments`); PR105 for a number
        that is not one (``--port abc``).
    """
    given = parse_arguments(argv, OPTIONS, prog="poprun vipu-server", usage=f"poprun {USAGE}")
    if given.help:
        return None
    values: dict[str, object] = {}
    for name, text in given.options:
        flag = "--" + name.replace("_", "-")
        if name in ("port", "ipus", "ild_size"):
            values[name] = _number(int, text, flag, "a whole number")
        elif name == "request_timeout":
            values[name] = _number(float, text, flag, "a number of seconds")
        else:
            values[name] = text
    return ServerOptions(**values)  # type: ignore[arg-type]


def _number(kind: type[int | float], text: str, flag: str, what: str) -> int | float:
    """Return ``text`` read as ``kind`` (as Python reads numbers: ``int`` or ``float``); PR105 when it is not one."""
    try:
        return kind(text)
    except ValueError:
        shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:40])  # no escape reaches the terminal
        raise DiagnosticError([error("PR105", f"invalid value for {flag}", detail=f"'{shown}' is not {what}",
                                     span=SourceSpan.flag(flag), hint=f"write e.g. {flag}=10")]) from None
