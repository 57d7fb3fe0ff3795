"""
``poprun --help`` and each command's ``--help``: made from the command table and the option table.

Layer: ``poprun.cli``. The usage lines are the command table's (:data:`poprun.cli.commands.COMMANDS`),
the options of a launch the option table's (``poprun.planner.option``), grouped in PopRun's layout.
"""

from __future__ import annotations

from poprun.cli.commands import CLASSIC, COMMANDS, CommandRow
from poprun.planner.flags import describe_options, describe_usage, spelling
from poprun.planner.option import OPTIONS


def render_usage() -> str:
    """Return the usage lines of poprun: the classic form, then every command's."""
    return describe_usage([*CLASSIC.usage, *(line for row in COMMANDS for line in row.usage)])


def render_help() -> str:
    """Return the help text."""
    groups: dict[str, list[str]] = {}
    for option in OPTIONS:
        name = spelling(option.flags)
        if option.takes_value:
            name += " arg"
        default = f" (default: {option.default})" if option.default else ""
        groups.setdefault(option.group, []).append(f"  {name:<36} {option.help}{default}")
    parts = [render_usage()]
    for group, lines in groups.items():
        parts.append(f"{group} options:\n" + "\n".join(lines) + "\n")
    from poprun.planner.setting import help_lines

    parts.append("\n".join(help_lines()) + "\n")
    return "\n".join(parts)


def render_command_help(row: CommandRow) -> str:
    """Return the ``--help`` of a command with option rows: its usage lines, then its options."""
    return describe_options(row.usage, row.options or ())
