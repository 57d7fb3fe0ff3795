"""
Shared fixtures, the process-table checks and the hypothesis profiles (``dev``, ``ci`` with POPRUN_CI=1).

No orphan across the whole suite: the session sets ``POPRUN_TEST_RUN=<uuid>`` in its own
environment before any test runs, so every process a test starts (poprun, its watchdog, every
instance and what instances start) inherits it. At the end of the session no living process
may carry it; the survivors are listed (and killed) and the session fails.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from poprun.core.record import positional_record

settings.register_profile("dev", max_examples=50, deadline=None)
settings.register_profile("ci", max_examples=300, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("POPRUN_CI") else "dev")

RUN_MARKER = "POPRUN_TEST_RUN"  # carried by every process the test session starts
LAUNCH_MARKER = "POPRUN_TEST_LAUNCH"  # carried by the processes of one test's launch (the ``marked`` fixture)


def carrying(name: str, value: str) -> dict[int, str]:
    """Return {pid: command line} of every living process (zombies are dead) whose environment has ``name=value``."""
    needle = f"{name}={value}".encode()
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = Path(entry.path, "environ").read_bytes()
            state = Path(entry.path, "stat").read_bytes().rsplit(b")", 1)[1].split()[0]
            command = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue
        if state != b"Z" and needle in environ.split(b"\0"):
            found[int(entry.name)] = command.strip()
    return found


def survivors(name: str, value: str, *, within_s: float) -> dict[int, str]:
    """Return the processes still carrying ``name=value`` after waiting up to ``within_s`` for them to go."""
    deadline = time.monotonic() + within_s
    while (found := carrying(name, value)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return found


def kill_all(pids: dict[int, str]) -> None:
    """SIGKILL every pid (it may be gone already)."""
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="session", autouse=True)
def runs_of_the_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Keep the records of the session's runs in a folder of its own (``POPRUN_RUNS_DIR``), never the user's."""
    folder = tmp_path_factory.mktemp("runs")
    previous = os.environ.get("POPRUN_RUNS_DIR")
    os.environ["POPRUN_RUNS_DIR"] = str(folder)
    yield folder
    if previous is None:
        os.environ.pop("POPRUN_RUNS_DIR", None)
    else:
        os.environ["POPRUN_RUNS_DIR"] = previous


@pytest.fixture(scope="session", autouse=True)
def no_orphan_survives_the_session() -> Iterator[str]:
    """Mark every process the tests start; fail the session if one of them is still alive at its end."""
    value = uuid.uuid4().hex
    os.environ[RUN_MARKER] = value
    yield value
    left = survivors(RUN_MARKER, value, within_s=2.0)
    kill_all(left)
    if left:
        listing = "\n".join(f"  {pid}: {command}" for pid, command in sorted(left.items()))
        pytest.fail(f"processes started by the tests outlived the session (now killed):\n{listing}")


@positional_record
class Marked:
    """An environment whose processes can be found in the process table: ``env`` carries a unique marker."""

    env: dict[str, str]
    value: str

    def alive(self) -> dict[int, str]:
        """Return {pid: command line} of the living processes that carry the marker."""
        return carrying(LAUNCH_MARKER, self.value)

    def survivors(self, *, within_s: float) -> dict[int, str]:
        """Return the processes still carrying the marker after waiting up to ``within_s``."""
        return survivors(LAUNCH_MARKER, self.value, within_s=within_s)


@pytest.fixture
def marked() -> Iterator[Marked]:
    """Return an environment (this one plus ``POPRUN_TEST_LAUNCH=<uuid>``); kill what carries it at the end."""
    value = uuid.uuid4().hex
    yield Marked(env=dict(os.environ) | {LAUNCH_MARKER: value}, value=value)
    kill_all(carrying(LAUNCH_MARKER, value))
