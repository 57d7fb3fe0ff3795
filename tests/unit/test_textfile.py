"""Every input file is read with bounds: regular files only, at most 4 MiB, UTF-8 text without NUL."""

import os
import threading

import pytest

from poprun.core.diagnostic import DiagnosticError
from poprun.core.textfile import MAX_BYTES, read_text_file


def _code(path, **kw):
    with pytest.raises(DiagnosticError) as caught:
        read_text_file(str(path), key="SPEC", **kw)
    return caught.value.diagnostics[0]


def test_dev_zero_is_refused_as_a_device():
    """/dev/zero is not read at all: PR116."""
    assert ("PR116", "'/dev/zero' is a character device; poprun reads only regular files") == (
        _code("/dev/zero").code, _code("/dev/zero").detail)


def test_fifo_without_writer_is_refused_without_blocking(tmp_path):
    """A FIFO nobody writes is refused at once (opened without blocking), not waited on."""
    fifo = tmp_path / "spec.toml"
    os.mkfifo(fifo)
    found = []
    reader = threading.Thread(target=lambda: found.append(_code(fifo).code), daemon=True)
    reader.start()
    reader.join(30)

    assert ["PR116"] == found


def test_directory_is_refused(tmp_path):
    """A directory is not a spec: PR116."""
    assert "PR116" == _code(tmp_path).code


def test_file_over_the_limit_is_refused_without_reading_it(tmp_path):
    """A sparse file of 1 GiB is refused by its size: PR117, naming the limit."""
    big = tmp_path / "big.toml"
    with big.open("wb") as f:
        f.truncate(1 << 30)

    diagnostic = _code(big)

    assert ("PR117", f"poprun reads files of at most 4 MiB ({MAX_BYTES} bytes)") == (diagnostic.code, diagnostic.detail)


def test_invalid_utf8_names_its_line_and_column(tmp_path):
    """A Latin-1 byte on line 3 is PR118 at line 3."""
    path = tmp_path / "train.pop"
    path.write_bytes(b"hosts a\n\nrun caf\xe9\n")

    diagnostic = _code(path)

    assert ("PR118", 3, 8) == (diagnostic.code, diagnostic.span.line, diagnostic.span.column)


def test_nul_character_names_its_line(tmp_path):
    """A NUL byte is PR118 at its line."""
    path = tmp_path / "hosts.txt"
    path.write_bytes(b"pod1\npod\x002\n")

    assert ("PR118", 2) == (_code(path).code, _code(path).span.line)


def test_missing_file_is_pr113_named_as_given(tmp_path):
    """A missing file is PR113, named as the user wrote it."""
    diagnostic = _code(tmp_path / "nope", name="nope")

    assert ("PR113", "cannot read 'nope'") == (diagnostic.code, diagnostic.summary)


def test_regular_file_is_read(tmp_path):
    """A small UTF-8 file is returned whole."""
    path = tmp_path / "a.toml"
    path.write_text("[topology]\nreplicas = 2 # é\n", encoding="utf-8")

    assert "[topology]\nreplicas = 2 # é\n" == read_text_file(str(path), key="SPEC")


def test_a_utf8_byte_order_mark_is_read_past(tmp_path):
    """An editor's UTF-8 byte-order mark is not part of the text."""
    path = tmp_path / "train.pop"
    path.write_bytes(b"\xef\xbb\xbfhosts a\n")

    assert "hosts a\n" == read_text_file(str(path), key="SPEC")


def test_ascii_text_in_utf16_without_a_mark_is_named_utf16(tmp_path):
    """UTF-16 text without a byte-order mark is recognised by its NUL bytes, not reported as a NUL on line 1."""
    path = tmp_path / "train.pop"
    path.write_bytes("hosts a\nrun x\n".encode("utf-16-le"))

    diagnostic = _code(path)

    assert ("PR118", "'" + str(path) + "' is UTF-16 text, not UTF-8") == (diagnostic.code, diagnostic.summary)
