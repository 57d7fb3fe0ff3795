"""A diagnostic's text never carries a control character to the terminal: argv and files are shown escaped."""

from __future__ import annotations

import pytest

from poprun.core.diagnostic import DiagnosticError
from poprun.planner.flags import parse_flags
from poprun.render.diagnostics import render_diagnostics


@pytest.mark.parametrize("word", ["--a\x1b[2Jb", "--x\rpoprun: all good\x1b]0;owned\x07", "--bidi\u202eevil", "--z\x9b31m"])
def test_an_unknown_option_with_control_characters_is_shown_escaped_with_its_caret(word: str) -> None:
    """An escape sequence (clear screen, title, CSI, a bidi override) in an unknown option reaches no terminal raw."""
    with pytest.raises(DiagnosticError) as raised:
        parse_flags([word, "true"])

    text = render_diagnostics(raised.value.diagnostics)
    assert [] == [c for c in text if not c.isprintable() and c != "\n"]
    source, carets = next((line, below) for line, below in zip(text.splitlines(), text.splitlines()[1:], strict=False)
                          if line.startswith(" | poprun"))
    column = source.index("'--")
    assert carets.index("^") == column
