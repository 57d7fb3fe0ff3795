"""
Stdin through a launcher backend (mpirun, slurm), checked as from a shell: a file, a pipe, /dev/null, closed, a terminal.

Each case runs the real CLI with a program whose instance 0 prints the SHA-256 and size of
what it reads, and whose other instances print how many bytes they read: only instance 0 may
get poprun's stdin, the others read nothing and never block.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

# Instance 0: "0 SHA256 SIZE"; the others: "N - SIZE" (what they read: nothing).
READER = ('if [ "$POPDIST_INSTANCE_INDEX" = 0 ]; then f=$(mktemp); cat > "$f"; '
          'echo "0 $(sha256sum < "$f" | cut -d" " -f1) $(wc -c < "$f")"; rm -f "$f"; '
          'else echo "$POPDIST_INSTANCE_INDEX - $(wc -c)"; fi')
EMPTY = hashlib.sha256(b"").hexdigest()
BIG = 10 << 20  # 10 MiB: far more than a pipe holds (64 KiB)


def big_input(path: Path) -> bytes:
    """Write 10 MiB of varied bytes (every byte value, no line structure) to ``path``; return them."""
    data = (bytes(range(256)) * 41 + os.urandom(1 << 16)) * (BIG // (256 * 41 + (1 << 16)) + 1)
    data = data[:BIG]
    path.write_bytes(data)
    return data


def expected(data: bytes, instances: int) -> list[str]:
    """Return the lines the READER program prints when instance 0 reads ``data``."""
    return [f"0 {hashlib.sha256(data).hexdigest()} {len(data)}"] + [f"{i} - 0" for i in range(1, instances)]


def lines(stdout: bytes) -> list[str]:
    """Return the instances' lines, in instance order."""
    return sorted(stdout.decode().splitlines(), key=lambda line: int(line.split()[0]))


def run_with_file(argv: Sequence[str], source: Path, *, cwd: Path, timeout: float,
                  env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    """Run ``argv`` with ``< source``."""
    with source.open("rb") as stdin:
        return subprocess.run(list(argv), stdin=stdin, capture_output=True, check=False, cwd=cwd, timeout=timeout,
                              env=env)


def run_with_pipe(argv: Sequence[str], data: bytes, *, cwd: Path, timeout: float,
                  env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    """Run ``argv`` with ``data`` written into a pipe as its stdin (as ``producer | poprun``)."""
    return subprocess.run(list(argv), input=data, capture_output=True, check=False, cwd=cwd, timeout=timeout, env=env)


def run_with_terminal(argv: Sequence[str], *, cwd: Path, timeout: float,
                      env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    """Run ``argv`` with a pseudo-terminal as its stdin (nobody types: a launcher that reads it would hang)."""
    leader, follower = os.openpty()
    try:
        return subprocess.run(list(argv), stdin=follower, capture_output=True, check=False, cwd=cwd, timeout=timeout,
                              env=env)
    finally:
        os.close(leader)
        os.close(follower)


def run_with_closed_stdin(argv: Sequence[str], *, cwd: Path, timeout: float,
                          env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    """Run ``argv`` with its stdin closed (``<&-``)."""
    return subprocess.run(["sh", "-c", f"exec {shlex.join(argv)} <&-"], capture_output=True, check=False, cwd=cwd,
                          timeout=timeout, env=env)
