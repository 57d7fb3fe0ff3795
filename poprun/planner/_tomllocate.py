"""
The TOML text side of the TOML front end: where keys and values are, and how to name them.

Layer: ``poprun.planner`` (private to :mod:`poprun.planner.tomlspec`); imports only
``poprun.core`` and the value converters' word lists. It knows TOML, not the spec schema.

tomllib gives positions only for syntax errors, so :class:`Locations` scans a text that
tomllib has already accepted and records, for every key path (``("topology", "replicas")``,
``("env", "forward", 1)``), where its key and its value are written. It tracks ``[table]``
and ``[[array]]`` headers, dotted and quoted keys, inline tables and arrays. Positions are
best-effort: a path that is not found gives a span with only ``key_path`` set. The rest of
the module words messages: TOML type names, found values, how-to-write hints and syntax errors.
"""

from __future__ import annotations

import bisect
import itertools
import re
import tomllib
from collections.abc import Callable

from poprun.core.diagnostic import Diagnostic, error
from poprun.core.span import SourceSpan
from poprun.planner.value import FALSE_WORDS, TRUE_WORDS

Path = tuple[str | int, ...]
_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_BARE_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")
_SCALAR_END = frozenset(",]}#\n\r")
# Deeper than this, arrays and inline tables are skipped rather than mapped: no key of the
# schema is nested that deep, and skipping keeps the scanner off the recursion limit.
_MAX_DEPTH = 8
_INT = re.compile(r"[+-]?[0-9]+\Z")
_AT = re.compile(r"\s*\(at (?:line (\d+), column (\d+)|end of document)\)\Z")
_SYNTAX_HINTS = (
    ("Invalid value", 'quote text: key = "text"; booleans are true and false, numbers have no quotes'),
    ("Cannot", "give each key and each [table] once"),
    ("Duplicate", "give each key once"),
    ("Expected '='", "write key = value"),
    ("Expected newline", "put each key = value on a line of its own"),
    ("Unterminated string", "close the string with the quote that opened it"),
    ("Unclosed", "close it with ']' or '}'; an inline table { ... } must fit on one line"),
    ("Invalid statement", "write key = value, a [table] header or a # comment"),
)


def key_path(path: Path) -> str:
    """Return the cattrs-style path of ``path``: ``$.topology.replicas``, ``$.env.forward[1]``."""
    out = "$"
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _BARE_KEY.fullmatch(part):
            out += f".{part}"
        else:
            out += f"[{part!r}]"
    return out


class Locations:
    """The places of the keys and values of one TOML text, which tomllib must have accepted."""

    def __init__(self, text: str, file: str) -> None:
        self.text = text
        self.file = file
        self._line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
        scanner = _Scanner(text)
        scanner.run()
        self._keys = scanner.keys
        self._values = scanner.values

    def value(self, path: Path) -> SourceSpan:
        """Return the span of the value at ``path`` (a table: its header or its key)."""
        return self._span(path, self._values.get(path) or self._keys.get(path))

    def key(self, path: Path) -> SourceSpan:
        """Return the span of the key at ``path`` (falling back on its value)."""
        return self._span(path, self._keys.get(path) or self._values.get(path))

    def inside(self, path: Path, decoded: str, *, offset: int, length: int) -> SourceSpan:
        """
        Return the span of ``decoded[offset:offset + length]`` inside the string at ``path``.

        Only a one-line string written without escapes maps character for character;
        any other string gives the span of the whole value.
        """
        where = self._values.get(path)
        if where is None:
            return self.value(path)
        start, end = where
        raw = self.text[start:end]
        simple = len(raw) >= 2 and raw[0] in "\"'" and raw[:3] not in ('"""', "'''")  # noqa: PLR2004
        if not simple or raw[1:-1] != decoded:
            return self.value(path)
        first = start + 1 + min(offset, len(decoded))
        return self._span(path, (first, max(min(first + length, end - 1), first + 1)))

    def line_text(self, line: int | None) -> str | None:
        """Return the text of 1-based ``line`` without its line ending, or None."""
        if line is None or not 0 < line <= len(self._line_starts):
            return None
        start = self._line_starts[line - 1]
        end = self.text.find("\n", start)
        return self.text[start : len(self.text) if end < 0 else end].removesuffix("\r")

    def _span(self, path: Path, where: tuple[int, int] | None) -> SourceSpan:
        if where is None:
            return SourceSpan(file=self.file, key_path=key_path(path))
        (line, column), (end_line, end_column) = self.position(where[0]), self.position(where[1])
        return SourceSpan(file=self.file, key_path=key_path(path), line=line, column=column,
                          end_line=end_line, end_column=end_column)

    def position(self, offset: int) -> tuple[int, int]:
        """Return the 1-based (line, column) of a character offset."""
        index = bisect.bisect_right(self._line_starts, offset) - 1
        return index + 1, offset - self._line_starts[index] + 1

    def offset(self, line: int, column: int) -> int:
        """Return the character offset of a 1-based (line, column): the inverse of :meth:`position`."""
        return self._line_starts[line - 1] + column - 1


class _Scanner:
    """One pass over a valid TOML text, recording (start, end) offsets of keys and values."""

    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0
        self.keys: dict[Path, tuple[int, int]] = {}
        self.values: dict[Path, tuple[int, int]] = {}
        self._arrays: dict[Path, int] = {}  # [[array]] tables seen so far, per path

    def run(self) -> None:
        table: Path = ()
        while True:
            self._blank()
            if self.i >= len(self.s):
                return
            before = self.i
            if self.s[self.i] == "[":
                table = self._header()
            else:
                self._keyval(table, 0)
            self.i = max(self.i, before + 1)  # always advance, whatever the text

    def _peek(self, ahead: int = 0) -> str:
        index = self.i + ahead
        return self.s[index] if index < len(self.s) else ""

    def _blank(self, *, newlines: bool = True) -> None:
        """Skip spaces and tabs; also comments and line breaks when ``newlines``."""
        while self.i < len(self.s):
            char = self.s[self.i]
            if char in " \t" or (newlines and char in "\r\n"):
                self.i += 1
            elif newlines and char == "#":
                end = self.s.find("\n", self.i)
                self.i = len(self.s) if end < 0 else end
            else:
                return

    def _header(self) -> Path:
        start = self.i
        double = self.s.startswith("[[", self.i)
        self.i += 2 if double else 1
        parts = self._key()
        self._blank(newlines=False)
        self.i += 2 if double else 1
        where = (start, self.i)
        path: Path = ()
        for number, (name, key_where) in enumerate(parts):
            path = (*path, name)
            if double and number == len(parts) - 1:
                count = self._arrays.get(path, 0)
                self._arrays[path] = count + 1
                self.keys.setdefault(path, key_where)
                path = (*path, count)
                self.keys[path] = where
            elif path in self._arrays:
                path = (*path, self._arrays[path] - 1)
            else:
                self.keys.setdefault(path, key_where)
        self.values.setdefault(path, where)
        return path

    def _key(self) -> list[tuple[str, tuple[int, int]]]:
        """Read a dotted key: each part's name and (start, end)."""
        parts: list[tuple[str, tuple[int, int]]] = []
        while True:
            self._blank(newlines=False)
            start = self.i
            char = self._peek()
            if char == '"':
                self.i = self._string_end(start)
                name = _decode_key(self.s[start : self.i])
            elif char == "'":
                self.i = self._string_end(start)
                name = self.s[start + 1 : self.i - 1]
            else:
                while self._peek() in _BARE_CHARS:
                    self.i += 1
                name = self.s[start : self.i]
            parts.append((name, (start, self.i)))
            self._blank(newlines=False)
            if self._peek() != "." or self.i == start:
                return parts
            self.i += 1

    def _keyval(self, base: Path, depth: int) -> None:
        path = base
        for name, where in self._key():
            path = (*path, name)
            self.keys.setdefault(path, where)
        self._blank(newlines=False)
        if self._peek() == "=":
            self.i += 1
        self._blank(newlines=False)
        self._value(path, depth)

    def _value(self, path: Path, depth: int) -> None:
        start = self.i
        char = self._peek()
        if char in ('"', "'"):
            self.i = self._string_end(start)
        elif char in ("[", "{") and depth >= _MAX_DEPTH:
            self._skip_nested()
        elif char == "[":
            self._array(path, depth)
        elif char == "{":
            self._inline_table(path, depth)
        else:
            while self.i < len(self.s) and self.s[self.i] not in _SCALAR_END:
                self.i += 1
            while self.i > start and self.s[self.i - 1] in " \t":
                self.i -= 1
        self.values[path] = (start, self.i)

    def _array(self, path: Path, depth: int) -> None:
        index = itertools.count()
        self._sequence("]", lambda: self._value((*path, next(index)), depth + 1))

    def _inline_table(self, path: Path, depth: int) -> None:
        self._sequence("}", lambda: self._keyval(path, depth + 1))

    def _sequence(self, close: str, item: Callable[[], None]) -> None:
        """Walk ``item, item, ...`` up to ``close`` (the opening bracket is at ``self.i``)."""
        self.i += 1
        while self.i < len(self.s):
            self._blank()
            if self._peek() in (close, ""):
                break
            before = self.i
            item()
            self._blank()
            if self._peek() == ",":
                self.i += 1
            elif self.i == before:
                break
        self.i = min(self.i + 1, len(self.s))

    def _skip_nested(self) -> None:
        """Skip a whole array or inline table without recursion."""
        level = 0
        while self.i < len(self.s):
            char = self.s[self.i]
            if char in ('"', "'"):
                self.i = self._string_end(self.i)
                continue
            if char == "#":
                end = self.s.find("\n", self.i)
                self.i = len(self.s) if end < 0 else end
                continue
            self.i += 1
            level += (char in "[{") - (char in "]}")
            if level <= 0:
                return

    def _string_end(self, start: int) -> int:
        """Return the offset just after the string starting at ``start``."""
        quote = self.s[start]
        if self.s.startswith(quote * 3, start):
            end = self._find_close(start + 3, quote * 3, escapes=quote == '"') + 3
            extra = 0
            while extra < 2 and end < len(self.s) and self.s[end] == quote:  # noqa: PLR2004
                end, extra = end + 1, extra + 1
            return min(end, len(self.s))
        return min(self._find_close(start + 1, quote, escapes=quote == '"') + 1, len(self.s))

    def _find_close(self, index: int, close: str, *, escapes: bool) -> int:
        while index < len(self.s):
            if escapes and self.s[index] == "\\":
                index += 2
            elif self.s.startswith(close, index):
                return index
            else:
                index += 1
        return len(self.s)


def _decode_key(raw: str) -> str:
    """Return the name of a quoted basic-string key such as ``"a b"``."""
    try:
        return next(iter(tomllib.loads(f"{raw} = 0")), raw)
    except tomllib.TOMLDecodeError:
        return raw


# The TOML types a key may expect. "table" is a whole [section]: its hint is the example itself.
TYPE_CHECKS: dict[str, Callable[[object], bool]] = {
    "int": lambda v: isinstance(v, int) and not isinstance(v, bool), "bool": lambda v: isinstance(v, bool),
    "str": lambda v: isinstance(v, str), "list": lambda v: isinstance(v, list), "dict": lambda v: isinstance(v, dict),
    "table": lambda v: isinstance(v, dict), "strs": lambda v: isinstance(v, (str, list)),
    "number": lambda v: isinstance(v, int | float) and not isinstance(v, bool),
    "ints": lambda v: isinstance(v, (str, list))}
TYPE_NAMES = {"int": "an integer", "bool": "a boolean", "str": "a string", "list": "an array", "dict": "a table",
              "table": "a table", "strs": "a string or an array of strings", "number": "a number",
              "ints": "an array of integers or a string"}


def describe(value: object) -> str:
    """Return ``a string '4'``, ``an integer 4``, ``an array``: a found value for a message."""
    if isinstance(value, bool):
        return f"a boolean {str(value).lower()}"
    if isinstance(value, str):
        return f"a string {value if len(value) <= 40 else value[:37] + '...'!r}"  # noqa: PLR2004
    if isinstance(value, int):
        return f"an integer {value}" if value.bit_length() < 128 else "a very large integer"  # noqa: PLR2004
    if isinstance(value, float):
        return f"a float {value!r}"
    if isinstance(value, (list, dict)):
        return "an array" if isinstance(value, list) else "a table"
    return f"a {type(value).__name__.replace('datetime', 'date-time')} {value}"


def type_hint(path: Path, value: object, expected: str, example: str) -> str:
    """Return how to write ``value`` as the ``expected`` TOML type."""
    name = str(path[-1]) if isinstance(path[-1], str) else f"item {path[-1]} of {path[-2]}"
    if expected == "table":
        return example
    if expected == "int" and isinstance(value, str) and _INT.match(value.strip()):
        return f"write {name} = {value.strip()} without quotes"
    if expected == "int" and isinstance(value, float) and value.is_integer() and abs(value) < 1e15:  # noqa: PLR2004
        return f"write {name} = {int(value)}"
    number = _number_text(value)
    word = value.strip().lower() if isinstance(value, str) else number if number in ("0", "1") else ""
    if expected == "bool" and word in (*TRUE_WORDS, *FALSE_WORDS):
        return f"write {name} = {'true' if word in TRUE_WORDS else 'false'} (true or false, without quotes)"
    if expected == "str" and number is not None:
        return f'write it with quotes: "{number}"'
    return f"write {name} = {example}" if isinstance(path[-1], str) else f"write each item as a string, e.g. {example}"


def _number_text(value: object) -> str | None:
    """Return how a TOML integer or float was written (near enough), or None for other values."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return repr(value) if isinstance(value, float) or value.bit_length() < 128 else None  # noqa: PLR2004


def label(path: Path) -> str:
    """Return ``[topology] replicas``, ``[env] forward[1]``, ``[instances.0] set.A`` for messages."""
    head = 2 if path[0] == "instances" and len(path) > 1 else 1
    rest = ""
    for part in path[head:]:
        rest += f"[{part}]" if isinstance(part, int) else f".{part}" if rest else part
    section = ".".join(str(p) for p in path[:head])
    return f"[{section}] {rest}" if rest else f"[{section}]"


def syntax_error(text: str, file: str, message: str) -> Diagnostic:
    """Return the PR100 diagnostic of a tomllib message ``... (at line 3, column 12)``."""
    match = _AT.search(message)
    detail = message[: match.start()] if match else message
    lines = text.split("\n")
    if match and match.group(1):
        line, column = int(match.group(1)), int(match.group(2))
    elif match:
        line, column = len(lines), len(lines[-1]) + 1
    else:
        return error("PR100", "TOML syntax error", detail=detail, span=SourceSpan(file=file, key_path="$"),
                     hint="see docs/spec-toml.md for the syntax of spec files")
    hint = next((h for prefix, h in _SYNTAX_HINTS if detail.startswith(prefix)), "see docs/spec-toml.md")
    span = SourceSpan(file=file, key_path="$", line=line, column=column, end_line=line, end_column=column + 1)
    source = lines[line - 1].removesuffix("\r")
    return error("PR100", "TOML syntax error", detail=detail, span=span, hint=hint, source_line=source)
