"""
Who hears of a run as it goes, at apply time: the notifier and the metrics file, made and ended together.

Layer: ``poprun.apply``; imports :mod:`poprun.apply.notify` and :mod:`poprun.apply.metrics` (each
only when the plan has it), :mod:`poprun.planner.observe` (the rule for a metrics path),
``poprun.core`` and the plan model. :func:`poprun.apply.apply` imports it only for a plan with a
notifier or a metrics file (``plan.observe.active``), so that a run with neither imports none of
these modules.

Both hear every event the relay tells (as its listeners); the metrics file reads the instances'
progress from the run's board, once one is given (:meth:`Observers.watch`). :meth:`Observers.close`
ends both once the run has ended (run-ended told): the metrics file's last version, then at most
one notify deadline for the notifications left (a stop signal meanwhile ends the wait); it
returns their warnings (PR240, PR467).
"""

from __future__ import annotations

from poprun.core.diagnostic import Diagnostic, error
from poprun.core.span import SourceSpan

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping, Sequence

    from poprun.apply.control import Control
    from poprun.apply.metrics import MetricsFile
    from poprun.apply.notify import Notifier
    from poprun.apply.relay import Relay
    from poprun.core.progress import InstanceProgress as Progress
    from poprun.planner.plan import LaunchPlan

__all__ = ["Observers"]


class Observers:
    """The run's notifier and metrics file (either may be None), listening to ``relay``."""

    def __init__(self, plan: LaunchPlan, environ: Mapping[str, str], run_id: str, relay: Relay,
                 control: Control) -> None:
        o = plan.observe
        self._control = control
        self.refused: Diagnostic | None = None  # PR469: the launch does not start
        self.notifier: Notifier | None = None
        self.metrics: MetricsFile | None = None
        self._closed = False
        if o.notify:
            from poprun.apply.notify import Notifier

            self.notifier = Notifier(o, environ, run_id)
            relay.listeners.append(self.notifier.event)
        if o.metrics_file:
            self.refused = _refused(o.metrics_file)
            if self.refused is None:
                from poprun.apply.metrics import MetricsFile

                self.metrics = MetricsFile(o.metrics_file, run_id=run_id, backend=plan.backend.name)
                relay.listeners.append(self.metrics.event)
                self.metrics.start()

    def watch(self, snapshot: Callable[[], Sequence[Progress]]) -> None:
        """Have the metrics file show the instances' progress as ``snapshot`` (the board's) gives it."""
        if self.metrics is not None:
            self.metrics.watch(snapshot)

    def close(self) -> tuple[Diagnostic, ...]:
        """End the metrics file (its last version) and the notifier (at most its deadline); return their warnings."""
        if self._closed:
            return ()
        self._closed = True
        found: list[Diagnostic] = []
        if self.metrics is not None:
            found += self.metrics.close()
        if self.notifier is not None:
            stops = len(self._control.signals)  # a stop signal from now on ends the wait for the notifications
            found += self.notifier.close(interrupted=lambda: len(self._control.signals) > stops)
        return tuple(found)


def _refused(path: str) -> Diagnostic | None:
    """Return PR469 when something that is not a regular file is at the metrics path (the rule of the plan)."""
    from poprun.planner.observe import path_problem

    problem = path_problem(path)
    if problem is None or problem[0] != "PR469":
        return None
    return error("PR469", "metrics file is not a regular file", detail=problem[1],
                 span=SourceSpan.environment("the plan's observe.metrics_file"),
                 hint="remove what is there, or plan again with the path of a regular file, or of none yet (poprun "
                      "makes it)")
