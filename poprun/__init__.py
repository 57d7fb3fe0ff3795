"""
poprun: a drop-in PopRun launcher built as a declarative plan compiler.

front ends (flags, TOML, DSL) -> Spec -> solve -> LaunchPlan -> render | backends.

Layer: the package itself; imports nothing at import time. The names below are the library's
entry points (``from poprun import apply, solve``), each loaded on first use (PEP 562, as
httpx's ``__init__``), so that ``import poprun`` (which every ``poprun`` command does first)
costs nothing more:

- planning: :func:`parse_flags` (a command line), :func:`load_spec` (a spec file),
  :func:`solve` (a spec and a :class:`Context` to a :class:`Solution`: the plan and its
  warnings), :func:`read_text`, :func:`from_json` and :func:`to_json` (saved plans);
- applying: :func:`apply` with a :class:`Control`; :class:`Stopped`; the
  :class:`ApplyResult` and :func:`exit_status`; :mod:`events` (``poprun.core.events``);
- errors: :class:`Diagnostic`, :class:`DiagnosticError` and :class:`LaunchError`
  (``poprun.core.diagnostic`` draws the whole tree);
- run records: :func:`list_runs`, :func:`locate` (a :class:`Run`), :func:`info` (a
  :class:`RunInfo`), :func:`follow`, :func:`attach`, :func:`stop` (a :class:`StopResult`) and
  :func:`read_report` (``poprun.runs``: values, nothing printed).

``apply`` is the ``poprun.apply`` package itself, which calls :func:`poprun.apply.apply` when
called, so that the name means one thing whichever was imported first.
``tests/unit/test_facade.py`` pins ``__all__``.
"""

from __future__ import annotations

__version__ = "0.1.0"

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from poprun.apply import Control, Stopped, apply
    from poprun.core import events
    from poprun.core.diagnostic import Diagnostic, DiagnosticError, LaunchError
    from poprun.core.outcome import ApplyResult, exit_status
    from poprun.core.runinfo import RunInfo
    from poprun.planner.context import Context
    from poprun.planner.flags import parse_flags
    from poprun.planner.load import load_spec, read_text
    from poprun.planner.serde import from_json, to_json
    from poprun.planner.solve import Solution, solve
    from poprun.runs.api import Run, StopResult, attach, follow, info, list_runs, locate, read_report, stop

# Each name's module.
_WHERE = {
    **dict.fromkeys(("parse_flags",), "poprun.planner.flags"),
    **dict.fromkeys(("load_spec", "read_text"), "poprun.planner.load"),
    **dict.fromkeys(("Solution", "solve"), "poprun.planner.solve"),
    **dict.fromkeys(("Context",), "poprun.planner.context"),
    **dict.fromkeys(("from_json", "to_json"), "poprun.planner.serde"),
    **dict.fromkeys(("Control", "Stopped"), "poprun.apply"),
    **dict.fromkeys(("ApplyResult", "exit_status"), "poprun.core.outcome"),
    **dict.fromkeys(("Diagnostic", "DiagnosticError", "LaunchError"), "poprun.core.diagnostic"),
    **dict.fromkeys(("RunInfo",), "poprun.core.runinfo"),
    **dict.fromkeys(("Run", "StopResult", "attach", "follow", "info", "list_runs", "locate", "read_report", "stop"),
                    "poprun.runs.api"),
}
_MODULES = {"apply": "poprun.apply", "events": "poprun.core.events"}  # names that are modules

__all__ = [
    "ApplyResult",
    "Context",
    "Control",
    "Diagnostic",
    "DiagnosticError",
    "LaunchError",
    "Run",
    "RunInfo",
    "Solution",
    "StopResult",
    "Stopped",
    "__version__",
    "apply",
    "attach",
    "events",
    "exit_status",
    "follow",
    "from_json",
    "info",
    "list_runs",
    "load_spec",
    "locate",
    "parse_flags",
    "read_report",
    "read_text",
    "solve",
    "stop",
    "to_json",
]


def __getattr__(name: str) -> object:
    """Return an entry point, importing its module on first use (PEP 562)."""
    from importlib import import_module

    if name in _MODULES:
        return import_module(_MODULES[name])  # poprun.apply: the import binds it here too
    where = _WHERE.get(name)
    if where is None:
        msg = f"module 'poprun' has no attribute {name!r}"
        raise AttributeError(msg)
    value = getattr(import_module(where), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return [*globals(), *__all__]
