"""
The ``test_hosts`` fixture: four emulated ssh hosts (``h1..h4``) for the whole session.

Skips where the machine cannot host them (not root, a tool missing), except under
``POPRUN_CI=1``: CI installs what they need, so there a skip would hide a broken install and fails instead.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.helpers import session_hosts
from tests.testhosts import TestHosts


@pytest.fixture(scope="session")
def test_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestHosts]:
    """Bring up hosts h1..h4 once per session; tear them down at its end, whatever happened."""
    yield from session_hosts(tmp_path_factory.mktemp("testhosts"), 4, what="the test hosts")


@pytest.fixture(scope="module")
def fault_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestHosts]:
    """Bring up hosts h1..h3 for one module whose tests take hosts down (the session's hosts stay healthy)."""
    yield from session_hosts(tmp_path_factory.mktemp("faulthosts"), 3, what="the fault-test hosts")


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """Yield a new directory with a short path, for TMPDIR: poprun's ssh sockets are made there only if they fit."""
    path = Path(tempfile.mkdtemp(prefix="pt", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)  # the test's own directory, made just above


@pytest.fixture(autouse=True)
def no_kept_connections() -> Iterator[None]:
    """Close the ssh connections a test's own process kept for a launch that never came (each test starts clean)."""
    yield
    from poprun.backends.ssh.backend import _close_parked

    _close_parked()
