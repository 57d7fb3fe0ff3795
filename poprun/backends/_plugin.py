"""
A plugin's backend as poprun uses it: what the plugin's code does wrong is a diagnostic naming it, never poprun's end.

Layer: ``poprun.backends``; imports ``poprun.core`` and :mod:`poprun.backends.base`, no backend.

The registry loads a plugin (:func:`load`) and makes its backend (:func:`make`) with standard
output sent to standard error meanwhile, so that a plugin that prints (``print``, or ``fd 1``)
never mixes its words into ``poprun plan --format json``; and it catches what the plugin's code
raises, ``SystemExit``, ``KeyboardInterrupt`` and ``GeneratorExit`` included (poprun's own stop,
``Stopped``, is none of them and passes). The backend it makes is a :class:`GuardedBackend`:
its ``launch`` and its launch's ``wait`` are checked, so that a plugin whose constructor,
``launch`` or ``wait`` raises, or returns something else than the protocol says (a
``LaunchError`` status poprun cannot exit with, a result blaming no instance), is PR460,
PR461 or PR462 naming the entry point and its distribution (exit 125, the run record ended
as any launch that failed), with ``POPRUN_NO_PLUGINS=1`` as the way out.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator

from poprun.backends.base import Backend, Launch, LaunchError, accepts_keyword
from poprun.core.diagnostic import Diagnostic, DiagnosticError, error
from poprun.core.exitstatus import CANNOT_LAUNCH, LAUNCH_STATUSES
from poprun.core.outcome import ApplyResult
from poprun.core.span import SourceSpan

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from importlib.metadata import EntryPoint

    from poprun.planner.setting import Setting
    from poprun.planner.trait import Traits

GROUP = "poprun.backends"
NO_PLUGINS = "POPRUN_NO_PLUGINS"
# What a plugin's code may raise that poprun turns into a diagnostic: every exception, and the
# BaseExceptions a plugin raises itself (poprun's own stop, apply's Stopped, is none of these and passes on)
CAUGHT = (Exception, SystemExit, KeyboardInterrupt, GeneratorExit)
_ASKED_BEFORE_LAUNCH = ("prepare", "run_on_host")  # optional methods apply calls before launch (the port plan)


def span(name: str) -> SourceSpan:
    """Return where a plugin's diagnostics point: its entry point."""
    return SourceSpan.environment(f"entry point {GROUP}:{name}")


def raised(exc: BaseException) -> str:
    """Return ``Type: message`` of what a plugin raised (``Type`` alone without a message)."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send what is written to standard output (``sys.stdout`` and descriptor 1) to standard error meanwhile."""
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()  # what poprun wrote before stays before
    try:
        saved = os.dup(1)
    except OSError:  # no descriptor 1 to speak of: Python's level only
        saved = -1
    else:
        try:
            os.dup2(2, 1)
        except OSError:  # no descriptor 2: Python's level only
            os.close(saved)
            saved = -1
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.flush()
        if saved >= 0:
            os.dup2(saved, 1)
            os.close(saved)


class Interrupted(KeyboardInterrupt):
    """A real Ctrl-C (SIGINT) came while a plugin was imported: poprun's own stop, never the plugin's failure."""


def load(entry_point: EntryPoint) -> object:
    """
    Return what ``entry_point`` names, imported with standard output sent to standard error.

    Raises:
        Interrupted: SIGINT arrived during the import (a plugin that hangs there, and its user
            presses Ctrl-C); a ``KeyboardInterrupt`` the plugin raises itself is its failure.
    """
    import signal
    import threading

    seen: list[int] = []

    def interrupted(signum: int, _frame: object) -> None:
        seen.append(signum)
        raise Interrupted

    swap = threading.current_thread() is threading.main_thread() \
        and signal.getsignal(signal.SIGINT) is signal.default_int_handler
    previous = signal.signal(signal.SIGINT, interrupted) if swap else None
    try:
        with stdout_to_stderr():
            return entry_point.load()
    except KeyboardInterrupt:
        if seen:
            raise Interrupted from None
        raise
    finally:
        if swap:
            signal.signal(signal.SIGINT, previous)


class Plugin:
    """Where a plugin's backend comes from, for its diagnostics: its entry point, its distribution."""

    def __init__(self, name: str, origin: str, distribution: str | None) -> None:
        self.name, self.origin, self.distribution = name, origin, distribution

    def failed(self, code: str, what: str) -> Diagnostic:
        """Return the error ``code`` (PR460-PR462) saying what the plugin did (``its launch() raised ...``)."""
        who = f"'{self.distribution}'" if self.distribution else "the plugin"
        return error(code, f"backend plugin '{self.name}' failed", detail=f"'{self.name}' is {self.origin}; {what}",
                     span=span(self.name),
                     hint=f"fix or uninstall {who}, or set {NO_PLUGINS}=1 to use only the built-in backends")


def make(factory: Callable[[], object], plugin: Plugin) -> Backend:
    """
    Return a new backend from a plugin's ``factory``, guarded (see the module docstring).

    Raises:
        DiagnosticError: PR460 when the factory raises or returns no backend (no ``launch``).
    """
    try:
        with stdout_to_stderr():
            backend = factory()
    except CAUGHT as exc:
        raise DiagnosticError([plugin.failed("PR460", f"making it raised {raised(exc)}")]) from exc
    if not callable(getattr(backend, "launch", None)):
        raise DiagnosticError([plugin.failed("PR460", f"making it returned {_kind(backend)}, not a backend "
                                                      "(no launch)")])
    declared: object = getattr(backend, "capabilities", frozenset())
    if not isinstance(declared, set | frozenset | tuple | list) or not all(isinstance(c, str) for c in declared):
        raise DiagnosticError([plugin.failed("PR460", f"its capabilities is {_kind(declared)}, not a set of names")])
    return GuardedBackend(backend, plugin)  # type: ignore[return-value] # the protocol's methods, by __getattr__


def declared(loaded: object) -> tuple[Traits | None, tuple[Setting, ...]]:
    """
    Return the ``traits`` and ``settings`` a plugin's class (or factory) declares, read without making a backend.

    A ``traits`` that is not a :class:`~poprun.planner.trait.Traits` counts as none declared (the
    conservative traits), and ``settings`` keeps only :class:`~poprun.planner.setting.Setting` rows.
    """
    from poprun.planner.setting import Setting
    from poprun.planner.trait import Traits

    traits = getattr(loaded, "traits", None)
    rows = getattr(loaded, "settings", ())
    settings = tuple(r for r in rows if isinstance(r, Setting)) if isinstance(rows, tuple | list) else ()
    return (traits if isinstance(traits, Traits) else None), settings


def _kind(value: object) -> str:
    return "None" if value is None else type(value).__name__


class GuardedBackend:
    """A plugin's backend: every attribute is the plugin's, ``launch`` is checked (PR461) and its launch guarded."""

    def __init__(self, backend: object, plugin: Plugin) -> None:
        self._backend, self._plugin = backend, plugin

    def __getattr__(self, attribute: str) -> object:
        found = getattr(self._backend, attribute)
        if attribute in _ASKED_BEFORE_LAUNCH and callable(found):
            return self._asked(attribute, found)
        return found

    def _asked(self, name: str, method: Callable[..., object]) -> Callable[..., object]:
        """Return ``method`` (prepare, run_on_host) guarded: what it raises is PR461, but a LaunchError of run_on_host."""

        def guarded(*arguments: object, **keywords: object) -> object:
            try:
                answer = method(*arguments, **keywords)
            except LaunchError as exc:
                if name == "run_on_host":  # a host it cannot reach: a reason, as the protocol says
                    raise
                diagnostics = exc.diagnostics or (self._plugin.failed("PR461", f"its {name}() raised {raised(exc)}"),)
                raise DiagnosticError(list(diagnostics)) from exc
            except CAUGHT as exc:
                raise DiagnosticError([self._plugin.failed("PR461", f"its {name}() raised {raised(exc)}")]) from exc
            if name == "run_on_host" and not (isinstance(answer, tuple) and len(answer) == 2  # noqa: PLR2004
                                              and isinstance(answer[0], int) and isinstance(answer[1], bytes)):
                raise DiagnosticError([self._plugin.failed("PR461", f"its run_on_host() returned {_kind(answer)}, "
                                                                    "not (status, output)")])
            return answer

        return guarded

    @property  # type: ignore[misc] # isinstance() sees the plugin's class, as unittest.mock's spec does
    def __class__(self) -> type:
        return type(self._backend)

    def close(self) -> None:
        """Close the plugin's backend (its ``close``, when it has one); what that raises is dropped: poprun is ending."""
        close = getattr(self._backend, "close", None)  # optional (Closes), as the registry's other helpers find them
        if callable(close):
            with contextlib.suppress(*CAUGHT):
                close()

    def launch(self, plan: object, **arguments: object) -> Launch:
        """
        Return the plugin's launch, guarded; its ``LaunchError`` passes on as it is.

        ``gate`` is passed on only when the plugin's ``launch`` takes it (one written before
        the gate has no such parameter: its teardown is not held).

        Raises:
            LaunchError: PR461 (status 125) when its ``launch`` raises anything else or returns no launch.
        """
        if "gate" in arguments and not accepts_keyword(self._backend.launch, "gate"):  # type: ignore[attr-defined]
            arguments = {name: value for name, value in arguments.items() if name != "gate"}
        try:
            launch = self._backend.launch(plan, **arguments)  # type: ignore[attr-defined]
        except LaunchError as exc:
            if exc.status not in LAUNCH_STATUSES or isinstance(exc.status, bool):  # 0 would say it ran and succeeded
                raise self._failed(f"its launch() raised LaunchError with status {exc.status!r}, not 125, 126 or "
                                   "127") from exc
            raise
        except CAUGHT as exc:
            raise self._failed(f"its launch() raised {raised(exc)}") from exc
        if not all(callable(getattr(launch, method, None)) for method in ("wait", "terminate")):
            raise self._failed(f"its launch() returned {_kind(launch)}, not a Launch (wait and terminate)")
        return GuardedLaunch(launch, self._plugin)

    def _failed(self, what: str) -> LaunchError:
        diagnostic = self._plugin.failed("PR461", what)
        return LaunchError(diagnostic.summary, status=CANNOT_LAUNCH, diagnostics=(diagnostic,))


class GuardedLaunch:
    """A plugin's launch: ``wait`` is checked (PR462); a ``terminate`` or ``forward`` that raised (or is missing) is told by ``wait``."""

    def __init__(self, launch: Launch, plugin: Plugin) -> None:
        self._launch, self._plugin = launch, plugin
        self._broke: str | None = None  # what terminate or forward raised, first

    def __getattr__(self, attribute: str) -> object:
        return getattr(self._launch, attribute)

    def wait(self) -> ApplyResult:
        """
        Return the plugin's result.

        Raises:
            DiagnosticError: PR462 when its ``wait`` raises or returns no ``ApplyResult``.
        """
        try:
            result = self._launch.wait()
        except CAUGHT as exc:
            raise DiagnosticError([self._plugin.failed("PR462", f"its wait() raised {raised(exc)}")]) from exc
        if not isinstance(result, ApplyResult) or not isinstance(result.statuses, tuple) or not all(
                isinstance(status, int) and not isinstance(status, bool) for status in result.statuses):
            raise DiagnosticError([self._plugin.failed("PR462", f"its wait() returned {_kind(result)}, not an "
                                                                "ApplyResult")])
        cause = result.root_cause
        if cause is not None and (not isinstance(cause, int) or not 0 <= cause < len(result.statuses)):
            raise DiagnosticError([self._plugin.failed(
                "PR462", f"its wait() returned an ApplyResult whose root_cause {cause!r} is not one of its "
                         f"{len(result.statuses)} statuses")])
        if self._broke is not None:  # the instances may not have been stopped as poprun asked
            raise DiagnosticError([self._plugin.failed("PR462", self._broke)])
        return result

    def terminate(self, grace_s: float) -> None:
        """Stop every instance (the plugin's terminate); what it raises is kept, not raised here (a signal handler)."""
        try:
            self._launch.terminate(grace_s)
        except CAUGHT as exc:
            self._broke = self._broke or f"its terminate() raised {raised(exc)}"

    def forward(self, sig: int) -> None:
        """
        Send ``sig`` to every instance (the plugin's ``forward``); what it raises is kept, not raised here (a signal handler).

        A launch without ``forward`` (older plugins) raises AttributeError here, kept the same
        way: the signal reached no instance, and ``wait`` says so (PR462), never silently.
        """
        try:
            self._launch.forward(sig)
        except CAUGHT as exc:
            self._broke = self._broke or f"its forward() raised {raised(exc)}"
