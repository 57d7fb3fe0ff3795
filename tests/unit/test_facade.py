"""The poprun facade: its pinned names, each loaded on first use, and nothing loaded by ``import poprun``."""

import subprocess
import sys
from pathlib import Path

import poprun

FACADE = ["ApplyResult", "Context", "Control", "Diagnostic", "DiagnosticError", "LaunchError", "Run", "RunInfo", "Solution", "StopResult", "Stopped", "__version__", "apply", "attach", "events", "exit_status", "follow", "from_json", "info", "list_runs", "load_spec", "locate", "parse_flags", "read_report", "read_text", "solve", "stop", "to_json"]


def test_the_facade_exports_exactly_its_entry_points():
    """``__all__`` is pinned: a name added or removed is a decision (httpx's test_exported_members)."""
    assert FACADE == sorted(poprun.__all__)


def test_every_name_is_the_entry_point_of_its_layer():
    """Each name is the very object of the module that defines it."""
    from poprun.apply import Control, Stopped
    from poprun.core import events
    from poprun.core.diagnostic import LaunchError
    from poprun.planner.solve import solve
    from poprun.runs.api import list_runs

    assert (Control, Stopped, events, LaunchError, solve, list_runs) == (
        poprun.Control, poprun.Stopped, poprun.events, poprun.LaunchError, poprun.solve, poprun.list_runs)
    assert [] == [name for name in FACADE if getattr(poprun, name, None) is None]


def test_apply_is_the_package_and_calls_apply():
    """``from poprun import apply`` gives the poprun.apply package, which calls apply(): one meaning either way."""
    import poprun.apply.ports
    from poprun import apply
    from poprun.backends import RecordingBackend, default_registry
    from poprun.backends.conformance import probe_plan
    from tests.unit.test_apply import Sink

    registry = default_registry()
    registry.register("recording", RecordingBackend)
    plan = probe_plan("pass", Path("/"), backend="recording", instances=1)

    result = apply(plan, sink=Sink(), registry=registry, env_source={})

    assert (poprun.apply, 29500, 0) == (apply, poprun.apply.ports.DEFAULT_PORT, result.status)


def test_importing_poprun_loads_none_of_its_entry_points():
    """``import poprun`` (every command's first import) loads no other poprun module, nor typing or json."""
    code = ("import sys; before = set(sys.modules); import poprun; "
            "print(sorted(m for m in set(sys.modules) - before if m.startswith(('poprun.', 'typing', 'json'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)

    assert "[]\n" == done.stdout


def test_an_unknown_name_is_an_attribute_error():
    """A name the facade does not export raises AttributeError, as a module does."""
    try:
        poprun.plan_and_apply  # noqa: B018 - the lookup is the test
    except AttributeError as exc:
        assert "module 'poprun' has no attribute 'plan_and_apply'" == str(exc)
    else:
        raise AssertionError
