"""
The commands of ``poprun``, one module each, and the one table of them.

``plan``, ``validate``, ``apply`` and the classic form (:mod:`~poprun.cli.commands.launch`),
``render``, ``submit``, ``vipu-server``, and the commands over run records
(``ps``, ``logs``, ``report``, ``stop``, ``attach``: :mod:`~poprun.cli.commands.runs`).

Layer: ``poprun.cli``. A command is a function ``(args, session) -> exit status``;
:func:`handler` imports only the module of the command asked for (start-up).

:data:`COMMANDS` is the table: a row per command with its module, its usage lines and its
option rows. ``poprun.cli.main`` recognises a subcommand by it, ``poprun --help`` lists its
usage lines (:mod:`poprun.cli.helptext`), a command's ``--help`` shows its row, and
:func:`poprun.planner.flags.parse_arguments` reads a command's options from its rows (with
the diagnostics and carets of a launch's options). A command whose ``options`` is None takes
the options of a launch (the option table, ``poprun.planner.option``) through
:func:`poprun.planner.flags.parse_flags`. A new command is a row here and a module.
"""

from __future__ import annotations

from collections.abc import Callable

from poprun.cli.session import Session
from poprun.core.record import positional_record
from poprun.partitions.serveroption import OPTIONS as SERVER_OPTIONS
from poprun.partitions.serveroption import USAGE as SERVER_USAGE
from poprun.planner.flags import Arguments, parse_arguments
from poprun.planner.flags import CommandOption as Opt

Command = Callable[[list[str], Session], int]


@positional_record
class CommandRow:
    """
    One command: ``name`` (the first word), the ``module`` under ``poprun.cli.commands`` and its ``function``.

    ``usage``: its usage lines, each after ``poprun `` (the first one is the one diagnostics
    quote); ``options``: its option rows, or None for a launch's options (the option table).
    """

    name: str
    module: str
    function: str
    usage: tuple[str, ...]
    options: tuple[Opt, ...] | None = None

    @property
    def synopsis(self) -> str:
        """Return the first usage line with ``poprun`` in front: ``poprun logs RUN [--instance N] ...``."""
        return f"poprun {self.usage[0]}"


_INSTANCE = Opt("instance", ("--instance", "-i"), "N", "only instance N's output")

COMMANDS: tuple[CommandRow, ...] = (
    CommandRow("plan", "plan", "plan", (
        "plan [SPEC] [options] [--explain] [--format text|json|toml|dot|sbatch] [-o FILE] [program [args]]",
        "plan PLAN.json [--explain] [--format text|json|dot] [-o FILE]",
        "plan --diff OLD.json [SPEC] [options] [--format text|json] [program [args]]",
        "plan --diff OLD.json NEW.json [--format text|json]")),
    CommandRow("apply", "launch", "apply", ("apply SPEC|PLAN.json [options] [program [args]]",)),
    CommandRow("render", "render", "render", ("render [SPEC] [options] [-o FILE.svg|png|dot] [--expand]",)),
    CommandRow("submit", "submit", "submit", ("submit [--dry-run] [--wait] [--nodes N] [SPEC] [options] program [args]",), (
        Opt("dry_run", ("--dry-run",), "", "print the batch script instead of submitting it"),
        Opt("wait", ("--wait",), "", "wait for the job to end and exit with its status"),
        Opt("nodes", ("--nodes",), "N", "the job's nodes when the spec names no hosts"))),
    CommandRow("validate", "validate", "validate", ("validate SPEC [options]",)),
    CommandRow("vipu-server", "vipu", "vipu_server", (SERVER_USAGE,), SERVER_OPTIONS),
    CommandRow("ps", "runs", "ps", ("ps [--all] [--json]",), (
        Opt("all", ("--all", "-a"), "", "every run, not only the running ones and the last 10 ended"),
        Opt("json", ("--json",), "", "the runs as JSON"))),
    CommandRow("logs", "runs", "logs", ("logs RUN [--instance N] [--attempt K] [-f] [--tail N] [--tag]",), (
        _INSTANCE,
        Opt("attempt", ("--attempt",), "K", "attempt K's output (of a run that restarted)"),
        Opt("follow", ("--follow", "-f"), "", "go on with the output as it comes, until the run is over"),
        Opt("tail", ("--tail", "-n"), "N", "only the last N lines"),
        Opt("tag", ("--tag",), "", "tag each line with its instance and stream, as mpirun's --tag-output"))),
    CommandRow("report", "runs", "report", ("report RUN [--json]",), (
        Opt("json", ("--json",), "", "the report as JSON, as the run wrote it"),)),
    CommandRow("stop", "runs", "stop", ("stop RUN [--timeout SECONDS]",), (
        Opt("timeout", ("--timeout",), "SECONDS", "how long to wait for the run to end (default 15)"),)),
    CommandRow("attach", "runs", "attach", ("attach RUN",), ()),
)
CLASSIC = CommandRow("", "launch", "classic", ("[options] program [program args]",))
BY_NAME: dict[str, CommandRow] = {row.name: row for row in COMMANDS}


def read_arguments(name: str, args: list[str], *, words: int = 0, leading: bool = False) -> Arguments:
    """
    Return the words and options of ``poprun NAME ARGS`` read against the command's rows (see :func:`parse_arguments`).

    Diagnostics:
        PR101, PR102, PR104, PR112, with the command's first usage line in the hints.
    """
    row = BY_NAME[name]
    return parse_arguments(args, row.options or (), prog=f"poprun {name}", usage=row.synopsis, words=words,
                           leading=leading)


def handler(name: str | None) -> Command:
    """Return the command ``name`` (a row of :data:`COMMANDS`), or the classic form for None."""
    row = BY_NAME[name] if name is not None else CLASSIC
    found: Command = getattr(__import__(f"poprun.cli.commands.{row.module}", fromlist=[row.function]), row.function)
    return found
