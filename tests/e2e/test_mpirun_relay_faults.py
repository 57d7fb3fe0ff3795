"""
The mpirun backend's output relay under faults: a connection reset, a peer that talks garbage, a stranger.

(Before: when an instance's relay connection was reset, ``ss -K`` or a firewall flush, the rest
of its output was lost silently, exit 0.) Each wrapper numbers its bytes; poprun acknowledges
them, and a wrapper whose connection breaks connects again and sends on from where poprun has
them: every line arrives exactly once. A line lost for good is PR414, naming the instance.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.golden.harness import assert_golden

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120),
              pytest.mark.skipif(shutil.which("mpirun") is None or shutil.which("ss") is None,
                                 reason="mpirun or ss is not on PATH")]

PY = sys.executable
GOLDEN = Path(__file__).parent / "runs_golden"
# Prints 25 numbered lines on stdout and stderr, waits for the file "go", then 25 more.
PROGRAM = ("import os, sys, time\n"
           "i = os.environ['POPDIST_INSTANCE_INDEX']\n"
           "def say(n):\n"
           "    print(f'out {i} {n}', flush=True); print(f'err {i} {n}', file=sys.stderr, flush=True)\n"
           "for n in range(25): say(n)\n"
           "while not os.path.exists('go'): time.sleep(0.02)\n"
           "for n in range(25, 50): say(n); time.sleep(0.01)\n")


class Running:
    """A poprun run in the background, its stdout and stderr read as they come."""

    def __init__(self, *args: str, cwd: Path, runs: list[Running], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen([PY, "-m", "poprun.cli.main", "--backend", "mpirun", *args], cwd=cwd,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     env=os.environ | {"POPRUN_RUNS_DIR": str(cwd / "runs")} | (env or {}))
        self.out, self.err = bytearray(), bytearray()
        self._readers = [threading.Thread(target=self._read, args=(pipe, into), daemon=True)
                         for pipe, into in ((self.proc.stdout, self.out), (self.proc.stderr, self.err))]
        for reader in self._readers:
            reader.start()
        runs.append(self)

    @staticmethod
    def _read(pipe: object, into: bytearray) -> None:
        while chunk := os.read(pipe.fileno(), 65536):  # type: ignore[attr-defined]
            into += chunk

    def wait_for(self, what: bytes, count: int, within_s: float = 60) -> None:
        deadline = time.monotonic() + within_s
        while (self.out + self.err).count(what) < count:
            assert time.monotonic() < deadline and self.proc.poll() is None, bytes(self.err[-2000:])
            time.sleep(0.02)

    def relay_port(self) -> int:
        """Return the port poprun's relay listens on (its one listening TCP socket)."""
        listing = subprocess.run(["ss", "-Htlnp"], capture_output=True, text=True, check=True).stdout
        (port,) = {int(m[1]) for line in listing.splitlines() if f"pid={self.proc.pid}," in line
                   for m in [re.search(r":(\d+)\s", line)] if m}
        return port

    def finish(self) -> int:
        status = self.proc.wait(timeout=90)
        for reader in self._readers:
            reader.join(timeout=10)
        for pipe in (self.proc.stdout, self.proc.stderr):
            pipe.close()  # type: ignore[union-attr]
        return status


@pytest.fixture
def started() -> Iterator[list[Running]]:
    """Keep the runs a test starts; kill what is left of them at its end, whatever happened."""
    runs: list[Running] = []
    yield runs
    for run in runs:
        if run.proc.poll() is None:
            run.proc.send_signal(signal.SIGTERM)
            run.finish()


def expected(count: int) -> tuple[list[bytes], list[bytes]]:
    return ([b"out %d %d" % (i, n) for i in range(count) for n in range(50)],
            [b"err %d %d" % (i, n) for i in range(count) for n in range(50)])


@pytest.mark.parametrize("side", ["dport", "sport"])
def test_a_reset_relay_connection_loses_no_line_and_repeats_none(tmp_path: Path, side: str, started: list[Running]) -> None:
    """ss -K of every relay connection (the wrappers' end, or poprun's) mid-run: all 2 x 50 lines of each instance, once."""
    run = Running("--num-instances=2", "--num-replicas=2", PY, "-c", PROGRAM, cwd=tmp_path, runs=started)
    run.wait_for(b"out 1 24", 1)
    run.wait_for(b"out 0 24", 1)
    port = run.relay_port()

    subprocess.run(["ss", "-K", "dst" if side == "dport" else "src", "127.0.0.1", side, "=", f":{port}"],
                   capture_output=True, check=True)
    (tmp_path / "go").touch()
    status = run.finish()

    out, err = expected(2)
    assert 0 == status, bytes(run.err[-3000:])
    assert sorted(out) == sorted(run.out.splitlines())
    assert sorted(err) == sorted(line for line in run.err.splitlines() if line.startswith(b"err "))


def relay_processes(index: int) -> list[int]:
    """Return the pids of instance ``index``'s relay processes (the wrapper's grandchild, in a session of its own)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes().split(b"\0")
            session = os.getsid(int(entry.name))
        except OSError:
            continue
        if b"def relay(outs" in command and f"POPDIST_INSTANCE_INDEX={index}".encode() in environ \
                and session == int(entry.name):
            found.append(int(entry.name))
    return found


def relay_token(run: Running) -> tuple[int, str]:
    """Return the relay's port and token, as mpirun's environment holds them (what a wrapper is given)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                for item in (entry / "environ").read_bytes().split(b"\0"):
                    if item.startswith(b"POPRUN_OUTPUT_RELAY=") and f"{run.proc.pid}" in \
                            (entry / "status").read_text().split("PPid:")[1].split()[0]:
                        port, _, token = item.split(b"=", 1)[1].decode().partition(":")
                        return int(port), token
    raise AssertionError("no mpirun with the relay's variable")


def test_output_lost_for_good_is_pr414_naming_the_instance(tmp_path: Path, started: list[Running]) -> None:
    """Instance 0's relay process killed mid-run: its connection never comes back: PR414 names instance 0, exit 125."""
    run = Running("--num-instances=2", "--num-replicas=2", PY, "-c", PROGRAM, cwd=tmp_path, runs=started,
                  env={"POPRUN_HOST_TIMEOUT": "3"})  # its relay would try again for 5 s
    run.wait_for(b"out 0 24", 1)
    run.wait_for(b"err 0 24", 1)
    relays = relay_processes(0)
    assert relays

    for pid in relays:
        os.kill(pid, signal.SIGKILL)
    (tmp_path / "go").touch()
    status = run.finish()

    assert 125 == status, bytes(run.err[-3000:])
    text = run.err.decode(errors="replace")
    found = text[text.index("error[PR414]"):]
    assert_golden(GOLDEN / "PR414_an_instances_relay_killed_mid_run", f"{found}exit {status}\n")
    assert "output of instance 1" not in text
    out, _ = expected(2)
    assert [line for line in out if line.startswith(b"out 1 ")] == [x for x in run.out.splitlines()
                                                                    if x.startswith(b"out 1 ")]


def test_strangers_and_a_peer_sending_an_oversized_frame_lose_no_line(tmp_path: Path,
                                                                    started: list[Running]) -> None:
    """Strangers (no greeting, a wrong token, 300 at once) and a peer with the token sending a 4 GiB frame: every line once; PR415 warns."""
    run = Running("--num-instances=2", "--num-replicas=2", PY, "-c", PROGRAM, cwd=tmp_path, runs=started)
    run.wait_for(b"out 1 24", 1)
    run.wait_for(b"out 0 24", 1)
    port, token = relay_token(run)

    strangers = [socket.create_connection(("127.0.0.1", port)) for _ in range(300)]
    strangers[0].sendall(b"0" * 32 + b" 0 stdout\n")
    strangers[1].sendall(b"GET / HTTP/1.0\r\n\r\n" + b"x" * 1000)
    hostile = socket.create_connection(("127.0.0.1", port))
    hostile.sendall(f"{token} 0 stdout\n".encode())
    with contextlib.suppress(ConnectionResetError, BrokenPipeError):  # the real wrapper may take its stream back first
        hostile.recv(9)  # b"k" and what poprun has (tests/unit/test_mpirelay.py checks the answer)
        hostile.sendall(b"\xff\xff\xff\xff" + b"junk" * 100)
    (tmp_path / "go").touch()
    status = run.finish()
    for sock in [*strangers, hostile]:
        sock.close()

    out, err = expected(2)
    assert 0 == status, bytes(run.err[-3000:])
    assert sorted(out) == sorted(run.out.splitlines())
    assert sorted(err) == sorted(line for line in run.err.splitlines() if line.startswith(b"err "))
    text = run.err.decode(errors="replace")
    assert "warning[PR415]" in text, text[-3000:]
    found = text[text.index("warning[PR415]"):].split("\n\n")[0]
    assert_golden(GOLDEN / "PR415_strangers_connect_to_the_output_relay", f"{found}\nexit {status}\n")
