r"""
JSON text of plain data, without the ``json`` module (start-up: see ``tests/e2e/test_startup.py``).

Layer: ``poprun.runs``; standard library only. :func:`dumps` writes exactly what
``json.dumps(value, ensure_ascii=False, sort_keys=sort_keys, indent=indent)`` writes, or with
``indent`` None the compact form of ``separators=(",", ":")``, for the values a run record holds:
dicts with string keys, lists and tuples, strings, ints, floats, bools and None (a property test
compares the two), except that a lone surrogate (a byte that is not UTF-8, read with
``surrogateescape``) is written as a JSON escape (``\udce9``), so the text is always UTF-8 and
``json`` reads the same string back. Reading a record uses ``json`` itself: commands that read runs
are not on the launch path.
"""

from __future__ import annotations

_INF = float("inf")
_ESCAPES = {i: f"\\u{i:04x}" for i in range(0x20)} | {ord("\\"): "\\\\", ord('"'): '\\"', ord("\n"): "\\n",
                                                       ord("\r"): "\\r", ord("\t"): "\\t", ord("\b"): "\\b",
                                                       ord("\f"): "\\f"}
_ESCAPES |= {i: f"\\u{i:04x}" for i in range(0xD800, 0xE000)}  # lone surrogates: no UTF-8 holds them


def string(text: str) -> str:
    """Return ``text`` as a JSON string (non-ASCII kept as it is, as with ``ensure_ascii=False``)."""
    return '"' + text.translate(_ESCAPES) + '"'


def dumps(value: object, *, indent: int | None = None, sort_keys: bool = False) -> str:
    """Return ``value`` as JSON text (see the module docstring)."""
    parts: list[str] = []
    _write(value, parts, indent, sort_keys, 0)
    return "".join(parts)


def _write(value: object, out: list[str], indent: int | None, sort_keys: bool, depth: int) -> None:
    if isinstance(value, str):
        out.append(string(value))
    elif value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        out.append(int.__repr__(value))
    elif isinstance(value, float):
        out.append(float.__repr__(value) if value == value and value not in (_INF, -_INF)  # noqa: PLR0124 - NaN
                   else "NaN" if value != value else "Infinity" if value > 0 else "-Infinity")  # noqa: PLR0124
    elif isinstance(value, dict):
        if not value:
            out.append("{}")
            return
        items = sorted(value.items()) if sort_keys else list(value.items())
        inner, outer = _breaks(indent, depth)
        out.append("{" + inner)
        for n, (key, item) in enumerate(items):
            if n:
                out.append("," + inner if indent is not None else ",")
            if not isinstance(key, str):
                msg = f"keys must be str, not {type(key).__name__}"
                raise TypeError(msg)
            out.append(string(key) + (": " if indent is not None else ":"))
            _write(item, out, indent, sort_keys, depth + 1)
        out.append(outer + "}")
    elif isinstance(value, list | tuple):
        if not value:
            out.append("[]")
            return
        inner, outer = _breaks(indent, depth)
        out.append("[" + inner)
        for n, item in enumerate(value):
            if n:
                out.append("," + inner if indent is not None else ",")
            _write(item, out, indent, sort_keys, depth + 1)
        out.append(outer + "]")
    else:
        msg = f"Object of type {type(value).__name__} is not JSON serializable"
        raise TypeError(msg)


def _breaks(indent: int | None, depth: int) -> tuple[str, str]:
    if indent is None:
        return "", ""
    return "\n" + " " * (indent * (depth + 1)), "\n" + " " * (indent * depth)
