"""
Laws of the TOML front end: round trips, spans at values, and no crash on any input.
"""

from __future__ import annotations

import datetime as dt
import sys
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tomli_w
from hypothesis import given, settings
from hypothesis import strategies as st

from poprun.core.diagnostic import DiagnosticError
from poprun.planner._tomllocate import Locations
from poprun.planner.option import TOML_KEYS
from poprun.planner.tomlspec import SECTIONS, parse_toml, section_keys, to_toml

if TYPE_CHECKING:
    from poprun.planner.spec import Spec

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, for tests.strategies
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
documents = st.dictionaries(keys, st.dictionaries(keys, values, max_size=4) | values, max_size=5)


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


@settings(max_examples=200, deadline=None)
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


@settings(max_examples=200, deadline=None)
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
