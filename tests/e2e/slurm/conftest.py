"""
The ``slurm_hosts`` fixture: three emulated hosts (``h1..h3``) forming a real Slurm cluster, for the whole session.

munged, slurmctld and one slurmd per host, as :func:`tests.testhosts.up` starts them with
``slurm=True``; every node has 2 CPUs. Skips where the machine cannot run them (not root, Slurm
or munge missing), except under ``POPRUN_CI=1``: CI installs what they need, so there a skip
would hide a broken install and fails instead.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.e2e.helpers import session_hosts
from tests.testhosts import TestHosts


@pytest.fixture(scope="session")
def slurm_hosts(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestHosts]:
    """Bring up hosts h1..h3 with a Slurm cluster once per session; tear it all down at its end, whatever happened."""
    yield from session_hosts(tmp_path_factory.mktemp("slurmhosts"), 3, slurm=True, what="the Slurm test cluster")
