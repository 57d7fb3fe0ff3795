"""
Laws of the DSL front end: round trips, and no crash (only diagnostics) on any input.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.lark import from_lark
from lark.lexer import PatternStr

from poprun.core.diagnostic import DiagnosticError
from poprun.planner.dsl.grammar import dsl_parser
from poprun.planner.dsl.read import parse_dsl
from poprun.planner.dsl.write import to_dsl
from poprun.planner.spec import Spec
from tests.strategies import specs

# Keywords followed by a space, so that generated statements lex as words; other terminals
# are drawn from their regular expressions by hypothesis.
_KEYWORDS = {t.name: st.just(t.pattern.value + " ") for t in dsl_parser().terminals
             if isinstance(t.pattern, PatternStr) and t.pattern.value.isalpha()}
# Lines that are nearly right, and their near misses.
_LINES = st.sampled_from([
    "hosts pod[1-4", "32 replicas over 2 instances in 2 ilds", "partition p at vipu:8090 (update, keep)",
    "partition p (update", "set A = '{\"a\":1}'", "set 1A = x", "run python3 train.py", "run 'abc", "replics 8",
    "0 replicas", "partition at vipu:0", "subnet 10.0.0.0/99", "cache off", "offline for pod16",
    'mpi global "-x A=1 --tag-output"', 'instance 0 mpi "--bind-to core"', 'run ["a", 1]', 'set A = "\\q"'])


def _parse(text: str) -> Spec | None:
    """Return the spec of ``text``, or None when it has diagnostics (after checking their lines)."""
    try:
        return parse_dsl(text, file="fuzz.pop")
    except DiagnosticError as exc:
        lines = text.count("\n") + 1
        assert exc.diagnostics
        for diagnostic in exc.diagnostics:
            assert diagnostic.span.line is not None
            assert 1 <= diagnostic.span.line <= lines
        return None


@settings(max_examples=100, deadline=None)
@given(specs())
def test_to_dsl_then_parse_dsl_is_identity(spec: Spec) -> None:
    """Writing a spec in the DSL and reading it back gives the same spec."""
    assert spec == parse_dsl(to_dsl(spec), file="spec.pop")


@settings(max_examples=50, deadline=None)
@given(specs())
def test_to_dsl_is_deterministic_and_a_fixed_point(spec: Spec) -> None:
    """Writing the read-back spec again gives the same text."""
    text = to_dsl(spec)

    assert text == to_dsl(parse_dsl(text, file="spec.pop"))


@settings(max_examples=100, deadline=None)
@given(from_lark(dsl_parser(), start="file", explicit=_KEYWORDS))
def test_grammar_strings_give_a_spec_or_diagnostics(text: str) -> None:
    """Any string of the grammar parses to a spec or raises only DiagnosticError."""
    _parse(text)


@settings(max_examples=100, deadline=None)
@given(st.text())
def test_arbitrary_text_gives_a_spec_or_diagnostics_inside_it(text: str) -> None:
    """Arbitrary text parses or raises DiagnosticError whose spans lie within the text."""
    _parse(text)


@settings(max_examples=100, deadline=None)
@given(st.lists(_LINES | st.text(max_size=20), max_size=6))
def test_every_bad_line_gets_its_own_diagnostic(lines: list[str]) -> None:
    """Mixed good and bad lines raise at most one diagnostic per statement line, on that line."""
    lines = [line.replace("\n", " ").replace("\r", " ") for line in lines]
    try:
        parse_dsl("\n".join(lines), file="mixed.pop")
    except DiagnosticError as exc:
        numbers = [d.span.line for d in exc.diagnostics if d.code != "PR111"]
        assert len(numbers) == len(set(numbers))
        assert all(n is not None and 1 <= n <= len(lines) for n in numbers)
