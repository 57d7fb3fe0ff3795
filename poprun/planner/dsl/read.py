"""
Reading the DSL: the text of a ``.pop`` spec to a :class:`Spec`.

Layer: ``poprun.planner``; imports ``poprun.core``, the option table, the value converters,
the grammar (:mod:`poprun.planner.dsl.grammar`) and lark (on first use only, to keep
``import poprun`` fast). The language is specified by ``poprun/grammars/spec.lark`` with the
option table's one-field statements, and documented in ``docs/spec-dsl.md``;
:func:`poprun.planner.dsl.write.to_dsl` writes a spec back so that
``parse_dsl(to_dsl(spec)) == spec`` (origins do not take part in equality).

A file is parsed line by line (one statement per line), so every bad line gets its own
diagnostic and all of them are raised together. Syntax errors become ``PR108`` with the
expected words spelt out; common mistakes are labelled by example, as lark's
``match_examples`` does. A statement of the option table is read by its row (its field and
converter); the structured ones by a method named after their rule.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from poprun.core.diagnostic import Diagnostic, Diagnostics, error
from poprun.core.hint import did_you_mean, join_or
from poprun.core.record import evolve, positional_record
from poprun.core.span import SourceSpan
from poprun.planner import value as conv
from poprun.planner.dsl.grammar import START_WORDS, STATEMENTS, dsl_parser, split_server
from poprun.planner.flags import split_env_args
from poprun.planner.option import BY_FIELD
from poprun.planner.spec import EnvVarSpec, InstanceArgsSpec, Sourced, Spec

if TYPE_CHECKING:  # lark is imported on first use, not with poprun
    from lark import Token, Tree
    from lark.exceptions import UnexpectedInput

__all__ = ["load_dsl", "parse_dsl"]

_BLANK = re.compile(r"[ \t]*(?:#.*)?")
_DOCS = "see docs/spec-dsl.md for the statements of the DSL"
_UNITS = ("replicas", "replica", "instances", "ilds", "ild", "ipus", "ipu")
# The order in which messages list the words that may follow another word (partition options
# as in the docs, then the words after a statement's `no`); other words follow the grammar's order.
_FOLLOWING = ("update", "no", "reset", "keep", "remove", "allocation", "timeout", "attempts", "sync", "ipu-link",
              "gw-link", "port", "offline", "print", "distribute", "allow")
# Spec fields whose repeats add up (like repeated --mpi-*-args) instead of conflicting.
_MERGED = ("mpi_global_args", "mpi_local_args", "mask", "spare_hosts")
_KEYS = {field: f"{option.section}.{option.key}" for field, option in BY_FIELD.items()}
_KEYS |= {"program": "program.argv", "working_dir": "program.cwd"}


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
    from poprun.core.textfile import read_text_file

    return parse_dsl(read_text_file(path, key="SPEC"), file=path)


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
            key = "topology" if first.isdigit() else first if first in START_WORDS else "statement"
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
        elif field in _MERGED:  # a spare named again takes the later span, where PR226 puts its caret
            again = field == "spare_hosts" and any(h in old.value for h in new.value)
            self.values[field] = Sourced(old.value + new.value, new.origin if again else old.origin)
        elif old.value != new.value:
            where = f" (line {old.origin.line})" if old.origin.line is not None else ""
            self.diags.add(error("PR111", f"{new.origin.key_path} given twice", span=new.origin,
                                 detail=f"first {old.value!r}{where}, then {new.value!r}", hint="give it once",
                                 related=(old.origin,), source_line=line))

    def finish(self) -> Spec:
        """Return the spec, or raise every diagnostic found."""
        self.diags.raise_if_errors()
        return Spec(**self.values, env=tuple(self.env), instance_args=tuple(self.instance_args))


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
        if rule in STATEMENTS:
            return [self._table_statement(tree, rule)]
        if rule in _COUNTS:
            token = _tokens(tree)[0]
            number = self._convert(conv.to_positive_int, token, rule)
            return [self._set(rule, number, self._meta_span(rule, tree))]
        handler = cast("Callable[[Tree[Token]], list[_Setting]]", getattr(self, f"_{rule}"))
        return handler(tree)

    def _table_statement(self, tree: Tree[Token], rule: str) -> _Setting:
        """Read a statement of the option table: its row's constant, or its value through the row's converter."""
        statement = STATEMENTS[rule]
        field = statement.field
        if statement.role != "value":
            return self._set(field, statement.constant, self._meta_span(field, tree))
        token = _tokens(tree)[-1]
        return self._set(field, self._convert(statement.option.convert, token, field), self._span(field, token))

    def _read_all(self, tree: Tree[Token]) -> list[_Setting]:
        return [setting for child in _trees(tree) for setting in self.read(child)]

    _topology = _partition_options = _ssh_key_options = _ssh_key = _read_all

    def _hosts(self, tree: Tree[Token], field: str = "hosts") -> list[_Setting]:
        """Rule ``hosts``: a host list, expanded (``""``: an empty list)."""
        from poprun.core.hostlist import HostlistError, expand

        token = _tokens(tree)[0]
        text, quote = self._text(token), int(token.type == "STRING")
        try:
            hosts = expand(text) if text or not quote else ()
        except HostlistError as exc:
            span = self._span(field, token, offset=exc.position + quote, length=exc.length)
            raise self._problem("PR103", exc.message, detail=f"in host list '{text}'", hint=exc.hint,
                                span=span) from exc
        return [self._set(field, hosts, self._span(field, token))]

    def _spare_hosts(self, tree: Tree[Token]) -> list[_Setting]:
        """Rule ``spare_hosts``: spare hosts, a host list as for ``hosts`` (repeats add; ``""``: none)."""
        return self._hosts(tree, "spare_hosts")

    def _host_file(self, tree: Tree[Token]) -> list[_Setting]:
        """Rule ``host_file``: ``hosts from file PATH``."""
        token = _tokens(tree)[-1]
        return [self._set("host_file", self._text(token), self._span("host_file", token))]

    def _cd(self, tree: Tree[Token]) -> list[_Setting]:
        """Rule ``cd``: the working directory of every instance."""
        token = _tokens(tree)[-1]
        return [self._set("working_dir", self._text(token), self._span("working_dir", token))]

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
            host, port, offset = split_server(str(token))
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

    def _never_retry(self, tree: Tree[Token]) -> list[_Setting]:
        """Rule ``never_retry``: exit statuses never restarted (``none``: no token)."""
        statuses = {s for t in _tokens(tree) for s in self._convert(conv.to_statuses, t, "never_retry")}
        return [self._set("never_retry", tuple(sorted(statuses)), self._meta_span("never_retry", tree))]

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
            text = cast("str", json.loads(str(token), strict=False))
        except ValueError as exc:
            at = getattr(exc, "pos", 0)
            raise self._problem("PR108", "invalid escape in quoted string", detail=str(exc).split(":")[0],
                                hint='escapes are as in JSON: \\" \\\\ \\n \\t \\uXXXX',
                                span=self._span("string", token, offset=at, length=2)) from None
        if not text.isascii() and any("\ud800" <= char <= "\udfff" for char in text):  # \udce9 alone: no character
            at = next(m for m in range(len(token)) if token[m:m + 3].lower() == "\\ud" and token[m + 3:m + 4] in "89abcdefABCDEF")
            raise self._problem("PR108", "invalid escape in quoted string",
                                detail=f"{token[at:at + 6]} alone is half of a surrogate pair, not a character",
                                hint="write the character itself, or both halves of its pair (\\ud83d\\ude00)",
                                span=self._span("string", token, offset=at, length=6))
        return text

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
        order |= {name: -len(START_WORDS) + START_WORDS.index(word) for name, word in keywords.items()
                  if word in START_WORDS}
    else:  # after all the other terminals' (a number or a path before keywords), in the order of _FOLLOWING
        order |= {name: len(order) + _FOLLOWING.index(word) for name, word in keywords.items() if word in _FOLLOWING}
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
