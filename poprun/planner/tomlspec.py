"""
The TOML front end: a spec file such as ``train.toml`` to a :class:`Spec`, and back.

Layer: ``poprun.planner``; imports ``poprun.core``, the option table and the value
converters; never render, backends or cli.

The schema is the option table's TOML layout (``[topology] replicas = 32`` ...) plus
``[partition] server``, ``[env]``, ``[instances.N]`` and ``[program]``; ``docs/spec-toml.md``
is its reference. Every value keeps a :class:`SourceSpan` at the text of the value, found by
:mod:`poprun.planner._tomllocate`, and every problem in a file is reported, not just the first.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable
from typing import Any

import tomli_w

from poprun.core.diagnostic import DiagnosticError, Diagnostics, error
from poprun.core.hint import did_you_mean, list_choices
from poprun.core.hostlist import MAX_HOSTS, HostlistError, compress, expand
from poprun.core.span import SourceSpan
from poprun.planner import _tomllocate as loc
from poprun.planner import value as conv
from poprun.planner._tomllocate import Locations, Path
from poprun.planner.flags import split_env_args
from poprun.planner.option import BY_FIELD, TOML_KEYS, Option
from poprun.planner.spec import EnvVarSpec, InstanceArgsSpec, Sourced, Spec

__all__ = ["SECTIONS", "load_toml", "parse_toml", "section_keys", "to_toml"]

_ORDER = ("topology", "partition", "cache", "mpi", "env", "instances", "placement", "output", "offline",
          "profile", "network", "ssh", "run", "recovery", "program")
# Sections in the order to_toml writes them; a section added to the option table comes last.
SECTIONS: tuple[str, ...] = (*_ORDER, *(s for s in TOML_KEYS if s not in _ORDER))
_ENV_KEYS = ("forward", "set", "export")
_EXTRA_KEYS: dict[str, tuple[str, ...]] = {"partition": ("server",), "env": _ENV_KEYS, "program": ("argv", "cwd")}
_INSTANCE_KEYS = (*_ENV_KEYS, "mpi_args")
_NAME_HINT = "use letters, digits and underscores, not starting with a digit"
_FORWARD_HINT = "forward takes names only; put variables with a value under set"
_INDEX = re.compile(r"(?:0|[1-9][0-9]{0,8})\Z")
_EXAMPLES = {"int": "4", "nonneg": "0", "count": "0", "port": "8090", "bool": "true", "subnet": '"10.5.0.0/16"',
             "hosts": '"pod[1-4]"', "args": '["--tag-output"]', "argv": '["python3", "train.py"]',
             "forward": '["PYTHONPATH"]', "export": '["PYTHONPATH", "OMP_NUM_THREADS=8"]',
             "set": '{ NAME = "value" }', "mpi_args": '["--tag-output"]', "seconds": "30",
             "statuses": "[2, 126, 127]", "signal": '"USR1@60"'}


def section_keys(section: str) -> tuple[str, ...]:
    """Return the keys that ``[section]`` accepts (``instances`` takes instance indices)."""
    return (*TOML_KEYS.get(section, {}), *_EXTRA_KEYS.get(section, ()))


def parse_toml(text: str, *, file: str) -> Spec:
    """
    Return the spec written as TOML in ``text``; ``file`` names it in spans.

    Raises only :class:`DiagnosticError`, with every problem found in the text.

    Diagnostics:
        PR100 TOML syntax; PR103 host lists; PR105 invalid values (choices, variable
        names, servers); PR107 unbalanced quotes; PR109 unknown sections and keys; PR110
        wrong TOML types; PR200 non-positive integers; PR211 ``server`` with
        ``server_host``/``server_port``; PR212 ports; PR213 subnets.
    """
    if text.startswith("\ufeff"):  # a byte-order mark, as some Windows editors save: a space keeps columns
        text = " " + text[1:]
    try:
        doc = tomllib.loads(text)
    except ValueError as exc:  # TOMLDecodeError, or an integer longer than int() allows
        raise DiagnosticError([loc.syntax_error(text, file, str(exc))]) from exc
    except RecursionError as exc:
        raise DiagnosticError([loc.syntax_error(text, file, "arrays or inline tables nested too deeply")]) from exc
    reader = _Reader(Locations(text, file))
    reader.read(doc)
    return reader.spec()


def load_toml(path: str) -> Spec:
    """
    Return the spec in the TOML file ``path``.

    Diagnostics:
        PR113 when the file cannot be read, and those of :func:`parse_toml`.
    """
    from poprun.core.textfile import read_text_file

    return parse_toml(read_text_file(path, key="SPEC"), file=path)


class _Reader:
    """One walk over a parsed document, collecting spec values and diagnostics."""

    def __init__(self, where: Locations) -> None:
        self.where = where
        self.diags = Diagnostics()
        self.values: dict[str, Sourced[Any]] = {}
        self.env: dict[str, list[Sourced[EnvVarSpec]]] = {"env": [], "mpi_global_args": [], "mpi_local_args": []}
        self.instances: list[Sourced[InstanceArgsSpec]] = []

    def spec(self) -> Spec:
        if self.diags.has_errors:  # in the order of the text, unlocated ones first
            raise DiagnosticError(sorted(self.diags, key=lambda d: (d.span.line or 0, d.span.column or 0)))
        env = tuple(entry for entries in self.env.values() for entry in entries)
        return Spec(**self.values, env=env, instance_args=tuple(self.instances))

    def fail(self, code: str, summary: str, *, detail: str, span: SourceSpan, hint: str,
             related: tuple[SourceSpan, ...] = ()) -> None:
        self.diags.add(error(code, summary, detail=detail, span=span, hint=hint, related=related,
                             source_line=self.where.line_text(span.line)))

    def invalid(self, path: Path, problem: conv.InvalidValueError | None, span: SourceSpan | None = None) -> None:
        if problem is None:  # a problem already reported
            return
        self.fail(problem.code, f"invalid value for {loc.label(path)}", detail=problem.detail,
                  span=span or self.where.value(path), hint=problem.hint)

    def read(self, doc: dict[str, Any]) -> None:
        for name, table in doc.items():
            if name not in SECTIONS:
                self._unknown_top(name, table)
            elif self.check((name,), table, "table", _misplaced(name)):
                self._section(name, table)

    def check(self, path: Path, value: object, expected: str, example: str) -> bool:
        """Return whether ``value`` has the TOML type ``expected``; report PR110 when not."""
        if loc.TYPE_CHECKS[expected](value):
            return True
        detail = f"expected {loc.TYPE_NAMES[expected]}, found {loc.describe(value)}"
        self.fail("PR110", f"wrong type for {loc.label(path)}", detail=detail, span=self.where.value(path),
                  hint=loc.type_hint(path, value, expected, example))
        return False

    def _section(self, name: str, table: dict[str, Any]) -> None:
        if name == "instances":
            self._instances(table)
            return
        for key, value in table.items():
            if key in TOML_KEYS.get(name, {}):
                self._option(TOML_KEYS[name][key], (name, key), value)
            elif key not in _EXTRA_KEYS.get(name, ()):
                self._unknown_key((name, key), section_keys(name))
        if name == "partition" and "server" in table:
            self._server(table)
        elif name == "env":
            self.env["env"] = self._env_entries(("env",), table)
        elif name == "program":
            self._program(table)

    def _option(self, field: str, path: Path, value: object) -> None:
        option = BY_FIELD[field]
        kind, example = option.kind, _EXAMPLES.get(option.kind, '"text"')
        result: object = None
        if kind in ("int", "nonneg", "count", "port"):
            if self.check(path, value, "int", example) and isinstance(value, int):
                problem = _integer_problem(value, kind)
                self.invalid(path, problem)
                result = value if problem is None else None
        elif kind == "bool":
            result = value if self.check(path, value, "bool", example) else None
        elif kind == "hosts":
            result = self._hosts(path, value)
        elif kind == "args":
            result = self._mpi_args(path, value, self.env[field])
        elif kind == "names":
            result = self._names(path, value)
        elif kind == "seconds":
            result = self._seconds(path, value, example)
        elif kind == "statuses":
            result = self._statuses(path, value, example)
        elif kind == "signal":
            result = self._converted(path, value, example, conv.to_signal)
        elif self.check(path, value, "str", f'"{option.choices[0]}"' if option.choices else example):
            result = self._text(path, str(value), option)
        if result is not None:
            self.values[field] = Sourced(result, self.where.value(path))

    def _text(self, path: Path, text: str, option: Option) -> str | None:
        convert: Callable[[str], str] = {
            "choice": lambda t: conv.to_choice(t, option.choices), "subnet": conv.to_subnet,
            "backend": lambda t: conv.to_backend(t, option.choices)}.get(option.kind, str)
        try:
            return convert(text)
        except conv.InvalidValueError as problem:
            self.invalid(path, problem)
            return None

    def _seconds(self, path: Path, value: object, example: str) -> int | None:
        """Return a number of seconds (``backoff = 0.5``) in whole milliseconds."""
        if not self.check(path, value, "number", example) or not isinstance(value, int | float):
            return None
        try:
            return conv.from_seconds_number(value)
        except conv.InvalidValueError as problem:
            self.invalid(path, problem)
            return None

    def _statuses(self, path: Path, value: object, example: str) -> tuple[int, ...] | None:
        """Return exit statuses: an array of integers (``[]``: none), or the flag's text (``"2,126"``, ``"none"``)."""
        if isinstance(value, str):
            statuses: tuple[int, ...] | None = self._converted(path, value, example, conv.to_statuses)
            return statuses
        if not self.check(path, value, "ints", example) or not isinstance(value, list):
            return None
        if not all([self.check((*path, i), item, "int", "2") for i, item in enumerate(value)]):  # noqa: C419 - each
            return None
        if not value:
            return ()
        try:
            return conv.to_statuses(",".join(map(str, value)))
        except conv.InvalidValueError as problem:
            self.invalid(path, problem)
            return None

    def _converted(self, path: Path, value: object, example: str, convert: Callable[[str], Any]) -> Any:
        """Return a string value through ``convert``; report its problem at the value."""
        if not self.check(path, value, "str", example) or not isinstance(value, str):
            return None
        try:
            return convert(value)
        except conv.InvalidValueError as problem:
            self.invalid(path, problem)
            return None

    def _names(self, path: Path, value: object) -> tuple[str, ...] | None:
        """Return an array of variable names (``mask = ["MY_TOKEN"]``)."""
        texts = self._strings(path, value, '["MY_TOKEN", "DB_PASS"]')
        if texts is None:
            return None
        try:
            return tuple(dict.fromkeys(name for text in texts for name in conv.to_names(text)))
        except conv.InvalidValueError as problem:
            self.invalid(path, problem)
            return None

    def _strings(self, path: Path, value: object, example: str, expected: str = "list") -> list[str] | None:
        """Return an array of strings, reporting each item of the wrong type."""
        if not self.check(path, value, expected, example):
            return None
        items = value if isinstance(value, list) else []
        good = [self.check((*path, i), item, "str", '"text"') for i, item in enumerate(items)]
        return [str(item) for item in items] if all(good) else None

    def _hosts(self, path: Path, value: object) -> tuple[str, ...] | None:
        items: list[tuple[Path, str]] = [(path, value)] if isinstance(value, str) else []
        if not isinstance(value, str):
            texts = self._strings(path, value, '"pod[1-4]" or ["pod1", "login"]', "strs")
            if texts is None:
                return None
            items = [((*path, i), text) for i, text in enumerate(texts)]
        hosts: dict[str, None] = {}
        for item_path, text in items:
            try:
                hosts.update(dict.fromkeys(expand(text)))
            except HostlistError as exc:
                span = self.where.inside(item_path, text, offset=exc.position, length=exc.length)
                self.fail("PR103", exc.message, detail=f"in host list '{text}'", span=span, hint=exc.hint)
                return None
            if len(hosts) > MAX_HOSTS:
                self.fail("PR103", f"host list expands to more than {MAX_HOSTS} hosts", detail="in the whole array",
                          span=self.where.value(path), hint="split the list or use smaller ranges")
                return None
        return tuple(hosts)

    def _tokens(self, path: Path, value: object, example: str) -> tuple[str, ...] | None:
        """Return an array of strings as is, or one string shell-split."""
        if not isinstance(value, str):
            items = self._strings(path, value, example, "strs")
            return None if items is None else tuple(items)
        try:
            return conv.to_args(value)
        except conv.InvalidValueError as problem:
            self.invalid(path, problem)
            return None

    def _mpi_args(self, path: Path, value: object, env: list[Sourced[EnvVarSpec]]) -> tuple[str, ...] | None:
        """Return mpirun arguments; their ``-x NAME[=VALUE]`` pairs go to ``env``."""
        tokens = self._tokens(path, value, '["--tag-output"]')
        if tokens is None:
            return None
        indices = _env_indices(tokens)
        places = [self.where.value((*path, i) if isinstance(value, list) else path) for i in indices]
        problems = [(span, problem) for span, i in zip(places, indices, strict=True)
                    if (problem := _env_problem(tokens[i], bare=None)) is not None]
        for span, problem in problems:
            self.invalid(path, problem, span)
        if problems:
            return None
        try:
            entries, rest = split_env_args(tokens)
        except conv.InvalidValueError as problem:
            self.invalid(path, problem)
            return None
        env.extend(Sourced(entry, span) for entry, span in zip(entries, places, strict=True))
        return rest

    def _env_entries(self, base: Path, table: dict[str, Any]) -> list[Sourced[EnvVarSpec]]:
        """Return the variables of ``forward``, ``set`` and ``export`` in ``table``, in that order."""
        entries: list[Sourced[EnvVarSpec]] = []
        for key in (k for k in _ENV_KEYS if k in table):
            path = (*base, key)
            if key == "set":
                pairs = table[key].items() if self.check(path, table[key], "dict", _EXAMPLES["set"]) else ()
                items = [((*path, n), n, v, _env_problem(n, bare=_NAME_HINT))
                         for n, v in pairs if self.check((*path, n), v, "str", '"value"')]
            else:
                words = self._strings(path, table[key], _EXAMPLES[key]) or []
                bare = _FORWARD_HINT if key == "forward" else None
                items = [((*path, i), *_name_value(w), _env_problem(w, bare=bare)) for i, w in enumerate(words)]
            for where, name, value, problem in items:
                if problem is not None:
                    self.invalid(path, problem, self.where.key(where) if key == "set" else self.where.value(where))
                else:
                    entries.append(Sourced(EnvVarSpec(name=name, value=value), self.where.value(where)))
        return entries

    def _instances(self, table: dict[str, Any]) -> None:
        for key, value in table.items():
            path: Path = ("instances", key)
            if not _INDEX.match(key):
                self._unknown_index(key)
            elif self.check(path, value, "table", f"write [instances.{key}] on a line of its own, its keys below it"):
                for inner in value:
                    if inner not in _INSTANCE_KEYS:
                        self._unknown_key((*path, inner), _INSTANCE_KEYS)
                env = self._env_entries(path, value)
                args = self._mpi_args((*path, "mpi_args"), value["mpi_args"], env) if "mpi_args" in value else ()
                spec = InstanceArgsSpec(index=int(key), env=tuple(e.value for e in env), mpi_args=args or ())
                self.instances.append(Sourced(spec, self.where.value(path)))
        self.instances.sort(key=lambda entry: entry.value.index)

    def _program(self, table: dict[str, Any]) -> None:
        if "argv" in table:
            argv = self._tokens(("program", "argv"), table["argv"], _EXAMPLES["argv"])
            if argv is not None:
                self.values["program"] = Sourced(argv, self.where.value(("program", "argv")))
        if "cwd" in table and self.check(("program", "cwd"), table["cwd"], "str", '"/path/to/dir"'):
            self.values["working_dir"] = Sourced(table["cwd"], self.where.value(("program", "cwd")))

    def _server(self, table: dict[str, Any]) -> None:
        """Read ``server = "host:port"`` into the V-IPU server host and port."""
        path = ("partition", "server")
        if not self.check(path, table["server"], "str", '"vipu.my_domain:8090"'):
            return
        span, (host, port) = self.where.value(path), _split_server(table["server"])
        clashes = [k for k, given in (("server_host", True), ("server_port", port is not None)) if given and k in table]
        for key in clashes:
            self.fail("PR211", f"[partition] server and {key} both set",
                      detail=f"server = '{table['server']}' already gives the V-IPU server's {key[7:]}", span=span,
                      hint='keep one: server = "host:port", or server_host and server_port',
                      related=(self.where.value(("partition", key)),))
        if not host:
            self.invalid(path, conv.InvalidValueError(f"'{table['server']}' names no host", 'write server = "host:port"'))
            return
        try:
            number = None if port is None else conv.to_port(port)
        except conv.InvalidValueError as problem:
            if problem.code == "PR105":  # not a number: show the whole form
                problem.hint = 'write server = "host:port", e.g. "vipu.my_domain:8090"'
            self.invalid(path, problem)
            return
        if not clashes:
            self.values["vipu_server_host"] = Sourced(host, span)
            if number is not None:
                self.values["vipu_server_port"] = Sourced(number, span)

    def _unknown_top(self, name: str, value: object) -> None:
        if isinstance(value, dict):
            guess = did_you_mean(name, SECTIONS)
            hint = (f"did you mean [{guess}]?" if guess else _elsewhere(name, ())
                    or f"valid sections are {list_choices(SECTIONS)}")
            self.fail("PR109", f"unknown section [{name}]", detail=f"the spec has no section [{name}]",
                      span=self.where.key((name,)), hint=hint)
            return
        hint = _elsewhere(name, ()) or f"keys belong in a section; valid sections are {list_choices(SECTIONS)}"
        self.fail("PR109", f"unknown key '{name}'", detail=f"'{name}' is outside of any section",
                  span=self.where.key((name,)), hint=hint)

    def _unknown_key(self, path: Path, valid: tuple[str, ...]) -> None:
        key, section = str(path[-1]), loc.label(path[:-1])
        guess = did_you_mean(key, valid)
        hint = (f"did you mean '{guess}'?" if guess else _elsewhere(key, valid)
                or f"valid keys in {section} are {list_choices(valid)}")
        self.fail("PR109", f"unknown key '{key}' in {section}", detail=f"{section} has no key '{key}'",
                  span=self.where.key(path), hint=hint)

    def _unknown_index(self, key: str) -> None:
        number = str(int(key)) if key.isascii() and key.isdigit() and len(key) < 10 else "0"  # noqa: PLR2004
        self.fail("PR109", f"unknown key '{key}' in [instances]",
                  detail=f"instance tables are named by an instance index, not '{key}'",
                  span=self.where.key(("instances", key)),
                  hint=f"name the table by its index, e.g. [instances.{number}]")


def _elsewhere(key: str, valid: tuple[str, ...]) -> str | None:
    """Return "did you mean [topology] replicas?" when ``key`` (or one close to it) is another section's."""
    owners = {s: k for s in SECTIONS for k in section_keys(s) if k == key and k not in valid}
    if not owners:
        guess = did_you_mean(key, {k for s in SECTIONS for k in section_keys(s)} - set(valid))
        owners = {s: k for s in SECTIONS for k in section_keys(s) if k == guess}
    if not owners:
        return None
    return "did you mean " + " or ".join(f"[{s}] {k}" for s, k in owners.items()) + "?"


def _misplaced(name: str) -> str:
    """Return the hint for a section written as a plain key, such as ``instances = 4`` at the top."""
    owners = [f"[{s}] {name}" for s in SECTIONS if name in section_keys(s)]
    if owners:
        return f"did you mean {' or '.join(owners)}?"
    return f"write [{name}] on a line of its own, its keys below it"


def _integer_problem(number: int, kind: str) -> conv.InvalidValueError | None:
    """Return the problem with a TOML integer for an option of ``kind``, or None."""
    shown = str(number) if number.bit_length() < 128 else "the number"  # noqa: PLR2004
    if kind == "port" and not 1 <= number <= 65535:  # noqa: PLR2004 - the TCP port range
        return conv.InvalidValueError(f"{shown} is not a port number", "use a port between 1 and 65535", code="PR212")
    if kind == "int" and number < 1:
        return conv.InvalidValueError(f"{shown} is not a positive number", "use a whole number of at least 1", code="PR200")
    if number < 0:
        return conv.InvalidValueError(f"{shown} is negative", "use a whole number, 0 or more")
    return None


def _env_problem(text: str, *, bare: str | None) -> conv.InvalidValueError | None:
    """Return the problem with ``NAME[=VALUE]``; with a ``bare`` hint, ``=VALUE`` is one too."""
    try:
        _, value = conv.to_env_assignment(text)
    except conv.InvalidValueError as problem:
        return problem
    if bare is not None and value is not None:
        return conv.InvalidValueError(f"'{text}' is not an environment variable name", bare)
    return None


def _name_value(word: str) -> tuple[str, str | None]:
    name, eq, value = word.partition("=")
    return name, (value if eq else None)


def _env_indices(tokens: tuple[str, ...]) -> list[int]:
    """Return the indices of the NAME[=VALUE] words after ``-x``, as split_env_args reads them."""
    found, i = [], 0
    while i < len(tokens):
        if tokens[i] == "-x" and i + 1 < len(tokens):
            found.append(i + 1)
            i += 2
        else:
            i += 1
    return found


def _split_server(text: str) -> tuple[str, str | None]:
    """Return (host, port text or None) of ``host``, ``host:port`` or ``[v6 address]:port``."""
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket:  # "[::1": unbalanced, refused by to_server_host
            return text, None
        return (host, rest[1:]) if rest.startswith(":") else (host if not rest else "", None)
    if text.count(":") == 1:
        host, _, port = text.partition(":")
        return host, port
    return text, None


def to_toml(spec: Spec) -> str:
    """
    Return ``spec`` as TOML: only the values set, sections in :data:`SECTIONS` order.

    ``parse_toml(to_toml(spec), file=...) == spec`` for every spec a front end gives;
    repeated ``instance_args`` indices are merged into one ``[instances.N]`` table.
    """
    doc = {name: table for name in SECTIONS if (table := _section_doc(spec, name))}
    return tomli_w.dumps(doc)


def _section_doc(spec: Spec, section: str) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for key, field in TOML_KEYS.get(section, {}).items():
        sourced = getattr(spec, field)
        if sourced is not None:
            table[key] = _value_doc(BY_FIELD[field], sourced.value)
    if section == "env":
        table.update(_env_doc([entry.value for entry in spec.env]))
    elif section == "instances":
        table.update(_instances_doc(spec))
    elif section == "program" and spec.program is not None:
        table["argv"] = list(spec.program.value)
    if section == "program" and spec.working_dir is not None:
        table["cwd"] = spec.working_dir.value
    return table


def _value_doc(option: Option, value: Any) -> Any:
    """Return a spec value as its TOML value: seconds as a number, statuses as an array, a signal as text."""
    kind = option.kind
    if kind == "hosts":
        return _hosts_doc(value)
    if kind in ("args", "names", "statuses"):
        return list(value)
    if kind == "seconds":
        return conv.seconds_number(value)
    return option.text(value) if kind == "signal" else value


def _hosts_doc(hosts: tuple[str, ...]) -> str | list[str]:
    """Return the compressed host list when it expands back to ``hosts`` in order, else the names."""
    try:
        text = compress(hosts)
        if expand(text) == hosts:
            return text
    except HostlistError:
        pass
    return list(hosts)


def _env_doc(entries: list[EnvVarSpec]) -> dict[str, Any]:
    """Return ``forward``/``set`` when they keep the order, else one ordered ``export`` array."""
    split = next((i for i, e in enumerate(entries) if e.value is not None), len(entries))
    forward, sets = entries[:split], entries[split:]
    names = [e.name for e in sets]
    if any(e.value is None for e in sets) or len(set(names)) < len(names):
        return {"export": [e.name if e.value is None else f"{e.name}={e.value}" for e in entries]}
    doc: dict[str, Any] = {"forward": [e.name for e in forward]} if forward else {}
    return doc | ({"set": {e.name: e.value for e in sets}} if sets else {})


def _instances_doc(spec: Spec) -> dict[str, Any]:
    merged: dict[int, tuple[list[EnvVarSpec], list[str]]] = {}
    for entry in sorted(spec.instance_args, key=lambda e: e.value.index):
        env, args = merged.setdefault(entry.value.index, ([], []))
        env.extend(entry.value.env)
        args.extend(entry.value.mpi_args)
    return {str(index): _env_doc(env) | ({"mpi_args": args} if args else {}) for index, (env, args) in merged.items()}
