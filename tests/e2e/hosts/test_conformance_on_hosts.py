"""The conformance suite over the ssh and mpirun backends, their instances on the real test hosts h1 and h2."""

from __future__ import annotations

from pathlib import Path

import pytest

from poprun.backends import conformance
from poprun.backends.mpirun.backend import MpirunBackend
from poprun.backends.ssh.backend import SshBackend
from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


@conformance.parametrize_backends({"ssh": SshBackend, "mpirun": MpirunBackend})
def test_remote_backend_passes_the_conformance_suite_on_real_hosts(factory, check, test_hosts: TestHosts,
                                                                   tmp_path: Path) -> None:
    """Each check that the backend's capabilities allow passes with instance 0 on h1 and instance 1 on h2."""
    check(factory, tmp_path, conformance.Target(hosts=("h1", "h2"), env=tuple(sorted(test_hosts.env().items()))))
