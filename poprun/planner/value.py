"""
Conversions of written values (flag values, TOML strings, DSL words) into typed spec values.

Layer: ``poprun.planner``; standard library only. Each converter returns the value or
raises :class:`InvalidValueError`, which the front end turns into a diagnostic at its span.
The option table (:meth:`poprun.planner.option.Option.convert`) picks one per option kind.
"""

from __future__ import annotations

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
    import ipaddress  # here, not at the top: only a host name with ':' needs it (start-up stays lean)

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
    import ipaddress  # here, not at the top: see _is_ipv6

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


MAX_SECONDS = 8_640_000  # 100 days: no run, wait or limit of poprun's is longer
_SECONDS = re.compile(r"\+?(?:([0-9]+)(?:\.([0-9]*))?|\.([0-9]+))\Z")
_SECONDS_HINT = "write seconds as a number, such as 30 or 0.5 (to the millisecond)"


def to_millis(text: str) -> int:
    """
    Return a number of seconds (``30``, ``0.5``: decimals to the millisecond) in whole milliseconds.

    Refused: a negative number, more than 3 decimals that are not zeros, more than :data:`MAX_SECONDS`.
    """
    word = text.strip()
    found = _SECONDS.match(word)
    if found is None:
        if re.fullmatch(r"-[0-9.]+", word) and word != "-.":
            raise InvalidValueError(f"{word} is negative", "use a number of seconds, 0 or more")
        shown = word if len(word) <= 40 else word[:20] + "..."  # noqa: PLR2004
        raise InvalidValueError(f"'{shown}' is not a number of seconds", _SECONDS_HINT)
    whole, decimals = found.group(1) or "0", (found.group(2) or found.group(3) or "")
    if decimals.rstrip("0")[3:]:
        raise InvalidValueError(f"{word} is more precise than a millisecond",
                                "round it to at most 3 decimals, such as 0.125")
    millis = int(whole[-12:]) * 1000 + int((decimals + "000")[:3])
    if len(whole.lstrip("0")) > 12 or millis > MAX_SECONDS * 1000:  # noqa: PLR2004 - more than 100 days anyway
        shown = word if len(word) <= 40 else word[:20] + "..."  # noqa: PLR2004
        raise InvalidValueError(f"{shown} seconds is more than poprun waits (at most {MAX_SECONDS}, 100 days)",
                                f"use at most {MAX_SECONDS} seconds", code="PR216")
    return millis


def from_seconds_number(value: float) -> int:
    """Return a TOML number of seconds (an integer or a float) in whole milliseconds, as :func:`to_millis`."""
    if value < 0:
        raise InvalidValueError(f"{value!r} is negative", "use a number of seconds, 0 or more")
    if isinstance(value, int):
        return to_millis(str(value))
    text = format(value, "f") if value == value and abs(value) != float("inf") else str(value)  # noqa: PLR0124 - NaN
    try:
        return to_millis(text)
    except InvalidValueError as problem:  # say it as written (1e9), not as formatted (1000000000.000000)
        shown = repr(value)
        raise InvalidValueError(problem.detail.replace(text[:20], shown, 1).replace(text, shown), problem.hint,
                                code=problem.code) from None


def seconds_text(millis: int) -> str:
    """Return whole milliseconds as seconds, as :func:`to_millis` reads them back (``1500`` -> ``1.5``)."""
    whole, part = divmod(millis, 1000)
    return str(whole) if not part else f"{whole}.{part:03d}".rstrip("0")


def seconds_number(millis: int) -> int | float:
    """Return whole milliseconds as a TOML number of seconds: an integer when whole."""
    return millis // 1000 if millis % 1000 == 0 else millis / 1000


MAX_STATUS = 255
_STATUS_HINT = "write exit statuses from 0 to 255, comma-separated (such as 2,126,127), or none"


def to_statuses(text: str) -> tuple[int, ...]:
    """Return the exit statuses of a comma-separated list (``2,126,127``), sorted, once each; ``none`` is none."""
    words = [word.strip() for word in text.split(",")]
    if [w.lower() for w in words] == ["none"]:
        return ()
    if not any(words):
        raise InvalidValueError("no exit status given", _STATUS_HINT)
    found: set[int] = set()
    for word in words:
        if not _INTEGER.match(word):
            shown = word if len(word) <= 40 else word[:20] + "..."  # noqa: PLR2004
            raise InvalidValueError(f"'{shown}' is not an exit status" if word else f"'{text}' has an empty item",
                                    _STATUS_HINT)
        status = int(word)
        if not 0 <= status <= MAX_STATUS:
            raise InvalidValueError(f"{status} is not an exit status (they are 0 to 255)", _STATUS_HINT, code="PR222")
        found.add(status)
    return tuple(sorted(found))


def statuses_text(statuses: tuple[int, ...]) -> str:
    """Return exit statuses as :func:`to_statuses` reads them back (``none`` for none)."""
    return ",".join(map(str, statuses)) if statuses else "none"


MAX_SIGNAL = 64
_SIGNAL_HINT = "write SIGNAL@SECONDS, such as USR1@60 (send SIGUSR1 60 seconds before --timeout ends the run)"
_UNCATCHABLE = ("SIGKILL", "SIGSTOP")


def to_signal(text: str) -> tuple[int, int]:
    """
    Return ``(signal number, milliseconds)`` of ``SIG@SECONDS`` (``USR1@60``, ``SIGUSR1@60``, ``10@0.5``).

    The signal is a name (with or without ``SIG``, any case) or a number from 1 to 64; SIGKILL and
    SIGSTOP are refused (a program cannot catch them to checkpoint). The seconds are more than 0.
    """
    name, at, seconds = text.strip().rpartition("@")
    if not at or not name.strip():
        raise InvalidValueError(f"'{text}' is not SIGNAL@SECONDS", _SIGNAL_HINT)
    number = _signal_number(name.strip())
    millis = to_millis(seconds)
    if millis == 0:
        raise InvalidValueError(f"'{text}' sends the signal 0 seconds before the end: no time to act on it",
                                "give the program time, such as USR1@60")
    return number, millis


def _signal_number(name: str) -> int:
    import signal

    if _INTEGER.match(name):
        number = int(name)
        if not 1 <= number <= MAX_SIGNAL:
            raise InvalidValueError(f"{number} is not a signal number (1 to {MAX_SIGNAL})", _SIGNAL_HINT)
    else:
        word = name.upper() if name.upper().startswith("SIG") else "SIG" + name.upper()
        known = {n: int(s) for n, s in signal.Signals.__members__.items()}
        if word not in known:
            from poprun.core.hint import did_you_mean

            guess = did_you_mean(word.removeprefix("SIG"), tuple(n.removeprefix("SIG") for n in known))
            raise InvalidValueError(f"'{name}' is not a signal name",
                                    f"did you mean '{guess}'?" if guess else
                                    "use a name such as USR1, USR2, TERM or INT, or a number from 1 to 64")
        number = known[word]
    if number in (signal.SIGKILL, signal.SIGSTOP):
        raise InvalidValueError(f"{signal_name(number)} cannot be caught, so no program can act on it",
                                "use a signal a program can handle, such as USR1 or TERM")
    return number


def signal_name(number: int) -> str:
    """Return a signal's name without ``SIG`` (``USR1``), or its number when this system names none."""
    import signal

    try:
        return signal.Signals(number).name.removeprefix("SIG")
    except ValueError:
        return str(number)


def signal_text(value: tuple[int, int]) -> str:
    """Return ``(signal, milliseconds)`` as :func:`to_signal` reads it back (``USR1@60``)."""
    return f"{signal_name(value[0])}@{seconds_text(value[1])}"
