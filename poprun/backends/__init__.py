"""
Backends: what executes a finished :class:`~poprun.planner.plan.LaunchPlan`, and the SDK to write one.

Layer: ``poprun.backends``; imports ``poprun.core`` and ``poprun.planner`` (the plan model, never
the spec or the solver). A backend runs every instance of the plan with exactly the plan's argv,
working directory and environment, and decides nothing. Nothing here prints: output goes to the
:class:`~poprun.backends.base.OutputSink` the caller passes in.

The names below are the plugin SDK (``from poprun.backends import Backend, RecordingBackend``):
the protocol and its values (:mod:`.base`), the registry and its helpers (:mod:`.registry`), a
test double (:mod:`.testing`) and the conformance suite (:mod:`.conformance`). They are loaded on
first use (PEP 562), so that importing a submodule (``poprun.backends.base`` on every launch)
costs nothing more. The built-in backends are one module or subpackage each (:mod:`.local`,
:mod:`.offline`, :mod:`.ssh`, :mod:`.mpirun`, :mod:`.slurm`); the process machinery they share
is the layer below them (:mod:`poprun.process`; a plugin uses only the names below). ``docs/backends.md`` shows a
plugin in a few lines.
"""

from __future__ import annotations

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from poprun.backends import conformance as conformance
    from poprun.backends.base import (
        CANNOT_LAUNCH,
        CHECKS_BEFORE_START,
        NOT_EXECUTABLE,
        NOT_FOUND,
        PROCESSES,
        RESTARTS_INSTANCES,
        ApplyResult,
        Backend,
        Closes,
        Describing,
        Event,
        EventSink,
        FormatRequest,
        Formatting,
        Gate,
        HostCommands,
        HostStates,
        InstanceEnded,
        InstanceFailure,
        InstanceSink,
        InstanceStarted,
        Launch,
        LaunchError,
        OutputSink,
        PlanFormat,
        Prepares,
        Restarter,
        Setting,
        Stream,
        TemporaryCache,
        TopologyProbing,
        Traits,
        capabilities,
        environment,
        signal_name,
    )
    from poprun.backends.registry import (
        BackendRegistry,
        UnknownBackendError,
        default_registry,
        describe,
        find_format,
        topology_prober,
    )
    from poprun.backends.testing import Outcome, RecordingBackend

_BASE = ("CANNOT_LAUNCH", "CHECKS_BEFORE_START", "NOT_EXECUTABLE", "NOT_FOUND", "PROCESSES", "RESTARTS_INSTANCES",
         "HostCommands", "HostStates", "Prepares", "Restarter", "ApplyResult", "Backend", "Closes",
         "Describing", "Event", "EventSink", "FormatRequest", "Formatting", "InstanceEnded", "InstanceFailure",
         "InstanceSink", "InstanceStarted", "Launch", "LaunchError", "OutputSink", "PlanFormat", "Stream", "TemporaryCache",
         "TopologyProbing", "capabilities", "environment", "signal_name", "Gate", "Setting", "Traits")
_REGISTRY = ("BackendRegistry", "UnknownBackendError", "default_registry", "describe", "find_format", "topology_prober")
_TESTING = ("Outcome", "RecordingBackend")
_WHERE = dict.fromkeys(_BASE, "base") | dict.fromkeys(_REGISTRY, "registry") | dict.fromkeys(_TESTING, "testing")

__all__ = [
    "CANNOT_LAUNCH",
    "CHECKS_BEFORE_START",
    "NOT_EXECUTABLE",
    "NOT_FOUND",
    "PROCESSES",
    "RESTARTS_INSTANCES",
    "ApplyResult",
    "Backend",
    "BackendRegistry",
    "Closes",
    "Describing",
    "Event",
    "EventSink",
    "FormatRequest",
    "Formatting",
    "Gate",
    "HostCommands",
    "HostStates",
    "InstanceEnded",
    "InstanceFailure",
    "InstanceSink",
    "InstanceStarted",
    "Launch",
    "LaunchError",
    "Outcome",
    "OutputSink",
    "PlanFormat",
    "Prepares",
    "RecordingBackend",
    "Restarter",
    "Setting",
    "Stream",
    "TemporaryCache",
    "TopologyProbing",
    "Traits",
    "UnknownBackendError",
    "capabilities",
    "conformance",
    "default_registry",
    "describe",
    "environment",
    "find_format",
    "signal_name",
    "topology_prober",
]


def __getattr__(name: str) -> object:
    """Return an SDK name, importing its module on first use (PEP 562)."""
    from importlib import import_module

    if name == "conformance":
        return import_module("poprun.backends.conformance")
    where = _WHERE.get(name)
    if where is None:
        msg = f"module 'poprun.backends' has no attribute {name!r}"
        raise AttributeError(msg)
    value = getattr(import_module(f"poprun.backends.{where}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return [*globals(), *__all__]
