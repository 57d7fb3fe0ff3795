"""
The PopRun command line as a front end: ``poprun [options] PROGRAM [ARGS...]`` to a Spec.

Layer: ``poprun.planner``; imports ``poprun.core``, the spec model and the option table (whose
converters read each value).

It accepts what real users wrote: ``--opt=v`` and ``--opt v``; a value-taking option takes
the next token even when it starts with ``-``; unambiguous long prefixes; ``-v``, ``-vv``,
``--vv``; repeated ``--mpi-*-args`` merge; ``-x`` variables inside ``--mpi-*-args`` become
the spec's environment. Everything after PROGRAM belongs to the program, untouched.
Options not given fall back on ``POPRUN_<FLAG>`` environment variables.

The other commands' options (``poprun logs RUN --tail N``, ``submit``'s leading ones,
``vipu-server``'s) are rows of their command (:class:`CommandOption`, in the command table of
``poprun.cli.commands``), read by :func:`parse_arguments` with the same diagnostics and carets.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence

from poprun.core.diagnostic import Diagnostic, DiagnosticError, Diagnostics, error, warning
from poprun.core.hint import did_you_mean, join_or
from poprun.core.record import positional_record, record
from poprun.core.span import COMMAND_LINE, SourceSpan
from poprun.planner import value as conv
from poprun.planner.option import BY_FLAG, LONG_FLAGS, PLAN_ONLY, Option
from poprun.planner.spec import EnvVarSpec, InstanceArgsSpec, Sourced, Spec

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from typing import Any

_SHORT = 2  # "-H"
_VERY = 2  # -vv
_MIN_PREFIX = 3  # "--n" is too short to stand for an option


@record
class CommandLine:
    """The parsed command line: the spec, plus the actions that are not part of a launch."""

    spec: Spec
    help: bool = False
    version: bool = False
    version_format: str = "text"
    export_config: Sourced[str] | None = None
    import_config: Sourced[str] | None = None
    events: Sourced[str] | None = None  # --events FILE|-|fd:N
    overwrite_config: Sourced[bool] | None = None
    explain: bool = False
    format: str = "text"
    output: Sourced[str] | None = None
    diff: Sourced[str] | None = None  # plan --diff OLD.json
    expand: bool = False  # graphs: no grouping
    detach: bool = False  # a launch: leave it running without a terminal (not part of the plan)
    plan_options: tuple[Sourced[str], ...] = ()
    text: str = ""  # the command line as one string, for carets under flag spans
    warnings: tuple[Diagnostic, ...] = ()


class _Text:
    """The command line as one string, with each token's columns, for carets."""

    def __init__(self, argv: Sequence[str], prog: str) -> None:
        words = [shlex.quote(a) for a in argv]
        self.line = " ".join([prog, *words])
        self.starts: list[int] = []
        column = len(prog) + 2
        for word in words:
            self.starts.append(column)
            column += len(word) + 1
        self.widths = [len(w) for w in words]

    def span(self, key: str, index: int, *, offset: int = 0, length: int | None = None) -> SourceSpan:
        """Return the span of token ``index`` (or a part of it)."""
        if index >= len(self.starts):
            return SourceSpan(file=COMMAND_LINE, key_path=key, line=1, column=len(self.line) + 1,
                              end_line=1, end_column=len(self.line) + 2)
        start = self.starts[index] + offset
        width = self.widths[index] - offset if length is None else length
        return SourceSpan(file=COMMAND_LINE, key_path=key, line=1, column=start, end_line=1,
                          end_column=start + max(width, 1))


class _Parser:
    """One pass over argv, collecting values and diagnostics."""

    def __init__(self, argv: Sequence[str], prog: str) -> None:
        self.argv = list(argv)
        self.text = _Text(argv, prog)
        self.diags = Diagnostics()
        self.values: dict[str, Any] = {}
        self.env: list[Sourced[EnvVarSpec]] = []
        self.instance_args: list[Sourced[InstanceArgsSpec]] = []
        self.actions: dict[str, Sourced[str]] = {}
        self.flags: set[str] = set()
        self.plan_options: list[Sourced[str]] = []

    def fail(self, code: str, summary: str, *, detail: str, span: SourceSpan, hint: str) -> None:
        self.diags.add(error(code, summary, detail=detail, span=span, hint=hint, source_line=self.text.line))

    def warn(self, code: str, summary: str, *, detail: str, span: SourceSpan, hint: str) -> None:
        self.diags.add(warning(code, summary, detail=detail, span=span, hint=hint, source_line=self.text.line))

    def run(self) -> None:
        i = 0
        while i < len(self.argv):
            word = self.argv[i]
            if word == "--":
                self._program(i + 1)
                return
            if not word.startswith("-") or word == "-":
                self._program(i)
                return
            i = self._option(i, word) + 1

    def _program(self, start: int) -> None:
        words = tuple(self.argv[start:])
        if words:
            span = self.text.span("PROGRAM", start)
            self.values["program"] = Sourced(words, span)

    def _option(self, i: int, token: str) -> int:
        """Read the option at ``argv[i]``; return the index of its last token."""
        name, eq, attached = token.partition("=") if token.startswith("--") else self._short(token)
        option = self._resolve(name, i, token)
        if option is None:
            return i
        span = self.text.span(option.name, i)
        if option.name in PLAN_ONLY:
            self.plan_options.append(Sourced(option.name, span))
        if not option.takes_value:
            if eq:
                self.fail("PR112", f"option '{option.name}' takes no value", detail=f"found '{token}'",
                          span=span, hint=f"write {option.name} alone")
            self._count(option, name, span)
            return i
        if eq or attached:
            return self._take(option, attached, i, span, offset=len(name) + len(eq))
        if i + 1 >= len(self.argv):
            self.fail("PR104", f"option '{option.name}' needs a value", detail=f"'{token}' is the last word",
                      span=span, hint=f"write {option.name}=VALUE")
            return i
        return self._take(option, self.argv[i + 1], i + 1, self.text.span(option.name, i + 1), offset=0)

    def _short(self, word: str) -> tuple[str, str, str]:
        if word.startswith("-v") and set(word[1:]) == {"v"}:
            return word, "", ""
        if len(word) > _SHORT and word[:_SHORT] in BY_FLAG:  # -Hpod1, -H=pod1
            rest = word[_SHORT:]
            return word[:_SHORT], "=" if rest.startswith("=") else "", rest.removeprefix("=")
        return word, "", ""

    def _resolve(self, name: str, i: int, token: str) -> Option | None:
        if name in BY_FLAG:
            return BY_FLAG[name]
        if name.startswith("-v") and set(name[1:]) == {"v"}:
            return BY_FLAG["-v"]
        span = self.text.span(name, i, length=len(name))
        matches = [f for f in LONG_FLAGS if name.startswith("--") and f.startswith(name)] if len(name) > _MIN_PREFIX else []
        options = {BY_FLAG[f].name for f in matches}
        if len(options) == 1:
            return BY_FLAG[matches[0]]
        if options:
            self._ambiguous(name, token, sorted(options), span)
            return None
        guess = did_you_mean(name, LONG_FLAGS)
        hint = f"did you mean '{guess}'?" if guess else "see 'poprun --help' for the options"
        if not name.startswith("--") and guess is None:
            hint = "options of the program go after it; poprun's own options are listed by 'poprun --help'"
        self.fail("PR101", f"unknown option '{name}'", detail=f"poprun has no option '{name}'", span=span, hint=hint)
        return None

    def _ambiguous(self, name: str, token: str, options: list[str], span: SourceSpan) -> None:
        _, _, rest = token.partition("=")
        joined = f"{name}-{rest}".split(" ")[0] if rest else ""
        guess = did_you_mean(joined, options) if joined else None
        hint = f"did you mean '{guess}'?" if guess else f"write one of {join_or(options)} in full"
        self.fail("PR102", f"ambiguous option '{name}'",
                  detail=f"'{name}' could be {join_or(options)}", span=span, hint=hint)

    def _count(self, option: Option, name: str, span: SourceSpan) -> None:
        if option.field == "verbosity":
            extra = _VERY if name in ("-vv", "--vv") else max(name.count("v"), 1) if name.startswith("-v") else 1
            old = self.values.get("verbosity")
            self.values["verbosity"] = Sourced((old.value if old else 0) + extra, span)
        else:
            self.flags.add(option.name)

    def _take(self, option: Option, raw: str, index: int, span: SourceSpan, *, offset: int) -> int:
        try:
            self._store(option, raw, index, span, offset)
        except conv.InvalidValueError as problem:
            hint = problem.hint
            if raw.startswith("-") and option.kind not in ("args", "instance_args") and not raw[1:].isdigit():
                hint = f"'{raw}' looks like an option: did {option.name} lose its value?"
            summary = f"number too large for {option.name}" if problem.code == "PR216" else f"invalid value for {option.name}"
            self.fail(problem.code, summary, detail=problem.detail, span=span, hint=hint)
        return index

    def _store(self, option: Option, raw: str, index: int, span: SourceSpan, offset: int) -> None:
        if option.kind == "action":
            self._action(option, raw, span)
        elif option.kind == "args":
            self._args(option, raw, span)
        elif option.kind == "instance_args":
            self._instance_args(raw, span)
        elif option.kind == "hosts":
            self._hosts(option, raw, index, span, offset)
        elif option.kind == "names":
            assert option.field is not None
            old = self.values.get(option.field)
            merged = tuple(dict.fromkeys((old.value if old else ()) + conv.to_names(raw)))
            self.values[option.field] = Sourced(merged, old.origin if old else span)
        else:
            self._scalar(option, option.convert(raw), span)

    def _scalar(self, option: Option, value: object, span: SourceSpan) -> None:
        assert option.field is not None
        old = self.values.get(option.field)
        if option.name == "--vipu-cluster":
            self.warn("PR210", "deprecated option '--vipu-cluster'", detail="V-IPU clusters are now allocations",
                      span=span, hint="use --vipu-allocation instead")
        if old is not None and old.value != value:
            self.fail("PR111", f"option '{option.name}' given twice",
                      detail=f"first {old.value!r}, then {value!r}", span=span,
                      hint="give it once; if a variable holds the value, check what it expands to")
        self.values[option.field] = Sourced(value, span)

    def _action(self, option: Option, raw: str, span: SourceSpan) -> None:
        value = raw
        if option.name == "--overwrite-config":
            value = "yes" if conv.to_bool(raw) else "no"
        elif option.choices:
            value = conv.to_choice(raw, option.choices)
        self.actions[option.name] = Sourced(value, span)

    def _hosts(self, option: Option, raw: str, index: int, span: SourceSpan, offset: int) -> None:
        from poprun.core.hostlist import HostlistError, expand

        following = self.argv[index + 1] if index + 1 < len(self.argv) else None
        if raw.rstrip().endswith(",") and following is not None and not following.startswith("-"):
            stray = self.text.span(option.name, index + 1)
            self.fail("PR106", "host list split by a space",
                      detail=f"'{raw}' ends with a comma and '{following}' follows as a separate word, "
                      f"which would be taken as the program",
                      span=stray, hint=f"remove the space: {option.name} {raw.rstrip()}{following.rstrip(',')}")
            return
        spares = option.field == "spare_hosts"
        try:
            hosts = () if spares and raw == "" else expand(raw)  # --spare-host '': none (over POPRUN_SPARE_HOST)
        except HostlistError as exc:
            where = self.text.span(option.name, index, offset=offset + exc.position, length=exc.length)
            self.fail("PR103", exc.message, detail=f"in host list '{raw}'", span=where, hint=exc.hint)
            return
        old = self.values.get("spare_hosts") if spares else None
        if old is None:
            self._scalar(option, hosts, span)
            return
        # repeats add; a spare given again takes the span of the repeat, where PR226 puts its caret
        again = any(h in old.value for h in hosts)
        self.values["spare_hosts"] = Sourced(old.value + hosts, span if again else old.origin)

    def _args(self, option: Option, raw: str, span: SourceSpan) -> None:
        assert option.field is not None
        words = conv.to_args(raw)
        env, rest = split_env_args(words)
        self.env.extend(Sourced(e, span) for e in env)
        old = self.values.get(option.field)
        merged = (old.value if old else ()) + rest
        if merged:  # only -x variables: nothing is left for mpirun
            self.values[option.field] = Sourced(merged, old.origin if old else span)

    def _instance_args(self, raw: str, span: SourceSpan) -> None:
        index, colon, args = raw.partition(":")
        if not colon or not index.strip().isdigit():
            raise conv.InvalidValueError(f"'{raw}' is not INDEX:ARGS", "write e.g. 0:-x VAR=VALUE", code="PR204")
        env, rest = split_env_args(conv.to_args(args))
        spec = InstanceArgsSpec(index=int(index), env=env, mpi_args=rest)
        self.instance_args.append(Sourced(spec, span))


def split_env_args(words: tuple[str, ...]) -> tuple[tuple[EnvVarSpec, ...], tuple[str, ...]]:
    """Split mpirun arguments into ``-x`` variables and the rest."""
    env: list[EnvVarSpec] = []
    rest: list[str] = []
    i = 0
    while i < len(words):
        word = words[i]
        if word == "-x" and i + 1 >= len(words):
            raise conv.InvalidValueError("'-x' is the last word: it names no variable",
                                         "write -x NAME or -x NAME=VALUE", code="PR104")
        if word == "-x":
            name, value = conv.to_env_assignment(words[i + 1])
            env.append(EnvVarSpec(name=name, value=value))
            i += 2
            stray = words[i] if i < len(words) else None
            if stray is not None and not stray.startswith("-"):
                raise conv.InvalidValueError(
                    f"'{stray}' follows '-x {words[i - 1]}', but -x takes one variable: mpirun would take "
                    f"'{stray}' as the program", f"write -x {words[i - 1]} -x {stray} to pass both variables")
            continue
        rest.append(word)
        i += 1
    return tuple(env), tuple(rest)


def _env_fallbacks(parser: _Parser, environ: Mapping[str, str]) -> None:
    """Fill options not given on the command line from ``POPRUN_<FLAG>`` variables."""
    from poprun.planner.option import OPTIONS

    for option in OPTIONS:
        if not option.field or option.kind in ("count", "args") or option.field in parser.values:
            continue
        name = "POPRUN_" + option.name.lstrip("-").upper().replace("-", "_")
        if name in environ:
            span = SourceSpan.env(name)
            try:
                value: object = (_fallback_hosts(option, environ[name]) if option.kind == "hosts"
                                 else option.convert(environ[name]))
            except conv.InvalidValueError as problem:
                parser.diags.add(error(problem.code, f"invalid value in {name}", detail=problem.detail,
                                       span=span, hint=problem.hint))
                continue
            parser.values[option.field] = Sourced(value, span)


def _fallback_hosts(option: Option, text: str) -> tuple[str, ...]:
    """Return the hosts of a ``POPRUN_<FLAG>`` fallback (``POPRUN_SPARE_HOST=''``: no spares, as ``--spare-host ''``)."""
    return () if option.field == "spare_hosts" and text == "" else expand_hosts(text)


def expand_hosts(text: str) -> tuple[str, ...]:
    """Expand a host list, turning its error into a :class:`InvalidValueError`."""
    from poprun.core.hostlist import HostlistError, expand

    try:
        return expand(text)
    except HostlistError as exc:
        raise conv.InvalidValueError(f"{exc.message} in '{text}'", exc.hint, code="PR103") from None


def parse_flags(argv: Sequence[str], *, environ: Mapping[str, str] | None = None, prog: str = "poprun") -> CommandLine:
    """
    Return the command line ``poprun ARGV`` as a :class:`CommandLine`.

    Diagnostics:
        PR101-PR107, PR111, PR112 for malformed options; PR105/PR200/PR212/PR213 for values;
        PR204 for ``--instance-mpi-local-args``; PR210 (warning) for ``--vipu-cluster``.
    """
    parser = _Parser(argv, prog)
    parser.run()
    if environ:
        _env_fallbacks(parser, environ)
    if parser.diags.has_errors:
        raise DiagnosticError(parser.diags)
    spec = Spec(**parser.values, env=tuple(parser.env), instance_args=tuple(parser.instance_args))
    actions = parser.actions
    overwrite = actions.get("--overwrite-config")
    return CommandLine(
        spec=spec,
        help="--help" in parser.flags,
        version="--version" in parser.flags,
        version_format=actions["--version-format"].value if "--version-format" in actions else "text",
        export_config=actions.get("--export-config"),
        import_config=actions.get("--import-config"),
        events=actions.get("--events"),
        overwrite_config=Sourced(overwrite.value == "yes", overwrite.origin) if overwrite else None,
        explain="--explain" in parser.flags,
        format=actions["--format"].value if "--format" in actions else "text",
        output=actions.get("--output"),
        diff=actions.get("--diff"),
        expand="--expand" in parser.flags,
        detach="--detach" in parser.flags,
        plan_options=tuple(parser.plan_options),
        text=parser.text.line,
        warnings=parser.diags.warnings,
    )


@positional_record
class CommandOption:
    """
    One option of a command other than a launch (a row of the command table): ``poprun logs --tail N``.

    ``name`` is what :class:`Arguments` keys its value by; ``flags`` its spellings, the long one
    first (it names the option in diagnostics); ``value`` names its value in the help (``N``), and
    is empty for an option without one.
    """

    name: str
    flags: tuple[str, ...]
    value: str
    help: str


@record
class Arguments:
    """
    A command's words and options, as :func:`parse_arguments` read them.

    ``options``: (name, value) in the order given, ``""`` for an option without a value; ``rest``:
    what follows the leading options (``leading=True``), untouched; ``text``: the command line as
    one string, for carets.
    """

    words: tuple[str, ...] = ()
    options: tuple[tuple[str, str], ...] = ()
    help: bool = False
    rest: tuple[str, ...] = ()
    text: str = ""

    def has(self, name: str) -> bool:
        """Return whether option ``name`` was given."""
        return any(n == name for n, _ in self.options)

    def value(self, name: str) -> str | None:
        """Return the value option ``name`` was given last (None when it was not given)."""
        return next((v for n, v in reversed(self.options) if n == name), None)


_HELP = CommandOption("help", ("--help", "-h"), "", "show this help")


def parse_arguments(argv: Sequence[str], rows: Sequence[CommandOption], *, prog: str, usage: str,
                    words: int = 0, leading: bool = False) -> Arguments:
    """
    Return ``prog ARGV`` (``poprun logs ...``) read against the command's option ``rows``.

    Options and up to ``words`` other words may come in any order; ``--opt=v`` and ``--opt v``
    and unambiguous long prefixes as in a launch (a value may start with ``-``). With ``leading``, only the options at the
    front are read (``poprun submit --wait ...``) and everything from the first other word on is
    ``rest``. ``--help`` (``-h``) is every command's; with it, the words are not counted.

    Diagnostics (collected, raised once, with the caret under the word):
        PR101 (unknown option, or a word too many), PR102 (an ambiguous prefix), PR104 (an
        option without its value), PR112 (a value given to an option that takes none).
    """
    table = {flag: row for row in (*rows, _HELP) for flag in row.flags}
    text = _Text(argv, prog)
    diags = Diagnostics()

    def fail(code: str, summary: str, *, detail: str, span: SourceSpan, hint: str) -> None:
        diags.add(error(code, summary, detail=detail, span=span, hint=hint, source_line=text.line))

    found: list[tuple[int, str]] = []  # (index in argv, word)
    given: list[tuple[str, str]] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        name, eq, attached = word.partition("=") if word.startswith("--") else (word, "", "")
        row, could_be = _lookup(table, word, name, exact=leading)  # submit's leading options: exactly as written
        if leading and row is None:
            break
        if not word.startswith("-") or word == "-":
            found.append((i, word))
        elif could_be:
            fail("PR102", f"ambiguous option '{name}'", detail=f"'{name}' could be {join_or(could_be)}",
                 span=text.span(name, i, length=len(name)), hint=f"write one of {join_or(could_be)} in full")
        elif row is None:
            guess = did_you_mean(name, [f for f in table if f.startswith("--")])
            fail("PR101", f"unknown option '{name}'", detail=f"'{prog}' has no option '{name}'",
                 span=text.span(name, i, length=len(name)), hint=f"did you mean '{guess}'?" if guess else f"usage: {usage}")
        elif not row.value:
            if eq:
                fail("PR112", f"option '{row.flags[0]}' takes no value", detail=f"found '{word}'",
                     span=text.span(row.flags[0], i), hint=f"write {row.flags[0]} alone")
            given.append((row.name, ""))
        elif eq or i + 1 < len(argv):
            i += not eq
            given.append((row.name, attached if eq else argv[i]))
        else:
            fail("PR104", f"option '{row.flags[0]}' needs a value", detail=f"'{word}' is the last word",
                 span=text.span(row.flags[0], i), hint=f"write {row.flags[0]}=VALUE")
        i += 1
    asked = any(n == "help" for n, _ in given)
    if not asked and not diags.has_errors and len(found) > words:  # once an option is wrong, its value may be a word
        at, extra = found[words]
        fail("PR101", f"unexpected word '{extra}'", detail=f"usage: {usage}", span=text.span(extra, at),
             hint=f"usage: {usage}")
    if diags.has_errors:
        raise DiagnosticError(diags)
    return Arguments(words=tuple(w for _, w in found), options=tuple(g for g in given if g[0] != "help"), help=asked,
                     rest=tuple(argv[i:]) if leading else (), text=text.line)


def _lookup(table: Mapping[str, CommandOption], word: str, name: str, *,
            exact: bool) -> tuple[CommandOption | None, list[str]]:
    """Return the row an option word names (exactly, or by an unambiguous long prefix), or the options a prefix could be."""
    if not word.startswith("-") or word == "-":
        return None, []
    if name in table or exact or not name.startswith("--") or len(name) <= _MIN_PREFIX:
        return table.get(name), []
    rows = {table[f].name: table[f] for f in table if f.startswith(name)}
    if len(rows) > 1:
        return None, sorted(r.flags[0] for r in rows.values())
    return next(iter(rows.values()), None), []


def describe_usage(usage: Sequence[str]) -> str:
    """Return ``usage:`` and the ``usage`` lines, each after ``poprun`` and under the first."""
    return "usage: " + "".join(f"poprun {line}\n" if n == 0 else f"       poprun {line}\n" for n, line in enumerate(usage))


def spelling(flags: Sequence[str]) -> str:
    """Return an option's spellings as ``poprun --help`` lists them: ``-n [ --tail ]``, ``--json``."""
    short = [f for f in flags if not f.startswith("--")]
    longs = [f for f in flags if f.startswith("--")]
    return f"{short[0]} [ {' '.join(longs)} ]" if short and longs else " ".join(flags)


def describe_options(usage: Sequence[str], rows: Sequence[CommandOption]) -> str:
    """
    Return a command's ``--help`` from its table entry: its ``usage`` lines (each after ``poprun``), then its option rows.

    In PopRun's layout, as ``poprun --help`` lists a launch's options (``-i [ --instance ] N``).
    """
    lines = [f"  {spelling(o.flags) + (f' {o.value}' if o.value else ''):<36} {o.help}\n" for o in rows]
    return describe_usage(usage) + (f"\noptions:\n{''.join(lines)}" if lines else "")
