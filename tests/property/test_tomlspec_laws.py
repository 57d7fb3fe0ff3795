"""
Laws of the TOML front end: round trips, spans at values, and no crash on any input.
"""

from __future__ import annotations

import datetime as dt
import tomllib
from typing import Any

import tomli_w
from hypothesis import given, settings
from hypothesis import strategies as st

from poprun.core.diagnostic import DiagnosticError
from poprun.planner._tomllocate import Locations
from poprun.planner.option import TOML_KEYS
from poprun.planner.spec import Spec
from poprun.planner.tomlspec import SECTIONS, parse_toml, section_keys, to_toml
from tests.strategies import specs

# Keys a spec file might hold: the schema's own, near misses, and anything.
keys = st.sampled_from([*SECTIONS, *(k for s in SECTIONS for k in section_keys(s)), "0", "12", "01", "x", "a b",
                        "PYTHONPATH"]) | st.text(max_size=6)
scalars = (st.integers(-(2**63), 2**63 - 1) | st.booleans() | st.floats(allow_nan=False)
           | st.text(max_size=12) | st.sampled_from(["pod[1-4]", "pod[1-4", "-x A=1", "vipu:8090", "10.0.0.0/8",
                                                     "'unbalanced", "spreadnuma", "ST_POD_NATIVE"])
           | st.datetimes(timezones=st.none() | st.just(dt.UTC)) | st.dates() | st.times())
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3),
                      max_leaves=12)
_instance_paths = [("instances", n, k) for n in ("0", "3") for k in ("set", "forward", "export", "mpi_args")]
_schema_paths = st.sampled_from([(s, k) for s in SECTIONS for k in section_keys(s)] + _instance_paths)


def _nest(pairs: list[tuple[tuple[str, ...], object]]) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for path, value in pairs:
        table = doc
        for part in path[:-1]:
            table = table.setdefault(part, {})
        table[path[-1]] = value
    return doc


# Any document, and documents shaped like the schema with any value at its keys.
documents = st.dictionaries(keys, st.dictionaries(keys, values, max_size=4) | values, max_size=5) | st.lists(
    st.tuples(_schema_paths, values), max_size=6).map(_nest)


@settings(max_examples=100, deadline=None)
@given(specs())
def test_to_toml_then_parse_toml_is_identity(spec: Spec) -> None:
    """Writing a spec as TOML and reading it back gives the same spec."""
    assert spec == parse_toml(to_toml(spec), file="spec.toml")


@settings(max_examples=50, deadline=None)
@given(specs())
def test_parsed_spans_point_at_text_that_reads_back_as_the_value(spec: Spec) -> None:
    """Every option value's span covers exactly the TOML text of that value."""
    text = to_toml(spec)
    where = Locations(text, "spec.toml")
    parsed = parse_toml(text, file="spec.toml")
    doc = tomllib.loads(text)
    for section, table in TOML_KEYS.items():
        for key, field in table.items():
            sourced = getattr(parsed, field)
            if sourced is None:
                continue
            span = sourced.origin
            assert span.key_path == f"$.{section}.{key}"
            assert span.line is not None and span.column is not None
            assert span.end_line is not None and span.end_column is not None
            written = text[where.offset(span.line, span.column) : where.offset(span.end_line, span.end_column)]
            assert doc[section][key] == tomllib.loads(f"v = {written}")["v"]


@settings(max_examples=200, deadline=None)
@given(st.text())
def test_parse_toml_of_any_text_raises_only_diagnostic_error(text: str) -> None:
    """Any text either is a spec or gives diagnostics that name the file."""
    try:
        parse_toml(text, file="any.toml")
    except DiagnosticError as exc:
        assert exc.diagnostics
        assert all(d.span.file == "any.toml" for d in exc.diagnostics)


@settings(max_examples=120, deadline=None)
@given(documents)
def test_parse_toml_of_any_document_returns_a_spec_or_diagnostics_inside_it(doc: dict[str, Any]) -> None:
    """Any TOML document gives a spec, or diagnostics whose lines are lines of the document."""
    text = tomli_w.dumps(doc)
    try:
        parse_toml(text, file="doc.toml")
    except DiagnosticError as exc:
        lines = text.split("\n")
        for diagnostic in exc.diagnostics:
            assert diagnostic.span.line is not None
            assert diagnostic.source_line == lines[diagnostic.span.line - 1]


def _leaves(value: object, path: tuple[str | int, ...]) -> list[tuple[tuple[str | int, ...], object]]:
    if isinstance(value, dict):
        return [leaf for key, inner in value.items() for leaf in _leaves(inner, (*path, key))]
    if isinstance(value, list) and value and all(isinstance(item, dict) for item in value):
        return [leaf for i, inner in enumerate(value) for leaf in _leaves(inner, (*path, i))]  # [[array]] tables
    return [(path, value)]


@settings(max_examples=120, deadline=None)
@given(documents)
def test_every_value_of_any_document_is_located(doc: dict[str, Any]) -> None:
    """The key locator finds every value of any document, and its text reads back as the value."""
    text = tomli_w.dumps(doc)
    where = Locations(text, "doc.toml")
    for path, value in _leaves(tomllib.loads(text), ()):
        if not path:
            continue
        span = where.value(path)
        assert span.line is not None and span.end_line is not None
        start = where.offset(span.line, span.column or 1)
        end = where.offset(span.end_line, span.end_column or 1)
        assert value == tomllib.loads(f"v = {text[start:end]}")["v"]


# TOML as people write it: dotted and quoted keys, comments, CRLF, multi-line strings and
# arrays, inline tables, dates with a space. Most draws are valid TOML; the rest are skipped.
_bare = st.sampled_from(["a", "b", "replicas", "x-y", "_1", "0", "12"])
_quoted = st.sampled_from(['"q k"', "'lit'", '"e\\"sc"', '"\\u00e9"', "''", '"a.b"'])
_keys = st.builds(lambda parts, dot: dot.join(parts), st.lists(_bare | _quoted, min_size=1, max_size=3),
                  st.sampled_from([".", " . "]))
_scalars = st.sampled_from([
    "1", "-0x1F", "+1_000", "3.5e2", "-inf", "true", '"s # not, a ] comment"', "'lit \\'", '"""\nmulti "" line\n"""',
    "'''a\n'b'''", '"""a""""', "'''b'''''", "1979-05-27 07:32:00", "1979-05-27T07:32:00Z", "07:32:00", '"a\\"b"',
    '"""x\\\n  y"""', "[]", "{}"])
_separators = st.sampled_from([",", " , ", ",\n", ", # c\n  ", "\n,"])
_values = st.recursive(_scalars, lambda inner: st.builds(
    lambda items, sep, trail: "[" + sep.join(items) + (sep.strip(" ") if trail and items else "") + "]",
    st.lists(inner, max_size=3), _separators, st.booleans()) | st.builds(
    lambda pairs: "{" + ", ".join(f"{k} = {v}" for k, v in pairs) + "}",
    st.lists(st.tuples(_keys, inner.filter(lambda v: "\n" not in v)), max_size=3)), max_leaves=6)
_lines = (st.builds(lambda k, v, c: f"{k} ={v}{c}", _keys, _values.map(" ".__add__), st.sampled_from(["", " # x"]))
          | st.builds(lambda double, k: f"[[{k}]]" if double else f"[ {k} ]", st.booleans(), _keys)
          | st.sampled_from(["", "# comment"]))
handwritten = st.builds(lambda lines, nl: nl.join(lines) + nl, st.lists(_lines, max_size=8),
                        st.sampled_from(["\n", "\r\n"]))


def _all_values(value: object, path: tuple[str | int, ...]) -> list[tuple[tuple[str | int, ...], object]]:
    inner = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    return [(path, value), *(leaf for key, item in inner for leaf in _all_values(item, (*path, key)))]


@settings(max_examples=150, deadline=None)
@given(handwritten)
def test_every_value_of_handwritten_toml_is_located(text: str) -> None:
    """In TOML written by hand, every value and array item is found, and its text reads back as it."""
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return
    where = Locations(text, "hand.toml")
    for path, value in _all_values(doc, ())[1:]:
        span = where.value(path)
        assert span.line is not None and span.end_line is not None
        written = text[where.offset(span.line, span.column or 1) : where.offset(span.end_line, span.end_column or 1)]
        opener = "{" if isinstance(value, dict) else "[" if isinstance(value, list) else ""
        if written.startswith(opener):  # not a [table] header, nor the key of a table or [[array]]
            assert value == tomllib.loads(f"v = {written}")["v"]
