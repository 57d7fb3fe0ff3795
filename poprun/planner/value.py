"""
Conversions of written values (flag values, TOML strings, DSL words) into typed spec values.

Layer: ``poprun.planner``; standard library only. Each converter returns the value or
raises :class:`InvalidValueError`, which the front end turns into a diagnostic at its span.
The option table (:meth:`poprun.planner.option.Option.convert`) picks one per option kind.
"""

from __future__ import annotations

import ipaddress
import re
import shlex

TRUE_WORDS = ("yes", "1", "true", "on")
FALSE_WORDS = ("no", "0", "false", "off")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_INTEGER = re.compile(r"[+-]?[0-9]{1,18}\Z")  # ASCII digits only: no 1_000, no other scripts' digits
_LONG_INTEGER = re.compile(r"[+-]?[0-9]{19,}\Z")
_HOST_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_:")


class InvalidValueError(ValueError):
    """A written value that does not convert; ``detail`` and ``hint`` go into the diagnostic."""

    def __init__(self, detail: str, hint: str, *, code: str = "PR105") -> None:
        super().__init__(detail)
        self.detail = detail
        self.hint = hint
        self.code = code


def to_bool(text: str) -> bool:
    """Return the boolean of ``yes/no/1/0/true/false/on/off`` (any case)."""
    word = text.strip().lower()
    if word in TRUE_WORDS:
        return True
    if word in FALSE_WORDS:
        return False
    raise InvalidValueError(f"'{text}' is not a yes/no value", "use yes or no (also 1/0, true/false, on/off)")


def to_positive_int(text: str) -> int:
    """Return a whole number of at least 1."""
    number = to_int(text)
    if number < 1:
        raise InvalidValueError(f"{number} is not a positive number", "use a whole number of at least 1",
                           code="PR200")
    return number


def to_int(text: str) -> int:
    """Return a whole number (negative allowed)."""
    if _LONG_INTEGER.match(text.strip()):
        shown = text.strip() if len(text.strip()) <= 40 else text.strip()[:20] + "..."  # noqa: PLR2004
        raise InvalidValueError(f"{shown} is too large (more than 18 digits)",
                                "use a number no Pod system exceeds, such as 64", code="PR216")
    if not _INTEGER.match(text.strip()):
        raise InvalidValueError(f"'{text}' is not a whole number", "use a whole number such as 4")
    return int(text.strip())


def to_server_host(text: str) -> str:
    """
    Return the V-IPU server's host: a host name, an IPv4 address, or an IPv6 address (bare or in brackets).

    Brackets must be balanced (``[::1``, ``::1]`` are refused), and a name cannot start with ``-``.
    """
    hint = "write a host name such as vipu.my_domain, or an address such as 10.1.2.3 or [::1]"
    if text.startswith("[") or text.endswith("]"):
        if not (text.startswith("[") and text.endswith("]")) or text.count("[") != 1 or text.count("]") != 1:
            raise InvalidValueError(f"'{text}' has an unbalanced bracket", hint)
        inner = text[1:-1]
        if not _is_ipv6(inner):
            raise InvalidValueError(f"'{inner}' in brackets is not an IPv6 address", hint)
        return inner
    if not text or text.startswith("-") or not set(text) <= _HOST_CHARS:
        bad = next((c for c in text if c not in _HOST_CHARS), "-" if text else "")
        why = "is empty" if not text else f"has the character {bad!r}, not allowed in a host name"
        raise InvalidValueError(f"'{text}' {why}" if text else f"the host {why}", hint)
    if ":" in text and not _is_ipv6(text):
        raise InvalidValueError(f"'{text}' is not a host name or an IPv6 address (a port is given apart)", hint)
    return text


def _is_ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def to_port(text: str) -> int:
    """Return a TCP port number."""
    port = to_int(text)
    if not 1 <= port <= 65535:  # noqa: PLR2004 - the TCP port range
        raise InvalidValueError(f"{port} is not a port number", "use a port between 1 and 65535",
                           code="PR212")
    return port


def to_subnet(text: str) -> str:
    """Return a CIDR subnet such as ``10.5.0.0/16``."""
    try:
        return str(ipaddress.ip_network(text.strip(), strict=False))
    except ValueError:
        raise InvalidValueError(f"'{text}' is not a subnet", "write it as an address and prefix, e.g. 10.5.0.0/16",
                           code="PR213") from None


def to_choice(text: str, choices: tuple[str, ...]) -> str:
    """Return ``text`` when it is one of ``choices`` (case-insensitive), in its canonical case."""
    for choice in choices:
        if choice.lower() == text.strip().lower():
            return choice
    from poprun.core.hint import suggestion_hint

    raise InvalidValueError(f"'{text}' is not one of the choices", suggestion_hint(text, choices, noun="value"))


_PLUGIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def to_backend(text: str, builtins: tuple[str, ...]) -> str:
    """
    Return a backend name: one of ``builtins`` (case-insensitive, in its canonical case) or a plugin's.

    A plugin's name (an entry point of the ``poprun.backends`` group) is kept as written; whether
    such a backend is installed is known only where backends are (the command line checks it).
    """
    if any(b.lower() == text.strip().lower() for b in builtins):
        return to_choice(text, builtins)
    if _PLUGIN_NAME.fullmatch(text):
        return text
    from poprun.core.hint import list_choices

    raise InvalidValueError(f"'{text}' is not a backend name",
                            f"use {list_choices(builtins)}, or the name of an installed backend plugin")


def to_args(text: str) -> tuple[str, ...]:
    """Split a shell-quoted argument string (``--mpi-local-args="-x A -x B='c d'"``)."""
    try:
        return tuple(shlex.split(text))
    except ValueError:
        raise InvalidValueError(f"unbalanced quotes in {text!r}", "close the quote, or quote the whole value once",
                           code="PR107") from None


def to_names(text: str) -> tuple[str, ...]:
    """Return the variable names of a comma-separated list (``TOKEN_A,MY_PASS``; spaces around names allowed)."""
    names = tuple(word.strip() for word in text.split(",") if word.strip())
    if not names:
        raise InvalidValueError("no variable name given", "write one or more names: --mask MY_TOKEN,DB_PASS")
    for name in names:
        if not _ENV_NAME.match(name):
            raise InvalidValueError(f"'{name}' is not an environment variable name",
                                    "use letters, digits and underscores, not starting with a digit")
    return names


def to_env_assignment(text: str) -> tuple[str, str | None]:
    """Return ``(NAME, VALUE)`` for ``NAME=VALUE`` and ``(NAME, None)`` for a bare name."""
    name, eq, value = text.partition("=")
    if not _ENV_NAME.match(name):
        raise InvalidValueError(f"'{name}' is not an environment variable name",
                           "use letters, digits and underscores, not starting with a digit")
    return name, (value if eq else None)
