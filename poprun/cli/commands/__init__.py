"""
The commands of ``poprun``, one module each.

``plan``, ``validate``, ``apply`` and the classic form (:mod:`~poprun.cli.commands.launch`),
``render``, ``submit``, ``vipu-server``, and the commands over run records
(``ps``, ``logs``, ``report``, ``stop``, ``attach``: :mod:`~poprun.cli.commands.runs`).

Layer: ``poprun.cli``. A command is a function ``(args, session) -> exit status``;
:func:`handler` imports only the module of the command asked for (start-up).
"""

from __future__ import annotations

from collections.abc import Callable

from poprun.cli.session import Session

Command = Callable[[list[str], Session], int]

# command name -> (module under poprun.cli.commands, function)
COMMANDS: dict[str, tuple[str, str]] = {
    "plan": ("plan", "plan"),
    "validate": ("validate", "validate"),
    "apply": ("launch", "apply"),
    "render": ("render", "render"),
    "submit": ("submit", "submit"),
    "vipu-server": ("vipu", "vipu_server"),
    "ps": ("runs", "ps"),
    "logs": ("runs", "logs"),
    "report": ("runs", "report"),
    "stop": ("runs", "stop"),
    "attach": ("runs", "attach"),
}
CLASSIC: tuple[str, str] = ("launch", "classic")


def handler(name: str | None) -> Command:
    """Return the command ``name`` (one of :data:`COMMANDS`), or the classic form for None."""
    module, function = COMMANDS[name] if name is not None else CLASSIC
    found: Command = getattr(__import__(f"poprun.cli.commands.{module}", fromlist=[function]), function)
    return found
