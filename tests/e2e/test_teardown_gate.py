"""launch(gate=) with real processes: after a failure, the other instances are torn down only once the gate returns."""

from __future__ import annotations

import pytest

from poprun.backends.local import LocalBackend
from poprun.backends.offline import OfflineBackend
from tests.e2e.gate_helpers import check_teardown_awaits_the_gate

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]


@pytest.mark.parametrize("backend", [LocalBackend, OfflineBackend], ids=["local", "offline"])
def test_the_others_are_torn_down_only_after_the_gate_returns(backend, tmp_path):
    """Instance 1 fails; the backend's thread awaits the gate (held 1 s) before SIGTERM reaches instance 0."""
    check_teardown_awaits_the_gate(backend(), tmp_path)
