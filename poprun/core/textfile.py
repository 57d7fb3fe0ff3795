"""
Reading the user's files with bounds: specs, saved plans, host files, imported configurations.

Layer: ``poprun.core``; the standard library only.

Every file poprun reads on the user's word goes through :func:`read_text_file`, so that none
can make it grow memory without end or block: a file that is not a regular file (``/dev/zero``,
a FIFO, a directory, a terminal) is refused before it is read (it is opened without blocking,
then checked), a file larger than :data:`MAX_BYTES` is refused without reading more than that,
and text that is not UTF-8, or holds a NUL character, is refused naming its line. A UTF-8
byte-order mark, as some editors write, is read past; UTF-16 and UTF-32 text (with a byte-order
mark, or ASCII text with every other byte NUL) is refused naming its encoding.
"""

from __future__ import annotations

import os
import stat

from poprun.core.diagnostic import DiagnosticError, error
from poprun.core.span import SourceSpan

MAX_BYTES = 4 * 1024 * 1024  # 4 MiB: a spec, plan or host file of a 100,000-host Pod fits many times over
_CHUNK = 1 << 16
_UTF8_BOM = b"\xef\xbb\xbf"
# Byte-order marks of the encodings an editor may save in instead of UTF-8 (UTF-32 first: its
# little-endian mark starts with UTF-16's).
_WIDE_BOMS = ((b"\xff\xfe\x00\x00", "UTF-32"), (b"\x00\x00\xfe\xff", "UTF-32"), (b"\xff\xfe", "UTF-16"),
              (b"\xfe\xff", "UTF-16"))

# Never wait on what is there: a FIFO opens at once (and is then refused as not a regular file), a terminal is not taken.
READ_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)


def read_text_file(path: str, *, key: str, span: SourceSpan | None = None, name: str | None = None,
                   limit: int = MAX_BYTES) -> str:
    """
    Return the UTF-8 text of the regular file ``path``, at most ``limit`` bytes.

    ``key`` names what the file is for (``SPEC``, ``--host-file``, ``PLAN``) in the diagnostics'
    spans; ``span``, when given, is where the user named the file (the diagnostics point there
    when the file itself cannot be read); ``name`` is how messages name the file (the path
    as the user wrote it), ``path`` by default.

    Diagnostics:
        PR113 when the file cannot be opened (missing, no permission); PR116 when it is not a
        regular file; PR117 when it is larger than ``limit``; PR118 when it is not UTF-8 text
        or holds a NUL character (naming the line).
    """
    where = span or SourceSpan(file=path, key_path=key)
    shown = name or path
    try:
        fd = os.open(path, READ_FLAGS)
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the name
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise DiagnosticError([error("PR113", f"cannot read '{shown}'", detail=reason, span=where,
                                     hint="check the path and its permissions")]) from exc
    try:
        data = _read_regular(fd, shown, where, limit)
    finally:
        os.close(fd)
    return _decode(data, path, key)


def _read_regular(fd: int, path: str, where: SourceSpan, limit: int) -> bytes:
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise DiagnosticError([error("PR116", f"'{path}' is not a regular file",
                                     detail=f"'{path}' is {_kind(info.st_mode)}; poprun reads only regular files",
                                     span=where, hint="name a regular file (copy what you meant into one)")])
    if info.st_size > limit:
        raise _too_large(path, where, limit)
    chunks: list[bytes] = []
    size = 0
    while True:
        try:
            chunk = os.read(fd, min(_CHUNK, limit + 1 - size))
        except OSError as exc:
            raise DiagnosticError([error("PR113", f"cannot read '{path}'", detail=exc.strerror or str(exc),
                                         span=where, hint="check the path and its permissions")]) from exc
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > limit:  # it grew while being read
            raise _too_large(path, where, limit)


def _too_large(path: str, where: SourceSpan, limit: int) -> DiagnosticError:
    return DiagnosticError([error("PR117", f"'{path}' is too large",
                                  detail=f"poprun reads files of at most {limit // (1024 * 1024)} MiB "
                                         f"({limit} bytes)",
                                  span=where, hint="name the file you meant; specs, plans and host files are small")])


def _kind(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def _wide_encoding(data: bytes) -> tuple[str, str] | None:
    """Return ("UTF-16" or "UTF-32", how it shows) when ``data`` is text in that encoding, else None."""
    for mark, name in _WIDE_BOMS:
        if data.startswith(mark):
            return name, f"it starts with a {name} byte-order mark"
    found = _wide_by_nuls(data[:256]) if 0 in data[:256] else None
    return (found, "NUL bytes stand between its characters") if found else None


def _wide_by_nuls(head: bytes) -> str | None:
    """Return the encoding of ASCII text in UTF-32 or UTF-16 without a mark: NUL bytes around each character."""
    for width, name in ((4, "UTF-32"), (2, "UTF-16")):
        whole = len(head) - len(head) % width
        for at in (0, width - 1):  # the character's byte: little-endian first, big-endian last
            if whole >= 2 * width and all(head[i] for i in range(at, whole, width)) \
                    and not any(head[i] for i in range(whole) if i % width != at):
                return name
    return None


def _decode(data: bytes, path: str, key: str) -> str:
    wide = _wide_encoding(data)
    if wide:
        import shlex

        name, how = wide
        span = SourceSpan(file=path, key_path=key, line=1, column=1, end_line=1, end_column=2)
        raise DiagnosticError([error("PR118", f"'{path}' is {name} text, not UTF-8",
                                     detail=f"{how}; poprun reads UTF-8 text only", span=span,
                                     hint=f"save the file as UTF-8 text (iconv -f {name} -t UTF-8 {shlex.quote(path)})")])
    data = data.removeprefix(_UTF8_BOM)  # as some editors write it
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise _not_text(path, key, line, column, detail=f"byte 0x{data[exc.start]:02x} on line {line} is not UTF-8",
                        hint="save the file as UTF-8 text") from exc
    nul = text.find("\0")
    if nul >= 0:
        line = text.count("\n", 0, nul) + 1
        column = nul - (text.rfind("\n", 0, nul) + 1) + 1
        raise _not_text(path, key, line, column, detail=f"line {line} holds a NUL character",
                        hint="remove the NUL character; poprun's files are plain text")
    return text


def _not_text(path: str, key: str, line: int, column: int, *, detail: str, hint: str) -> DiagnosticError:
    span = SourceSpan(file=path, key_path=key, line=line, column=column, end_line=line, end_column=column + 1)
    return DiagnosticError([error("PR118", f"'{path}' is not UTF-8 text", detail=detail, span=span, hint=hint)])
