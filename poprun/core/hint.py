"""
Hints: did-you-mean suggestions, lists of choices and nearest feasible numbers.

Layer: ``poprun.core``; standard library only.
"""

from __future__ import annotations

from collections.abc import Iterable


def did_you_mean(given: str, choices: Iterable[str]) -> str | None:
    """Return the closest choice to ``given``, or None when nothing is close."""
    options = sorted(set(choices))
    import difflib  # here, not at the top: only mistakes need it, and start-up stays lean

    matches = difflib.get_close_matches(given, options, n=1, cutoff=0.6)
    if matches:
        return matches[0]
    lowered = {c.lower(): c for c in options}
    return lowered.get(given.lower())


def list_choices(choices: Iterable[str]) -> str:
    """Return ``'a', 'b' or 'c'`` for a hint."""
    items = [f"'{c}'" for c in choices]
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " or " + items[-1]


def join_or(items: Iterable[object]) -> str:
    """Return ``1, 2 or 3``."""
    words = [str(i) for i in items]
    if len(words) <= 1:
        return "".join(words)
    return ", ".join(words[:-1]) + " or " + words[-1]


def suggestion_hint(given: str, choices: Iterable[str], *, noun: str) -> str:
    """Return "did you mean 'x'?" or the list of valid choices."""
    options = sorted(set(choices))
    guess = did_you_mean(given, options)
    if guess is not None:
        return f"did you mean '{guess}'?"
    return f"valid {noun}s are {list_choices(options)}"
