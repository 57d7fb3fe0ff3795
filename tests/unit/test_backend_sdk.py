"""The plugin SDK: the names poprun.backends exports, and the plugin of docs/backends.md, run by the conformance suite."""

import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

import poprun.backends
from poprun.backends import conformance
from poprun.backends.conformance import probe_plan
from poprun.backends.registry import default_registry, describe

DOC = Path(__file__).resolve().parents[2] / "docs" / "backends.md"
SDK = ["RESTARTS_INSTANCES", "HostCommands", "HostStates", "Prepares", "Restarter", "CANNOT_LAUNCH", "CHECKS_BEFORE_START", "NOT_EXECUTABLE", "NOT_FOUND", "PROCESSES", "ApplyResult", "Backend",
       "BackendRegistry", "Closes", "Describing", "Event", "EventSink", "FormatRequest", "Formatting", "Gate", "InstanceEnded",
       "InstanceFailure", "InstanceSink", "InstanceStarted", "Launch", "LaunchError", "Outcome", "OutputSink", "PlanFormat",
       "RecordingBackend", "Setting", "Stream", "TemporaryCache", "TopologyProbing", "Traits", "UnknownBackendError", "capabilities",
       "conformance", "default_registry", "describe", "environment", "find_format", "signal_name", "topology_prober"]


def doc_example() -> str:
    """Return the first python block of docs/backends.md: the plugin, exactly as the page shows it."""
    return re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.DOTALL)[0]


def doc_module() -> types.ModuleType:
    module = types.ModuleType("nice_backend")
    exec(compile(doc_example(), str(DOC), "exec"), module.__dict__)  # noqa: S102 - the page's own code
    return module


NICE = doc_module().NiceBackend


def test_the_sdk_exports_exactly_these_names():
    """poprun.backends.__all__ is the SDK, and every name in it can be had."""
    assert sorted(SDK) == sorted(poprun.backends.__all__)
    assert all(getattr(poprun.backends, name) is not None for name in poprun.backends.__all__)


def test_an_unknown_name_is_an_attribute_error():
    """A name outside the SDK is not invented by the lazy lookup."""
    with pytest.raises(AttributeError, match="has no attribute 'LocalBackend'"):
        _ = poprun.backends.LocalBackend


def test_importing_the_protocol_loads_nothing_of_the_sdk_besides():
    """Importing poprun.backends.base (every launch does) loads neither the registry, the double nor the suite."""
    code = "import sys, poprun.backends.base; print(sorted(m for m in sys.modules if m.startswith('poprun.backends')))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=30)

    assert "['poprun.backends', 'poprun.backends.base']" == done.stdout.strip()


def test_the_documented_plugin_is_short():
    """The plugin of docs/backends.md is under 50 lines, as the page promises."""
    assert len(doc_example().splitlines()) < 50


@pytest.mark.e2e
@conformance.parametrize(NICE)
def test_the_documented_plugin_passes_the_conformance_suite(check, tmp_path):
    """The page's plugin passes every check its capabilities allow, with real processes."""
    check(NICE, tmp_path)


def test_the_documented_plugin_is_found_through_its_entry_point(tmp_path, monkeypatch):
    """Declared in the group poprun.backends, the page's plugin is a backend by name, and describe reaches it."""
    from importlib.metadata import EntryPoint

    (tmp_path / "nice_backend.py").write_text(doc_example(), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "nice_backend", raising=False)
    point = EntryPoint(name="nice", value="nice_backend:NiceBackend", group="poprun.backends")
    registry = default_registry(environ={}, entry_points=[point])

    assert "nice" in registry.names()
    assert "prefix: nice -n 5\n" == describe(registry, probe_plan("pass", tmp_path, backend="nice"))
