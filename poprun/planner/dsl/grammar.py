"""
The DSL's grammar: ``poprun/grammars/spec.lark`` plus the option table's one-field statements.

Layer: ``poprun.planner``; imports ``poprun.core``, the option table and lark (on first use
only, to keep ``import poprun`` fast). Statements with structure (hosts, the topology line,
``partition NAME at SERVER (...)``, variables, per-instance lines, ``run``) are written in
``spec.lark``; a statement that sets one spec field is declared by its row of
:data:`poprun.planner.option.OPTIONS` (``dsl``, ``dsl_on``, ``dsl_off``, ``dsl_in``), and
:func:`grammar_text` writes its rule, so that the reader (:mod:`.read`) and the writer
(:mod:`.write`) find every such statement in :data:`STATEMENTS`.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from poprun.core.record import positional_record
from poprun.planner import value as conv
from poprun.planner.option import OPTIONS, Option

if TYPE_CHECKING:  # lark is imported on first use, not with poprun
    from lark import Lark

__all__ = ["CONTEXTS", "PATH", "START_WORDS", "STATEMENTS", "WORD", "Statement", "dsl_parser", "grammar_text",
           "split_server"]

# Where a table statement stands -> the grammar rule that lists them (spec.lark uses these rules).
CONTEXTS = {"": "_option_statement", "partition": "_partition_option", "ssh key": "_ssh_key_option"}
_NUMBER_KINDS = ("int", "nonneg", "count", "port")
# A word of the language, a path: as the WORD and PATH terminals of spec.lark.
WORD = re.compile(r"[^\s'\"#,()][^\s,()]*")
PATH = re.compile(r"[^\s'\"#]\S*")
# The order in which messages list the words a statement may start with (as in the docs);
# a statement the table adds later is listed after these.
_START = ("hosts", "partition", "forward", "set", "mask", "mpi", "instance", "placement", "numa", "cache", "offline",
          "autoreport", "subnet", "print", "output", "distribute", "ssh", "allow", "verbosity", "backend", "never",
          "cd", "run", "no", "spare")

_PARSER: Lark | None = None


@positional_record
class Statement:
    """
    A one-field statement of the option table: ``role`` is ``value``, ``on`` or ``off``.

    ``words`` are its keywords; a ``value`` statement is followed by the value.
    """

    rule: str
    option: Option
    role: str
    words: tuple[str, ...]

    @property
    def field(self) -> str:
        """The spec field the statement sets."""
        assert self.option.field is not None
        return self.option.field

    @property
    def constant(self) -> object:
        """The value an ``on``/``off`` statement sets: True/False, or for a path, ``cache off``'s empty path."""
        return (self.role == "on") if self.option.kind == "bool" else ""

    @property
    def terminal(self) -> str:
        """The grammar symbol of a ``value`` statement's value."""
        if self.option.kind in _NUMBER_KINDS:
            return "NUMBER"
        return "_path" if self.option.kind == "path" and not self.option.dsl_in else "_value"


def _statements() -> dict[str, Statement]:
    found: dict[str, Statement] = {}
    for option in OPTIONS:
        for role, words in (("value", option.dsl), ("on", option.dsl_on), ("off", option.dsl_off)):
            if words and option.field:
                rule = f"{role}_{option.field}"
                found[rule] = Statement(rule, option, role, tuple(words.split()))
    return found


# Rule name -> statement, in the table's order.
STATEMENTS: dict[str, Statement] = _statements()
START_WORDS: tuple[str, ...] = (*_START, *dict.fromkeys(
    s.words[0] for s in STATEMENTS.values() if not s.option.dsl_in and s.words[0] not in _START))


def grammar_text() -> str:
    """Return the whole grammar: ``spec.lark``, then a rule for each statement of the option table."""
    from importlib.resources import files

    text = files("poprun.grammars").joinpath("spec.lark").read_text(encoding="utf-8")
    lines = ["", "// ---- one-field statements, from the option table (poprun/planner/option.py) ----"]
    for context, list_rule in CONTEXTS.items():
        rules = [s for s in STATEMENTS.values() if s.option.dsl_in == context]
        lines.append(f"{list_rule}: {' | '.join(s.rule for s in rules)}")
        for statement in rules:
            value = f" {statement.terminal}" if statement.role == "value" else ""
            keywords = " ".join(f'"{word}"' for word in statement.words)
            lines.append(f"{statement.rule}: {keywords}{value}")
    return text + "\n".join(lines) + "\n"


def dsl_parser() -> Lark:
    """Return the LALR parser of the grammar (start symbols ``file`` and ``statement``), built once."""
    global _PARSER  # noqa: PLW0603 - a lazily built, immutable cache
    if _PARSER is None:
        from lark import Lark

        _PARSER = Lark(grammar_text(), parser="lalr", lexer="contextual", propagate_positions=True,
                       start=["file", "statement"])
    return _PARSER


def split_server(text: str) -> tuple[str | None, str | None, int]:
    """Return (host, port text, column offset of the port) of ``host[:port]`` or ``[ipv6][:port]``."""
    hint = "write the server as HOST, HOST:PORT or [IPV6]:PORT"
    if text.startswith("["):
        close = text.find("]")
        rest = text[close + 1:]
        if close < 0 or rest[:1] not in ("", ":"):
            raise conv.InvalidValueError(f"'{text}' is not a server address", hint)
        return text[1:close], (rest[1:] if rest else None), close + 2
    if text.count(":") == 1:
        host, port = text.split(":")
        return host or None, port, len(host) + 1
    return text, None, 0
