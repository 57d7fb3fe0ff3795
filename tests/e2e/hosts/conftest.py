"""
The ``test_hosts`` fixture: four emulated ssh hosts (``h1..h4``) for the whole session.

Skips where the machine cannot host them (not root, a tool missing), except under
``POPRUN_CI=1``: CI installs what they need, so there a skip would hide a broken install and fails instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.testhosts import TestHosts, TestHostsUnavailable, down, up


@pytest.fixture(scope="session")
def test_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestHosts]:
    """Bring up hosts h1..h4 once per session; tear them down at its end, whatever happened."""
    state: Path = tmp_path_factory.mktemp("testhosts")
    try:
        hosts = up(4, state)
    except TestHostsUnavailable as exc:
        if os.environ.get("POPRUN_CI"):
            pytest.fail(f"CI must run the test hosts: {exc}")
        pytest.skip(str(exc))
    try:
        yield hosts
    finally:
        down(state)
