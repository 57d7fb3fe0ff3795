"""
What a launch is handed: the sinks its output and events go to, the temporary cache, the restarter and the teardown gate.

Layer: ``poprun.core``; imports only ``poprun.core``. These are the values the apply step
passes to a backend's ``launch`` and the process layer (:mod:`poprun.process`) works with;
the backend SDK (:mod:`poprun.backends.base`) re-exports every name unchanged, so that a
plugin imports them from ``poprun.backends``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from poprun.core.events import Event, InstanceEnded
from poprun.core.record import record

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from typing import Literal, Protocol

    Stream = Literal["stdout", "stderr"]
    """poprun's own output streams, as an instance's output is forwarded to them."""
else:
    Protocol = object  # the protocols below are for type checkers; at run time, plain classes
    Stream = str

__all__ = ["EventSink", "Gate", "InstanceSink", "OutputSink", "Restarter", "Stream", "TemporaryCache"]


class OutputSink(Protocol):
    """Where forwarded instance output goes (the terminal, in the CLI)."""

    def write(self, stream: Stream, data: bytes) -> None:
        """
        Write ``data`` (one or more whole lines, each ending in a newline) to ``stream``.

        A line over 1 MiB comes in parts as it is written (the output router streams it), the
        last ending in its newline; no other instance's output comes between them.

        Backends call this from one thread at a time, so a sink need not lock.
        """


class EventSink(OutputSink, Protocol):
    """An output sink that also hears of instances starting and ending, from the same thread as ``write``."""

    def event(self, event: Event) -> None:
        """
        Take note of ``event``; must return quickly (it is called between writes of output).

        It never waits for the apply step: what must wait before a teardown is the launch's
        ``gate`` (:data:`Gate`), not a slow sink.
        """


class InstanceSink(OutputSink, Protocol):
    """
    An output sink that also keeps each instance's lines apart (the apply step's run record), and hears of every read.

    A sink is one by subclassing this class (the apply step's does); a backend whose output goes
    through the shared router (``poprun.process.output``) then calls
    :meth:`instance_lines` for every piece of whole lines it reads, shown or not
    (``--only-output-from-instance``), and :meth:`instance_output` for every read, from the
    thread that calls ``write``. A plugin may call them too, when its sink is an ``InstanceSink``
    (``isinstance``); both are optional to call.
    """

    def instance_lines(self, index: int, stream: Stream, data: bytes) -> None:
        """Keep ``data``, whole lines of ``stream`` of instance ``index`` (or parts of a line over 1 MiB); must return quickly."""

    def instance_output(self, index: int) -> None:
        """
        Take note that instance ``index`` wrote output, whole lines or not; must return quickly.

        A progress bar that ends its lines with carriage returns writes output too: for
        ``--stall-timeout``, any output is a sign of life.
        """


Gate = Callable[[], None]
"""
What a backend awaits before it tears the launch down after a failure (``launch(..., gate=)``).

When an instance fails (not stopped by poprun) and the backend is about to stop the others
(SIGTERM, then SIGKILL), it first calls the gate, from the thread that would stop them, after
telling the failure's :class:`InstanceEnded`. The call returns at once unless the apply step is
reading the instances' stacks under a time limit (then within ~15 s, or at a stop). A backend
that stops nothing itself after a failure (the launcher does: ``mpirun``) calls it before it
tells the other instances' ends. A backend whose ``launch`` has no ``gate`` parameter (a plugin
written before it) is not given one (:func:`accepts_keyword`): its teardown is not held.
"""


@record
class TemporaryCache:
    """
    The plan's temporary executable cache, made by the apply step in this process (owner-only, 0o700).

    Its path is already the instances' ``POPDIST_EXECUTABLE_CACHE_PATH``. A backend makes it on
    the other hosts it runs instances on, and, when ``remove_at_exit``, removes it at the end
    (and should poprun die), on every host where it made it. A backend removes only what was
    made: the apply step's record here (:func:`poprun.process.files.made_here`), its
    own on other hosts; never a directory because of its name.
    """

    path: str
    remove_at_exit: bool


class Restarter(Protocol):
    """
    The apply step's answer to "instance N failed: start it again?" (``--restart-scope instance``).

    A backend with the :data:`RESTARTS_INSTANCES` capability receives one as ``launch(...,
    restarter=)``. When an instance fails (not stopped by poprun, its host not lost), the
    backend calls :meth:`restart_after` before telling :class:`InstanceEnded`: None means
    "tear the launch down as usual"; a delay means the event is told with ``restarting=True``
    and, once the delay has passed, the backend calls :meth:`prepare` (from a thread that may
    block: it runs the pre-restart command) and starts the instance again with the variables
    it returns added to its environment, telling :class:`InstanceStarted` with ``restart`` set.
    If :meth:`prepare` returns None, or the launch is being stopped meanwhile, the instance
    stays ended and the launch is torn down as after a failure (its status is the last one).
    The result's status of a restarted instance is that of its last run.
    """

    def restart_after(self, ended: InstanceEnded, uptime_s: float) -> float | None:
        """Return the seconds to wait before instance ``ended.index`` starts again, or None; quick, never blocks."""

    def prepare(self, index: int) -> Mapping[str, str] | None:
        """Return the variables the restarted instance ``index`` gets (its restart count), or None to give up."""
