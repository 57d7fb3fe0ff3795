"""The conformance suite over the ssh and mpirun backends, their instances on the real test hosts h1 and h2."""

from __future__ import annotations

from pathlib import Path

import pytest

from poprun.backends import conformance
from poprun.backends.mpirun.backend import MpirunBackend
from poprun.backends.ssh.backend import SshBackend
from tests.e2e.gate_helpers import check_teardown_awaits_the_gate
from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]


@conformance.parametrize_backends({"ssh": SshBackend, "mpirun": MpirunBackend})
def test_remote_backend_passes_the_conformance_suite_on_real_hosts(factory, check, test_hosts: TestHosts,
                                                                   tmp_path: Path) -> None:
    """Each check that the backend's capabilities allow passes with instance 0 on h1 and instance 1 on h2."""
    check(factory, tmp_path, conformance.Target(hosts=("h1", "h2"), env=tuple(sorted(test_hosts.env().items()))))


def test_mpirun_awaits_the_gate_before_it_tells_the_other_ends(test_hosts: TestHosts, tmp_path: Path) -> None:
    """mpirun stops the others itself after instance 1 fails; the backend awaits the gate before telling their ends."""
    check_teardown_awaits_the_gate(MpirunBackend(), tmp_path, hosts=("h1", "h2"), env=test_hosts.env(),
                                   launcher_stops=True)


def test_ssh_stops_the_others_only_after_the_gate(test_hosts: TestHosts, tmp_path: Path) -> None:
    """Instance 1 fails on h2; the ssh backend awaits the gate (launch(gate=)) before SIGTERM reaches instance 0 on h1."""
    check_teardown_awaits_the_gate(SshBackend(), tmp_path, hosts=("h1", "h2"), env=test_hosts.env())
