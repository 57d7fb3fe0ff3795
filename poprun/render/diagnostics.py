"""
Diagnostics as text, packaging/Terraform style, with a caret under the span.

Layer: ``poprun.render``; imports ``poprun.core``.

    error[PR300]: replicas do not divide across instances
      --> train.toml:3:12  ($.topology.replicas)
       |
     3 | replicas = 10
       |            ^^ 10 replicas cannot be split evenly across 4 instances
       |
       = hint: use 8 or 12 replicas, or 2 or 5 instances
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

from poprun.core.diagnostic import Diagnostic
from poprun.core.secret import controls_escaped
from poprun.core.span import COMMAND_LINE, ENVIRONMENT, SourceSpan


def render_diagnostic(diag: Diagnostic, sources: Mapping[str, str] | None = None) -> str:
    """
    Return one diagnostic as text (ending with a newline).

    ``sources`` maps a span's file (``<command line>`` included) to its text, for the caret
    line; files not in it are read from disk.
    """
    lines = [f"{diag.severity.value}[{diag.code}]: {controls_escaped(diag.summary)}", f"  --> {controls_escaped(_where(diag.span))}"]
    source = diag.source_line if diag.source_line is not None else _source_line(diag.span, sources or {})
    detail = controls_escaped(diag.detail)
    if source is not None and diag.span.column is not None:
        number = str(diag.span.line or 1) if diag.span.file != COMMAND_LINE else ""
        gutter = " " * len(number)
        start = diag.span.column - 1
        end = diag.span.end_column - 1 if diag.span.end_column and diag.span.end_line in (None, diag.span.line) else start + 1
        # control characters are shown escaped (a terminal never runs what a file or argv holds), the carets under them
        start, end = len(controls_escaped(source[:start])), len(controls_escaped(source[:max(end, start + 1)]))
        carets = "^" * max(end - start, 1)
        lines += [f"{gutter} |", f"{number} | {controls_escaped(source)}", f"{gutter} | {' ' * start}{carets} {detail}",
                  f"{gutter} |"]
    else:
        lines.append(f"   = {detail}")
    lines.append(f"   = hint: {controls_escaped(diag.hint)}")
    return "\n".join(lines) + "\n"


def render_diagnostics(diags: Iterable[Diagnostic], sources: Mapping[str, str] | None = None) -> str:
    """Return several diagnostics, errors first, separated by blank lines."""
    from poprun.core.secret import mask_text

    ordered = sorted(diags, key=lambda d: not d.is_error)
    # a URL's password on the command line or in a spec's line, as long as it was (the carets stay under their words)
    return mask_text("\n".join(render_diagnostic(d, sources) for d in ordered), same_length=True)


def to_json(diags: Iterable[Diagnostic]) -> str:
    """Return the diagnostics as a JSON array with the same fields as the text."""
    items = [
        {"code": d.code, "severity": d.severity.value, "summary": d.summary, "detail": d.detail, "hint": d.hint,
         "span": {"file": d.span.file, "key_path": d.span.key_path, "line": d.span.line, "column": d.span.column}}
        for d in diags
    ]
    from poprun.core.secret import mask_text

    return mask_text(json.dumps(items, indent=2) + "\n")


def _where(span: SourceSpan) -> str:
    if span.file == COMMAND_LINE:
        return f"command line: {span.key_path}"
    if span.is_file:
        return f"{span.describe()}  ({span.key_path})"
    if span.file == ENVIRONMENT:  # an operational fact: what it is about says it all ("host h2")
        return span.key_path
    return span.describe()


def _source_line(span: SourceSpan, sources: Mapping[str, str]) -> str | None:
    if span.line is None or (span.file not in sources and not span.is_file):
        return None
    from poprun.core.diagnostic import DiagnosticError
    from poprun.core.textfile import read_text_file

    try:
        text = sources[span.file] if span.file in sources else read_text_file(span.file, key=span.key_path)
    except DiagnosticError:  # not readable, not a regular file, too large or not text: no source line
        return None
    lines = text.split("\n")
    return lines[span.line - 1] if 0 < span.line <= len(lines) else None
