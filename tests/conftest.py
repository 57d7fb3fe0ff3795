"""Shared fixtures and the hypothesis profiles (``dev`` by default, ``ci`` with POPRUN_CI=1)."""

import os

from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=50, deadline=None)
settings.register_profile("ci", max_examples=300, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("ci" if os.environ.get("POPRUN_CI") else "dev")
