r"""
Text that holds bytes that are not UTF-8: how JSON records keep it exactly, and how text shows it.

Layer: ``poprun.core``; the standard library only.

Python reads argv, the environment and file names with ``surrogateescape``: a byte that is not
part of UTF-8 (``0xe9`` of a Latin-1 file name) becomes the lone surrogate ``U+DCE9``, and
``os.fsencode`` gives the byte back, so a program started with such a string gets the exact
bytes. Such a string cannot be written as UTF-8, so:

- a saved plan writes it as ``{"$bytes": BASE64}``, the exact bytes in base64
  (:func:`to_json_data`; read back by :func:`from_json_data`), and every string of the plan's
  JSON is valid Unicode;
- other records (events, reports) write the surrogate as a JSON escape (``"\udce9"``), which
  ``json`` reads back as the same string (:func:`poprun.runs.jsontext.string`);
- text for people shows each such byte as ``\xe9`` (:func:`visible`), and a shell word holding
  one is quoted as ``$'caf\xe9.txt'`` (:func:`shell_quote`), which bash and zsh read as the bytes.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable

    from poprun.core.span import SourceSpan

MARK = "$bytes"  # not a POSIX name, so never a variable of an env object
VISIBLE = "poprun-visible"  # the codec error handler :func:`register` adds: surrogates written as \xHH


def has_raw(text: str) -> bool:
    """Return whether ``text`` holds a lone surrogate: a byte that is not UTF-8 (``surrogateescape``), or worse."""
    if text.isascii():
        return False
    try:
        text.encode()
    except UnicodeEncodeError:
        return True
    return False


def _surrogate(char: str) -> bool:
    return "\ud800" <= char <= "\udfff"


def visible(text: str) -> str:
    r"""Return ``text`` with each byte that is not UTF-8 shown as ``\xHH`` (other lone surrogates as ``\uHHHH``)."""
    if not has_raw(text):
        return text
    return "".join(_escape(char) if _surrogate(char) else char for char in text)


def _escape(char: str) -> str:
    code = ord(char)
    return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\u{code:04x}"  # noqa: PLR2004


def _visible_error(exc: UnicodeError) -> tuple[str, int]:
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    return "".join(_escape(char) for char in exc.object[exc.start:exc.end]), exc.end


def register() -> None:
    """Add the codec error handler :data:`VISIBLE`, which writes what cannot be encoded as :func:`visible` does."""
    import codecs

    codecs.register_error(VISIBLE, _visible_error)


def shell_quote(word: str) -> str:
    """Return ``word`` quoted for a POSIX shell; one holding bytes that are not UTF-8 as bash's ``$'...'``."""
    import shlex

    if not has_raw(word):
        return shlex.quote(word)
    out = []
    for char in word:
        if _surrogate(char):
            out.append(_escape(char))
        elif char in "\\'":
            out.append("\\" + char)
        elif not char.isprintable():
            out.append("".join(f"\\x{byte:02x}" for byte in char.encode()))
        else:
            out.append(char)
    return "$'" + "".join(out) + "'"


def shell_join(words: Iterable[str]) -> str:
    """Return ``words`` as one shell command line (:func:`shell_quote` each)."""
    return " ".join(shell_quote(word) for word in words)


def to_json_data(value: object) -> object:
    """Return JSON-ready ``value`` with every string holding bytes that are not UTF-8 as ``{"$bytes": BASE64}``."""
    if isinstance(value, str):
        if not has_raw(value):
            return value
        import base64

        return {MARK: base64.b64encode(value.encode("utf-8", "surrogateescape")).decode("ascii")}
    if isinstance(value, dict):
        return {key: to_json_data(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [to_json_data(item) for item in value]
    return value


def check_exact(text: str, *, what: str, span: SourceSpan, hint: str) -> str:
    """
    Return ``text``, written in a format that must hold values exactly (a TOML spec, a batch script).

    Diagnostics:
        PR119 when it holds a byte that is not UTF-8: the format could only hold it changed.
    """
    if not has_raw(text):
        return text
    from poprun.core.diagnostic import DiagnosticError, error

    number, line = next((n, line) for n, line in enumerate(text.splitlines(), 1) if has_raw(line))
    byte = _escape(next(char for char in line if _surrogate(char)))
    raise DiagnosticError([error("PR119", f"{what} cannot hold bytes that are not UTF-8",
                                 detail=f"line {number} would be `{visible(line).strip()}`: the byte {byte} is not "
                                        f"UTF-8, and {what} is UTF-8 text",
                                 span=span, hint=hint)])


class RawBytesError(ValueError):
    """A ``$bytes`` object of a JSON record that is not one; ``path`` is its JSON path."""

    def __init__(self, path: str, detail: str) -> None:
        super().__init__(f"{path}: {detail}")
        self.path = path
        self.detail = detail


def from_json_data(value: object, path: str = "$") -> object:
    """
    Return JSON data with every ``{"$bytes": BASE64}`` object as the string of those bytes.

    Raises:
        RawBytesError: a ``$bytes`` object with other keys, or whose value is not base64; a
            string or key holding a lone surrogate (``"\udce9"``: such bytes are ``$bytes``).
    """
    if isinstance(value, str):
        if has_raw(value):
            surrogate = next(char for char in value if _surrogate(char))
            raise RawBytesError(path, f"holds the lone surrogate {_escaped(surrogate)}, which is no text; "
                                      f'bytes that are not UTF-8 are written as {{"{MARK}": BASE64}}')
        return value
    if isinstance(value, dict):
        if MARK in value:
            return _from_mark(value, path)
        for key in value:
            from_json_data(key, f"{path} (key {_escaped(key)!r})")
        return {key: from_json_data(item, f"{path}.{key}") for key, item in value.items()}
    if isinstance(value, list):
        return [from_json_data(item, f"{path}[{index}]") for index, item in enumerate(value)]
    return value


def _escaped(text: str) -> str:
    return "".join(f"\\u{ord(c):04x}" if _surrogate(c) else c for c in text)


def _from_mark(value: dict[str, object], path: str) -> str:
    import base64
    import binascii

    encoded = value[MARK]
    if len(value) != 1 or not isinstance(encoded, str):
        raise RawBytesError(path, f'a "{MARK}" object holds exactly one base64 string, and nothing else')
    try:
        data = base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise RawBytesError(path, f'"{MARK}" is not base64 ({exc})') from exc
    return data.decode("utf-8", "surrogateescape")
