"""
The DSL front end: a ``.pop`` spec that reads aloud, to a :class:`Spec`, and back.

Layer: ``poprun.planner``; imports ``poprun.core``, the option table, the value converters
and lark (on first use only, to keep ``import poprun`` fast). The language is specified by
``poprun/grammars/spec.lark`` and documented in ``docs/spec-dsl.md``.

A file is parsed line by line (one statement per line), so every bad line gets its own
diagnostic and all of them are raised together. Syntax errors become ``PR108`` with the
expected words spelt out; common mistakes are labelled by example, as lark's
``match_examples`` does. :func:`to_dsl` writes a spec back so that
``parse_dsl(to_dsl(spec)) == spec`` (origins do not take part in equality).

The module is longer than the usual budget because reading and writing the language are
two halves of one contract, kept side by side so that they cannot drift apart.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, cast

from poprun.core.diagnostic import Diagnostic, Diagnostics, error
from poprun.core.hint import did_you_mean, join_or
from poprun.core.record import evolve, positional_record
from poprun.core.span import SourceSpan
from poprun.planner import value as conv
from poprun.planner.flags import split_env_args
from poprun.planner.option import BACKENDS, BY_FIELD, PLACEMENTS, ROUTING_TYPES, SSH_KEY_TYPES, SYNC_TYPES
from poprun.planner.spec import EnvVarSpec, InstanceArgsSpec, Sourced, Spec

if TYPE_CHECKING:  # lark is imported on first use, not with poprun
    from lark import Lark, Token, Tree
    from lark.exceptions import UnexpectedInput

__all__ = ["dsl_parser", "load_dsl", "parse_dsl", "to_dsl"]

_PARSER: Lark | None = None
_BLANK = re.compile(r"[ \t]*(?:#.*)?")
_WORD = re.compile(r"[^\s'\"#,()][^\s,()]*")
_PATH = re.compile(r"[^\s'\"#]\S*")
# A `set` value written without quotes by to_dsl: shell-safe characters only.
_BARE = re.compile(r"[\w.:/@%+=,-]+")
_DOCS = "see docs/spec-dsl.md for the statements of the DSL"
_UNITS = ("replicas", "replica", "instances", "ilds", "ild", "ipus", "ipu")
# The order in which messages list the words a statement may start with (as in the docs).
_START = ("hosts", "partition", "forward", "set", "mask", "mpi", "instance", "placement", "numa", "cache", "offline",
          "autoreport", "subnet", "print", "output", "distribute", "ssh", "allow", "verbosity", "backend", "cd",
          "run", "no")
# Spec fields whose repeats add up (like repeated --mpi-*-args) instead of conflicting.
_MERGED = ("mpi_global_args", "mpi_local_args", "mask")
_KEYS = {field: f"{option.section}.{option.key}" for field, option in BY_FIELD.items()}
_KEYS |= {"program": "program.argv", "working_dir": "program.cwd"}


def dsl_parser() -> Lark:
    """Return the LALR parser of ``spec.lark`` (start symbols ``file`` and ``statement``), built once."""
    global _PARSER  # noqa: PLW0603 - a lazily built, immutable cache
    if _PARSER is None:
        from importlib.resources import files

        from lark import Lark

        grammar = files("poprun.grammars").joinpath("spec.lark").read_text(encoding="utf-8")
        _PARSER = Lark(grammar, parser="lalr", lexer="contextual", propagate_positions=True,
                       start=["file", "statement"])
    return _PARSER


def parse_dsl(text: str, *, file: str) -> Spec:
    """
    Return the spec written in the DSL ``text``; ``file`` names it in every span.

    Diagnostics:
        PR108 syntax errors (labelled where the mistake is a common one); PR103 host lists;
        PR105 bad choices, names and words; PR107 unbalanced quotes; PR111 a value given
        twice; PR200 counts below 1; PR212 ports; PR213 subnets. All are raised together.
    """
    reader = _Reader(file)
    for number, line in enumerate(text.split("\n"), start=1):
        reader.read_line(number, line.removesuffix("\r"))
    return reader.finish()


def load_dsl(path: str) -> Spec:
    """
    Return the spec in the DSL file ``path``.

    Diagnostics:
        PR113 when the file cannot be read, and those of :func:`parse_dsl`.
    """
    from poprun.planner.load import read_text  # load imports this module lazily; keep it one-way

    return parse_dsl(read_text(path), file=path)


# ---- reading ---------------------------------------------------------------------------


@positional_record
class _Setting:
    """One value a statement sets: a Spec field (``env`` and ``instance_args`` add an item)."""

    field: str
    value: Sourced[Any]


class _StatementError(Exception):
    """A statement that cannot be read; carries its diagnostic."""

    def __init__(self, diagnostic: Diagnostic) -> None:
        super().__init__(diagnostic.summary)
        self.diagnostic = diagnostic


class _Reader:
    """Collects the settings and diagnostics of a file, one line at a time."""

    def __init__(self, file: str) -> None:
        self.file = file
        self.diags = Diagnostics()
        self.values: dict[str, Sourced[Any]] = {}
        self.env: list[Sourced[EnvVarSpec]] = []
        self.instance_args: list[Sourced[InstanceArgsSpec]] = []

    def read_line(self, number: int, line: str) -> None:
        """Read one line: nothing for blanks and comments, else one statement."""
        if _BLANK.fullmatch(line):
            return
        from lark.exceptions import UnexpectedInput

        try:
            tree = dsl_parser().parse(line, start="statement")
            settings = _Statement(self.file, number, line).read(tree)
        except UnexpectedInput as exc:
            first = (line.split() or [""])[0]
            key = "topology" if first.isdigit() else first if first in _START else "statement"
            self.diags.add(_syntax_error(exc, line, span=SourceSpan(file=self.file, key_path=key, line=number)))
            return
        except _StatementError as problem:
            self.diags.add(problem.diagnostic)
            return
        for setting in settings:
            self._apply(setting, line)

    def _apply(self, setting: _Setting, line: str) -> None:
        field, new = setting.field, setting.value
        if field in ("env", "instance_args"):  # repeats add, as repeated -x do
            getattr(self, field).append(new)
            return
        old = self.values.get(field)
        if old is None:
            self.values[field] = new
        elif field in _MERGED:
            self.values[field] = Sourced(old.value + new.value, old.origin)
        elif old.value != new.value:
            where = f" (line {old.origin.line})" if old.origin.line is not None else ""
            self.diags.add(error("PR111", f"{new.origin.key_path} given twice", span=new.origin,
                                 detail=f"first {old.value!r}{where}, then {new.value!r}", hint="give it once",
                                 related=(old.origin,), source_line=line))

    def finish(self) -> Spec:
        """Return the spec, or raise every diagnostic found."""
        self.diags.raise_if_errors()
        return Spec(**self.values, env=tuple(self.env), instance_args=tuple(self.instance_args))


def _choice(choices: tuple[str, ...]) -> Callable[[str], str]:
    return lambda text: conv.to_choice(text, choices)


# Statements that set one field to a constant.
_SWITCHES: dict[str, tuple[str, object]] = {
    "update": ("update_partition", True), "no_update": ("update_partition", False),
    "reset": ("reset_partition", True), "no_reset": ("reset_partition", False),
    "keep": ("remove_partition", False), "remove": ("remove_partition", True),
    "numa_aware": ("numa_aware", True), "numa_unaware": ("numa_aware", False),
    "print_topology": ("print_topology", True), "no_print_topology": ("print_topology", False),
    "no_offline": ("offline_mode", False), "no_distribute_ssh_key": ("distribute_ssh_key", False),
    "allow_root": ("allow_run_as_root", True), "no_allow_root": ("allow_run_as_root", False),
    "cache_off": ("executable_cache_path", ""),
}
# Statements (and options) that set one field from their last word.
_VALUES: dict[str, tuple[str, Callable[[str], object]]] = {
    "host_file": ("host_file", str), "allocation": ("allocation", str),
    "timeout": ("vipu_server_timeout", conv.to_positive_int),
    "attempts": ("partition_attempts", conv.to_positive_int),
    "sync": ("sync_type", _choice(SYNC_TYPES)),
    "ipu_link_routing": ("ipu_link_routing_type", _choice(ROUTING_TYPES)),
    "gw_link_routing": ("gw_link_routing_type", _choice(ROUTING_TYPES)),
    "port": ("vipu_server_port", conv.to_port), "placement": ("process_placement", _choice(PLACEMENTS)),
    "cache": ("executable_cache_path", str), "offline_target": ("offline_target", str),
    "autoreport": ("autoreport_dir", str), "subnet": ("host_subnet", conv.to_subnet),
    "output": ("only_output_from_instance", conv.to_int), "verbosity": ("verbosity", conv.to_int),
    "key_path": ("distribute_ssh_key_path", str), "key_type": ("distribute_ssh_key_type", _choice(SSH_KEY_TYPES)),
    "backend": ("backend", lambda text: conv.to_backend(text, BACKENDS)), "cd": ("working_dir", str),
}
# Counts of the topology line: the rule names are the Spec fields.
_COUNTS = ("replicas", "instances", "ilds", "ipus_per_replica")


class _Statement:
    """Reads the tree of one line into settings; a bad value raises :class:`_StatementError`."""

    def __init__(self, file: str, number: int, line: str) -> None:
        self.file = file
        self.number = number
        self.line = line

    def read(self, tree: Tree[Token]) -> list[_Setting]:
        """Return the settings of a statement (any rule of ``statement``)."""
        rule = str(tree.data)
        if rule in _SWITCHES:
            field, constant = _SWITCHES[rule]
            return [self._set(field, constant, self._meta_span(field, tree))]
        if rule in _VALUES:
            field, convert = _VALUES[rule]
            token = _tokens(tree)[-1]
            return [self._set(field, self._convert(convert, token, field), self._span(field, token))]
        if rule in _COUNTS:
            token = _tokens(tree)[0]
            number = self._convert(conv.to_positive_int, token, rule)
            return [self._set(rule, number, self._meta_span(rule, tree))]
        handler = cast("Callable[[Tree[Token]], list[_Setting]]", getattr(self, f"_{rule}"))
        return handler(tree)

    def _read_all(self, tree: Tree[Token]) -> list[_Setting]:
        return [setting for child in _trees(tree) for setting in self.read(child)]

    _topology = _partition_options = _ssh_key_options = _ssh_key = _read_all

    def _hosts(self, tree: Tree[Token]) -> list[_Setting]:
        """Rule ``hosts``: a host list, expanded."""
        from poprun.core.hostlist import HostlistError, expand

        token = _tokens(tree)[0]
        text, quote = self._text(token), int(token.type == "STRING")
        try:
            hosts = expand(text) if text or not quote else ()
        except HostlistError as exc:
            span = self._span("hosts", token, offset=exc.position + quote, length=exc.length)
            raise self._problem("PR103", exc.message, detail=f"in host list '{text}'", hint=exc.hint,
                                span=span) from exc
        return [self._set("hosts", hosts, self._span("hosts", token))]

    def _partition(self, tree: Tree[Token]) -> list[_Setting]:
        """Rule ``partition``: a name, a server and options."""
        names = [self._set("partition", self._text(t), self._span("partition", t)) for t in _tokens(tree)]
        return names + self._read_all(tree)

    def _server(self, tree: Tree[Token]) -> list[_Setting]:
        """Rule ``server``: ``host``, ``host:port``, ``[ipv6]:port`` or a quoted host."""
        token = _tokens(tree)[0]
        if token.type == "STRING":
            return [self._set("vipu_server_host", self._text(token), self._span("vipu_server_host", token))]
        try:
            host, port, offset = _split_server(str(token))
        except conv.InvalidValueError as problem:
            raise self._value_problem(problem, "vipu_server_host", self._span("vipu_server_host", token)) from None
        settings = [] if host is None else [self._set("vipu_server_host", host, self._span("vipu_server_host", token))]
        if port is not None:
            span = self._span("vipu_server_port", token, offset=offset)
            try:
                settings.append(self._set("vipu_server_port", conv.to_port(port), span))
            except conv.InvalidValueError as problem:
                raise self._value_problem(problem, "vipu_server_port", span) from None
        return settings

    def _mask(self, tree: Tree[Token]) -> list[_Setting]:
        """Rule ``mask``: variables whose values text output masks."""
        tokens = _tokens(tree)
        names = tuple(self._convert(conv.to_names, t, "mask")[0] for t in tokens)
        return [self._set("mask", names, self._span("mask", tokens[0]))]

    def _forward(self, tree: Tree[Token]) -> list[_Setting]:
        """Rule ``forward``: variables forwarded from the launching shell."""
        return [self._set("env", self._env(t, None), self._span("env.forward", t)) for t in _tokens(tree)]

    def _set_env(self, tree: Tree[Token]) -> list[_Setting]:
        """Rule ``set_env``: ``set NAME = VALUE``."""
        name, value = _tokens(tree)
        return [self._set("env", self._env(name, self._text(value)), self._meta_span("env.set", tree))]

    def _mpi_global(self, tree: Tree[Token]) -> list[_Setting]:
        """Rule ``mpi_global``: global mpirun arguments; ``-x`` entries become variables."""
        return self._mpi("mpi_global_args", _tokens(tree)[0])

    def _mpi_local(self, tree: Tree[Token]) -> list[_Setting]:
        """Rule ``mpi_local``: per-instance mpirun arguments for all instances."""
        return self._mpi("mpi_local_args", _tokens(tree)[0])

    def _mpi(self, field: str, token: Token) -> list[_Setting]:
        span = self._span(field, token)
        env, rest = self._convert(lambda text: split_env_args(conv.to_args(text)), token, field,
                                  text=self._text(token))
        return [*(self._set("env", e, span) for e in env), self._set(field, rest, span)]

    def _instance_forward(self, tree: Tree[Token]) -> list[_Setting]:
        """Rule ``instance_forward``: variables forwarded to one instance."""
        index, *names = _tokens(tree)
        env = tuple(self._env(name, None) for name in names)
        return self._instance(tree, index, env, ())

    def _instance_set(self, tree: Tree[Token]) -> list[_Setting]:
        """Rule ``instance_set``: a variable set for one instance."""
        index, name, value = _tokens(tree)
        return self._instance(tree, index, (self._env(name, self._text(value)),), ())

    def _instance_mpi(self, tree: Tree[Token]) -> list[_Setting]:
        """Rule ``instance_mpi``: mpirun arguments (and ``-x`` variables) for one instance."""
        index, args = _tokens(tree)
        env, rest = self._convert(lambda text: split_env_args(conv.to_args(text)), args, "instance",
                                  text=self._text(args))
        return self._instance(tree, index, env, rest)

    def _instance(self, tree: Tree[Token], index: Token, env: tuple[EnvVarSpec, ...],
                  mpi_args: tuple[str, ...]) -> list[_Setting]:
        number = self._convert(conv.to_int, index, "instance")
        spec = InstanceArgsSpec(index=number, env=env, mpi_args=mpi_args)
        return [self._set("instance_args", spec, self._meta_span(f"instance.{number}", tree))]

    def _offline(self, tree: Tree[Token]) -> list[_Setting]:
        """Rule ``offline``: offline mode on, with an optional target."""
        targets = [self._set("offline_target", self._text(t), self._span("offline_target", t)) for t in _tokens(tree)]
        return [self._set("offline_mode", value=True, span=self._meta_span("offline_mode", tree)), *targets]

    def _distribute_ssh_key(self, tree: Tree[Token]) -> list[_Setting]:
        """Rule ``distribute_ssh_key``: distribute a key, with optional key settings."""
        return [self._set("distribute_ssh_key", value=True, span=self._meta_span("distribute_ssh_key", tree)),
                *self._read_all(tree)]

    def _run(self, tree: Tree[Token]) -> list[_Setting]:
        """Rule ``run``: the program, shell-split or a JSON array of strings."""
        token = _tokens(tree)[0]
        try:
            program = _json_words(str(token)) if token.startswith("[") else None
        except conv.InvalidValueError as problem:
            raise self._value_problem(problem, "program", self._span("program", token)) from None
        if program is None:
            program = self._convert(conv.to_args, token, "program")
        return [self._set("program", program, self._span("program", token))]

    # ---- helpers ----

    def _set(self, field: str, value: object, span: SourceSpan) -> _Setting:
        return _Setting(field, Sourced(value, span))

    def _env(self, name: Token, value: str | None) -> EnvVarSpec:
        key = "env.forward" if value is None else "env.set"
        try:
            conv.to_env_assignment(str(name))
        except conv.InvalidValueError as problem:
            raise self._problem(problem.code, "invalid environment variable name", detail=problem.detail,
                                hint=problem.hint, span=self._span(key, name)) from None
        return EnvVarSpec(name=str(name), value=value)

    def _text(self, token: Token) -> str:
        """Return the text of a word, a path or a quoted string (its escapes decoded)."""
        if token.type == "BARE":
            return str(token).rstrip(" \t")
        if token.type != "STRING":
            return str(token)
        if token.startswith("'"):
            return str(token)[1:-1]
        try:
            return cast("str", json.loads(str(token), strict=False))
        except ValueError as exc:
            at = getattr(exc, "pos", 0)
            raise self._problem("PR108", "invalid escape in quoted string", detail=str(exc).split(":")[0],
                                hint='escapes are as in JSON: \\" \\\\ \\n \\t \\uXXXX',
                                span=self._span("string", token, offset=at, length=2)) from None

    def _convert(self, convert: Callable[[str], Any], token: Token, field: str, *, text: str | None = None) -> Any:
        span = self._span(_KEYS.get(field, field), token)
        try:
            return convert(self._text(token) if text is None else text)
        except conv.InvalidValueError as problem:
            raise self._value_problem(problem, field, span) from None

    def _value_problem(self, problem: conv.InvalidValueError, field: str, span: SourceSpan) -> _StatementError:
        return self._problem(problem.code, f"invalid value for {_KEYS.get(field, field)}", detail=problem.detail,
                             hint=problem.hint, span=span)

    def _problem(self, code: str, summary: str, *, detail: str, hint: str, span: SourceSpan) -> _StatementError:
        return _StatementError(error(code, summary, detail=detail, span=span, hint=hint, source_line=self.line))

    def _span(self, key: str, token: Token, *, offset: int = 0, length: int | None = None) -> SourceSpan:
        column = (token.column or 1) + offset
        width = len(token) - offset if length is None else length
        return SourceSpan(file=self.file, key_path=_KEYS.get(key, key), line=self.number, column=column,
                          end_line=self.number, end_column=column + max(width, 1))

    def _meta_span(self, key: str, tree: Tree[Token]) -> SourceSpan:
        return SourceSpan(file=self.file, key_path=_KEYS.get(key, key), line=self.number,
                          column=tree.meta.column, end_line=self.number, end_column=tree.meta.end_column)


def _tokens(tree: Tree[Token]) -> list[Token]:
    return [child for child in tree.children if isinstance(child, str)]


def _trees(tree: Tree[Token]) -> list[Tree[Token]]:
    return [child for child in tree.children if not isinstance(child, str)]


def _split_server(text: str) -> tuple[str | None, str | None, int]:
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


def _json_words(text: str) -> tuple[str, ...] | None:
    """Return the words of a JSON array of strings, or None when ``text`` is not one."""
    try:
        words = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if isinstance(words, list) and all(isinstance(w, str) for w in words):
        return tuple(words)
    if isinstance(words, list):  # a JSON array, but not of strings: never run as shell words
        k, item = next((k, w) for k, w in enumerate(words) if not isinstance(w, str))
        raise conv.InvalidValueError(f"item {k} of the program, {json.dumps(item)}, is not a string",
                                     f"quote every word: run {json.dumps([str(w) if not isinstance(w, str) else w for w in words])}")
    return None


# ---- syntax errors ---------------------------------------------------------------------

# Common mistakes, labelled by example: an error whose expected words and place (at the end
# of the line or not) match those of an example gets that example's summary and hint.
_EXAMPLES: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("unclosed '('", "close the options with ')'",
     ("partition p (update", "partition (allocation a", "ssh key (type rsa")),
    ("missing '=' after the variable name", "write set NAME = VALUE", ("set A b", "set A", "instance 0 set A")),
    ("no program after 'run'", "write the program and its arguments, e.g. run python3 train.py", ("run",)),
    ("no hosts after 'hosts'", "write a host list such as pod[1-4], or hosts from file FILE", ("hosts",)),
    ("number without what it counts", "write e.g. 8 replicas, 2 instances, 2 ilds or 2 ipus per replica", ("8",)),
)
_LABELS: dict[tuple[frozenset[str], bool], tuple[str, str]] = {}
_NAMED = {"NUMBER": "a number", "HOSTLIST": "a host list", "ENV_NAME": "a variable name", "STRING": "a quoted string",
          "BARE": "a value", "WORD": "a word", "PATH": "a path", "PROGRAM": "a program and its arguments",
          "$END": "the end of the line"}


def _syntax_error(exc: UnexpectedInput, line: str, *, span: SourceSpan) -> Diagnostic:
    """Return the PR108 diagnostic of a lark error on ``line`` (``span`` gives file and line)."""
    column, at_end = _error_column(exc, line)
    expected = _expected(exc)
    found = re.match(r"[^\s(),=]{1,40}|\S", line[column - 1:])
    word = found.group() if found and not at_end else line[column - 1:column]
    width = 1 if at_end else len(word)
    word = word if word.isprintable() else repr(word)[1:-1]  # a control character, shown escaped
    before = re.findall(r"[^\s(),=]+|[(),=]", line[:column - 1])
    where = f"after '{before[-1]}'" if before else "at the start of a statement"
    words = _describe(expected, start=not before)
    detail = f"expected {join_or(words)} {where}, found " + ("the end of the line" if at_end else f"'{word}'")
    summary, hint = _label(expected, word, at_end=at_end, start=not before, line=line)
    span = evolve(span, column=column, end_line=span.line, end_column=column + max(width, 1))
    return error("PR108", summary, detail=detail, span=span, hint=hint, source_line=line)


def _error_column(exc: UnexpectedInput, line: str) -> tuple[int, bool]:
    """Return the 1-based column of the error and whether it is at the end of the statement."""
    token = getattr(exc, "token", None)
    if token is not None and token.type == "$END":
        return (token.end_column or len(line.rstrip()) + 1), True
    column = exc.column if isinstance(exc.column, int) and exc.column > 0 else len(line.rstrip()) + 1
    return column, column > len(line.rstrip())


def _expected(exc: UnexpectedInput) -> frozenset[str]:
    names = getattr(exc, "expected", None) or getattr(exc, "allowed", None) or set()
    return frozenset("$END" if n == "_NL" else n for n in names if n not in ("WS", "COMMENT"))


def _keywords(names: frozenset[str]) -> dict[str, str]:
    """Return {terminal name: keyword} for the keyword terminals among ``names``."""
    from lark.lexer import PatternStr

    parser = dsl_parser()
    words = {}
    for name in names:
        if name not in _NAMED and name != "FROM_FILE":
            pattern = parser.get_terminal(name).pattern
            if isinstance(pattern, PatternStr):
                words[name] = pattern.value
    return words


def _describe(expected: frozenset[str], *, start: bool) -> list[str]:
    order = {t.name: i for i, t in enumerate(dsl_parser().terminals)}
    keywords = _keywords(expected)
    named = dict(_NAMED, FROM_FILE="'from file'")
    if start:
        named["NUMBER"] = "a count (as in '8 replicas')"
        order |= {name: -len(_START) + _START.index(word) for name, word in keywords.items() if word in _START}
    ranked = sorted(expected, key=lambda n: (n == "$END", n != "NUMBER", order.get(n, 0), n))
    return list(dict.fromkeys(f"'{keywords[n]}'" if n in keywords else named.get(n, n) for n in ranked))


def _label(expected: frozenset[str], word: str, *, at_end: bool, start: bool, line: str) -> tuple[str, str]:
    """Return the summary and hint: a labelled mistake, an unknown word, or a plain syntax error."""
    if start and word in _UNITS:
        count = next(iter(re.findall(r"\b[0-9]+\b", line)), "8")
        return f"number missing before '{word}'", f"put the number first: {count} {word}"
    guess = None if at_end else did_you_mean(word, [*_keywords(expected).values(), *(_UNITS if start else ())])
    hint = f"did you mean '{guess}'?" if guess else _DOCS
    if start:
        if guess in _UNITS:
            hint += f" (the number goes first, as in '8 {guess}')"
        return f"unknown statement '{word}'", hint
    summary, label_hint = _examples().get((expected, at_end), ("DSL syntax error", _DOCS))
    return summary, hint if guess else label_hint


def _examples() -> dict[tuple[frozenset[str], bool], tuple[str, str]]:
    """Return the labels of :data:`_EXAMPLES`, keyed by what their errors expected (built once)."""
    if not _LABELS:
        from lark.exceptions import UnexpectedInput

        for summary, hint, examples in _EXAMPLES:
            for example in examples:
                try:
                    dsl_parser().parse(example, start="statement")
                except UnexpectedInput as exc:
                    _LABELS.setdefault((_expected(exc), _error_column(exc, example)[1]), (summary, hint))
    return _LABELS


# ---- writing ---------------------------------------------------------------------------


def to_dsl(spec: Spec) -> str:
    """Return ``spec`` written in the DSL, one statement per line, in a fixed order."""
    lines = [*_hosts_lines(spec), *_topology_lines(spec), *_partition_lines(spec), *_env_lines(spec.env), *_mask_lines(spec),
             *_mpi_lines(spec), *_instance_lines(spec), *_simple_lines(spec), *_run_lines(spec)]
    return "".join(f"{line}\n" for line in lines)


def _hosts_lines(spec: Spec) -> Iterator[str]:
    if spec.hosts is not None:
        yield f"hosts {_host_text(spec.hosts.value)}"
    if spec.host_file is not None:
        yield f"hosts from file {_path(spec.host_file.value)}"


def _host_text(hosts: tuple[str, ...]) -> str:
    from poprun.core.hostlist import HostlistError, compress, expand

    if not hosts:
        return "''"
    try:
        text = compress(hosts)
        if expand(text) == hosts:
            return text
    except HostlistError:
        pass
    return ", ".join(hosts)


def _topology_lines(spec: Spec) -> Iterator[str]:
    units = (("replicas", "", "replica"), ("ipus_per_replica", "with", "ipu"), ("instances", "over", "instance"),
             ("ilds", "in", "ild"))
    parts: list[str] = []
    for field, preposition, unit in units:
        count = getattr(spec, field)
        if count is not None:
            words = f"{count.value} {unit}{'' if count.value == 1 else 's'}"
            words += " per replica" if unit == "ipu" else ""
            parts.append(f"{preposition} {words}" if parts and preposition else words)
    if parts:
        yield " ".join(parts)


def _partition_lines(spec: Spec) -> Iterator[str]:
    words = [] if spec.partition is None else [_word(spec.partition.value, keywords=("at",))]
    host = None if spec.vipu_server_host is None else spec.vipu_server_host.value
    port = None if spec.vipu_server_port is None else spec.vipu_server_port.value
    server = _server_text(host, port)
    if server is not None:
        words.append(f"at {server}")
    elif host is not None:
        words.append(f"at {_string(host)}")
    options = list(_partition_options(spec, port=port if server is None else None))
    if options:
        words.append(f"({', '.join(options)})")
    if words:
        yield "partition " + " ".join(words)


def _server_text(host: str | None, port: int | None) -> str | None:
    """Return ``host:port`` as one word when it reads back unchanged, else None."""
    if host is None or not host:
        return None
    text = (f"[{host}]" if ":" in host else host) + ("" if port is None else f":{port}")
    try:
        back, back_port, _ = _split_server(text)
    except conv.InvalidValueError:
        return None
    same = back == host and (back_port is None if port is None else back_port == str(port))
    return text if same and _WORD.fullmatch(text) else None


def _partition_options(spec: Spec, *, port: int | None) -> Iterator[str]:
    for field, true, false in (("update_partition", "update", "no update"), ("reset_partition", "reset", "no reset"),
                               ("remove_partition", "remove", "keep")):
        flag = getattr(spec, field)
        if flag is not None:
            yield true if flag.value else false
    for field, words in (("allocation", "allocation"), ("vipu_server_timeout", "timeout"),
                         ("partition_attempts", "attempts"), ("sync_type", "sync"),
                         ("ipu_link_routing_type", "ipu-link routing"), ("gw_link_routing_type", "gw-link routing")):
        value = getattr(spec, field)
        if value is not None:
            yield f"{words} {_word(str(value.value))}"
    if port is not None:
        yield f"port {port}"


def _env_lines(env: tuple[Sourced[EnvVarSpec], ...]) -> Iterator[str]:
    forwards: list[str] = []
    for item in env:
        if item.value.value is None:
            forwards.append(item.value.name)
            continue
        if forwards:
            yield f"forward {', '.join(forwards)}"
            forwards = []
        value = item.value.value
        yield f"set {item.value.name} = {value if _BARE.fullmatch(value) else _string(value)}"
    if forwards:
        yield f"forward {', '.join(forwards)}"


def _mask_lines(spec: Spec) -> Iterator[str]:
    if spec.mask is not None:
        yield f"mask {', '.join(spec.mask.value)}"


def _mpi_lines(spec: Spec) -> Iterator[str]:
    for field, scope in (("mpi_global_args", "global"), ("mpi_local_args", "local")):
        args = getattr(spec, field)
        if args is not None:
            yield f"mpi {scope} {_string(shlex.join(args.value))}"


def _instance_lines(spec: Spec) -> Iterator[str]:
    for item in spec.instance_args:
        args = item.value
        head = f"instance {args.index}"
        if args.env and not args.mpi_args and all(e.value is None for e in args.env):
            yield f"{head} forward {', '.join(e.name for e in args.env)}"
        elif len(args.env) == 1 and not args.mpi_args:
            yield f"{head} set {args.env[0].name} = {_string(cast('str', args.env[0].value))}"
        else:
            words = [w for e in args.env for w in ("-x", e.name if e.value is None else f"{e.name}={e.value}")]
            yield f"{head} mpi {_string(shlex.join([*args.mpi_args, *words]))}"  # no word after a -x pair


def _simple_lines(spec: Spec) -> Iterator[str]:
    if spec.process_placement is not None:
        yield f"placement {_word(spec.process_placement.value)}"
    yield from _flag(spec.numa_aware, "numa aware", "numa unaware")
    if spec.executable_cache_path is not None:
        path = spec.executable_cache_path.value
        yield f"cache {_path(path, keywords=('off',))}" if path else "cache off"
    yield from _offline_lines(spec)
    for field, words in (("autoreport_dir", "autoreport to"), ("working_dir", "cd")):
        value = getattr(spec, field)
        if value is not None:
            yield f"{words} {_path(value.value)}"
    if spec.host_subnet is not None:
        yield f"subnet {_word(spec.host_subnet.value)}"
    yield from _flag(spec.print_topology, "print topology", "no print topology")
    if spec.only_output_from_instance is not None:
        yield f"output from instance {spec.only_output_from_instance.value}"
    yield from _ssh_lines(spec)
    yield from _flag(spec.allow_run_as_root, "allow run as root", "no allow run as root")
    if spec.verbosity is not None:
        yield f"verbosity {spec.verbosity.value}"
    if spec.backend is not None:
        yield f"backend {_word(spec.backend.value)}"


def _flag(value: Sourced[bool] | None, true: str, false: str) -> Iterator[str]:
    if value is not None:
        yield true if value.value else false


def _offline_lines(spec: Spec) -> Iterator[str]:
    mode = None if spec.offline_mode is None else spec.offline_mode.value
    target = None if spec.offline_target is None else _word(spec.offline_target.value)
    if mode:
        yield "offline" if target is None else f"offline for {target}"
        return
    if mode is False:
        yield "no offline"
    if target is not None:
        yield f"offline target {target}"


def _ssh_lines(spec: Spec) -> Iterator[str]:
    settings = []
    if spec.distribute_ssh_key_path is not None:
        settings.append(f"path {_word(spec.distribute_ssh_key_path.value)}")
    if spec.distribute_ssh_key_type is not None:
        settings.append(f"type {_word(spec.distribute_ssh_key_type.value)}")
    options = f"({', '.join(settings)})" if settings else ""
    distribute = None if spec.distribute_ssh_key is None else spec.distribute_ssh_key.value
    if distribute:
        yield f"distribute ssh key {options}".rstrip()
        return
    if distribute is False:
        yield "no distribute ssh key"
    if options:
        yield f"ssh key {options}"


def _run_lines(spec: Spec) -> Iterator[str]:
    if spec.program is not None:
        words = spec.program.value
        if words and all(w.isprintable() for w in words):
            yield f"run {shlex.join(words)}"
        else:
            yield f"run {json.dumps(list(words), ensure_ascii=False)}"


# Keywords that may stand where a value may (`partition at ...`, `cache off`) are passed as
# ``keywords``; a test writes every keyword into every value to keep these lists complete.
def _word(text: str, *, keywords: tuple[str, ...] = ()) -> str:
    """Return ``text`` as a bare word when it reads back as one, else quoted."""
    return text if _WORD.fullmatch(text) and text not in keywords else _string(text)


def _path(text: str, *, keywords: tuple[str, ...] = ()) -> str:
    """Return ``text`` as a bare path when it reads back as one, else quoted."""
    return text if _PATH.fullmatch(text) and text not in keywords else _string(text)


def _string(text: str) -> str:
    """Return a quoted string: literal in single quotes when possible, else JSON-escaped."""
    if "'" not in text and text.isprintable():
        return f"'{text}'"
    return json.dumps(text, ensure_ascii=False)
