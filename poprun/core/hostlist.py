"""
Host ranges with Slurm hostlist semantics: expand, compress and sort host names.

Layer: ``poprun.core``; imports only the standard library.

``expand("pod[01-03],login")`` gives ``('pod01', 'pod02', 'pod03', 'login')``;
``compress`` turns host names back into a canonical host list; ``natural_key``
sorts ``pod2`` before ``pod10``. ``expand`` raises only :class:`HostlistError`,
which says where in the text the problem is and what to do about it.
"""

from __future__ import annotations

import itertools
import re
import string
from collections.abc import Iterable, Iterator

from poprun.core.record import positional_record

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from typing import TypeAlias

__all__ = ["MAX_HOSTS", "HostlistError", "NaturalKey", "compress", "expand", "natural_key"]

MAX_HOSTS: int = 100_000

_NAME_CHARS = frozenset(string.ascii_letters + string.digits + ".-_:")
_NAME_HINT = "host names may contain only letters, digits, '.', '-', '_' and ':'"
_MAX_DIGITS = 64
_PIECE = re.compile(r"([0-9]+)(?:-([0-9]+))?")
_CHUNK = re.compile(r"[0-9]+|[^0-9]+")
_LAST_NUMBER = re.compile(r"(.*?)([0-9]+)([^0-9]*)", re.DOTALL)

NaturalKey: TypeAlias = tuple[tuple[int, int, str, str], ...]


class HostlistError(ValueError):
    """
    A host list that cannot be expanded.

    Attributes:
        message: One line, without a trailing period.
        position: 0-based column in the text where the problem is.
        length: How many characters to underline, at least 1.
        hint: What to do about it.
    """

    def __init__(self, message: str, *, position: int, length: int = 1, hint: str) -> None:
        super().__init__(message)
        self.message = message
        self.position = position
        self.length = max(1, length)
        self.hint = hint


@positional_record
class _Range:
    """
    An inclusive range of host numbers, each written at least ``width`` digits wide.
    """

    lo: int
    hi: int
    width: int

    def render(self) -> Iterator[str]:
        """
        Yield the numbers as written in host names, ascending.
        """
        return (f"{n:0{self.width}d}" for n in range(self.lo, self.hi + 1))


_Segment: TypeAlias = str | tuple[_Range, ...]


def expand(text: str, *, limit: int = MAX_HOSTS) -> tuple[str, ...]:
    """
    Expand a host list such as 'pod[1-4]', 'pod[01-16]', 'pod[1-3,7]', 'r[1-2]n[1-2]', 'a,b,c[1-2]'.

    Hosts come in the order written, the leftmost range varying slowest; a
    repeated host is kept at its first place only.

    Raises:
        HostlistError: The list is malformed or would give more than ``limit`` hosts.
    """
    if not text.strip():
        raise HostlistError("empty host list", position=0, hint="give at least one host, e.g. pod1")
    items = [_parse_item(text, *_strip(text, start, end)) for start, end in _split_items(text)]
    total = 0
    for (start, end), segments in items:
        if segments and isinstance(segments[0], str) and segments[0].startswith("-"):
            raise HostlistError("a host name cannot start with '-'", position=start, length=1,
                                hint="a name starting with '-' would be read as an option by ssh and mpirun; "
                                     "check the host list")
        total += _count(segments, limit - total)
        if total > limit:
            raise HostlistError(
                f"host list expands to more than {limit} hosts", position=start,
                length=end - start, hint="split the list or use smaller ranges")
    hosts = itertools.chain.from_iterable(_render(segments) for _, segments in items)
    return tuple(dict.fromkeys(hosts))


def compress(hosts: Iterable[str]) -> str:
    """
    Compress host names back into a host list, e.g. ['pod1','pod2','pod3','pod7'] -> 'pod[1-3,7]'.

    The result is canonical: hosts are deduplicated and sorted by
    :func:`natural_key`, and hosts next to each other in that order that differ
    only in their last number share one range, so
    ``expand(compress(hosts)) == tuple(sorted(set(hosts), key=natural_key))``.

    Raises:
        HostlistError: A host name is empty, starts with '-' or has a character not allowed in host names.
        TypeError: ``hosts`` is a single string rather than an iterable of names.
    """
    if isinstance(hosts, str):
        raise TypeError("compress() takes an iterable of host names, not a str")
    ordered = sorted(set(hosts), key=natural_key)
    for host in ordered:
        _check_name(host)
        if host.startswith("-"):
            raise HostlistError("a host name cannot start with '-'", position=0, length=1, hint=_NAME_HINT)
    return ",".join(_format_group(*group) for group in _group(ordered))


def natural_key(host: str) -> NaturalKey:
    """
    Return a sort key that orders numbers by value: 'pod2' sorts before 'pod10'.

    The key is defined for every string and distinct strings get distinct keys,
    so sorting with it never raises and never depends on the input order.
    """
    return tuple(_chunk_key(chunk) for chunk in _CHUNK.findall(host))


def _chunk_key(chunk: str) -> tuple[int, int, str, str]:
    """
    Key one run of digits (by value, then by padding) or one run of other characters.
    """
    if "0" <= chunk[0] <= "9":
        value = chunk.lstrip("0")
        return (0, len(value), value, chunk)
    return (1, 0, chunk, "")


def _split_items(text: str) -> list[tuple[int, int]]:
    """
    Return the (start, end) of each top-level item, checking that brackets pair up.
    """
    spans: list[tuple[int, int]] = []
    start, opened = 0, -1
    for i, char in enumerate(text):
        opened = _track_bracket(opened, i, char)
        if char == "," and opened < 0:
            spans.append((start, i))
            start = i + 1
    if opened >= 0:
        raise HostlistError("unclosed host range", position=opened,
                            hint="add ']' to close the range")
    return [*spans, (start, len(text))]


def _track_bracket(opened: int, position: int, char: str) -> int:
    """
    Return where the open range starts after reading ``char`` (-1 when none is open).
    """
    if char == "[" and opened >= 0:
        raise HostlistError("nested brackets in host range", position=position,
                            hint="close the range with ']' before opening another")
    if char == "]" and opened < 0:
        raise HostlistError("unexpected ']'", position=position,
                            hint="remove it or add the '[' it closes")
    return position if char == "[" else -1 if char == "]" else opened


def _strip(text: str, start: int, end: int) -> tuple[int, int]:
    """
    Narrow the span of an item to exclude surrounding whitespace; a blank item becomes empty.
    """
    item = text[start:end]
    if not item.strip():
        return start, start
    return start + len(item) - len(item.lstrip()), start + len(item.rstrip())


def _parse_item(text: str, start: int, end: int) -> tuple[tuple[int, int], list[_Segment]]:
    """
    Split one item into literal text and bracketed ranges, keeping its span.
    """
    if start == end:
        raise HostlistError("empty item in host list", position=start, hint="remove the extra ','")
    segments: list[_Segment] = []
    i = start
    while i < end:
        stop = text.find("[", i, end)
        stop = end if stop < 0 else stop
        if stop == i:
            stop = text.index("]", i) + 1
            name = segments[-1] if segments and isinstance(segments[-1], str) else ""
            segments.append(_parse_ranges(text, i, stop - 1, name=name))
        else:
            segments.append(_check_name(text[i:stop], offset=i))
        i = stop
    return (start, end), segments


def _parse_ranges(text: str, opened: int, closed: int, *, name: str) -> tuple[_Range, ...]:
    """
    Parse the comma-separated pieces between the brackets at ``opened`` and ``closed``.
    """
    if closed == opened + 1:
        raise HostlistError("empty host range", position=opened, length=2,
                            hint="put numbers between the brackets, e.g. pod[1-4]")
    ranges: list[_Range] = []
    position = opened + 1
    for piece in text[opened + 1 : closed].split(","):
        ranges.append(_parse_piece(piece, position, name))
        position += len(piece) + 1
    return tuple(ranges)


def _parse_piece(piece: str, position: int, name: str) -> _Range:
    """
    Parse one range piece: a number such as '7' or '007', or 'lo-hi' such as '01-16'.
    """
    match = _PIECE.fullmatch(piece)
    if match is None:
        message = f"invalid host range piece {piece!r}" if piece else "empty piece in host range"
        raise HostlistError(message, position=position, length=len(piece),
                            hint="a range piece is a number or lo-hi, e.g. 7, 1-4 or 01-16")
    lo_text, hi_text = match.group(1), match.group(2) or match.group(1)
    if max(len(lo_text), len(hi_text)) > _MAX_DIGITS:
        raise HostlistError("number in host range is too long", position=position,
                            length=len(piece), hint=f"use at most {_MAX_DIGITS} digits")
    lo, hi = int(lo_text), int(hi_text)
    if hi < lo:
        raise HostlistError(f"reversed host range {piece!r}", position=position, length=len(piece),
                            hint=f"write {name}[{hi_text}-{lo_text}]")
    return _Range(lo, hi, len(lo_text))


def _check_name(name: str, *, offset: int = 0) -> str:
    """
    Return ``name`` if every character is allowed in a host name; ``offset`` places errors.
    """
    if not name:
        raise HostlistError("empty host name", position=offset, hint="remove the empty name")
    for i, char in enumerate(name):
        if char not in _NAME_CHARS:
            raise HostlistError(f"invalid character {char!r} in host name", position=offset + i,
                                hint=_NAME_HINT)
    return name


def _count(segments: list[_Segment], budget: int) -> int:
    """
    Count the hosts an item gives, stopping early once the count passes ``budget``.
    """
    count = 1
    for segment in segments:
        if not isinstance(segment, str):
            count *= sum(r.hi - r.lo + 1 for r in segment)
            if count > budget:
                break
    return count


def _render(segments: list[_Segment]) -> Iterator[str]:
    """
    Yield the hosts of one item: the cartesian product, leftmost segment slowest.
    """
    choices = [[s] if isinstance(s, str) else [n for r in s for n in r.render()] for s in segments]
    return ("".join(parts) for parts in itertools.product(*choices))


def _group(ordered: list[str]) -> list[tuple[str, list[str], str]]:
    """
    Group neighbouring hosts that differ only in their last number: (prefix, numbers, suffix).
    """
    groups: list[tuple[str, list[str], str]] = []
    for host in ordered:
        match = _LAST_NUMBER.fullmatch(host)
        if match is None or len(match.group(2)) > _MAX_DIGITS:
            groups.append((host, [], ""))
            continue
        prefix, number, suffix = match.groups()
        if groups and groups[-1][1] and groups[-1][0::2] == (prefix, suffix):
            groups[-1][1].append(number)
        else:
            groups.append((prefix, [number], suffix))
    return groups


def _format_group(prefix: str, numbers: list[str], suffix: str) -> str:
    """
    Write a group as 'prefix[runs]suffix', or as a plain name when it holds one number or none.
    """
    if len(numbers) <= 1:
        return prefix + "".join(numbers) + suffix
    runs: list[list[str]] = []
    for number in numbers:
        if runs and number == f"{int(runs[-1][1]) + 1:0{len(runs[-1][0])}d}":
            runs[-1][1] = number
        else:
            runs.append([number, number])
    pieces = (lo if lo == hi else f"{lo}-{hi}" for lo, hi in runs)
    return f"{prefix}[{','.join(pieces)}]{suffix}"
