"""
The backend protocol and the values a launch returns: what a backend plugin is written against.

Layer: ``poprun.backends``; imports ``poprun.core`` and ``poprun.planner.plan``; never the spec.

A :class:`Backend` starts every instance of a plan and returns a :class:`Launch` at once;
:meth:`Launch.wait` returns an :class:`ApplyResult`. Instance output reaches the user through
an :class:`OutputSink` that the caller owns, so that backends never print. A sink that is also
an :class:`EventSink` hears when each instance starts and ends (for logs and progress); a
backend must not require one. The apply step makes the plan's temporary executable cache and
hands it to :meth:`Backend.launch` as a :class:`TemporaryCache`, and its teardown gate as
``gate``: a callable the backend awaits after a failure, before it stops the other instances
(the sink's calls never wait; see :data:`Gate`).

A backend may offer more, each through a small protocol of its own that a plugin may leave
out (the callers look for the method): :class:`Describing` (its part of ``poprun plan``'s
text), :class:`Formatting` (views of a plan for ``poprun plan --format NAME``),
:class:`TopologyProbing` (other hosts' CPU topologies, for placement) and :class:`Closes`
(local state, such as connections, released when the command ends). The registry's helpers
(:func:`~poprun.backends.registry.describe`, :func:`~poprun.backends.registry.find_format`,
:func:`~poprun.backends.registry.topology_prober`) reach them. ``capabilities`` names what a
backend can promise beyond the protocol, so that the conformance suite checks exactly that.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from poprun.core.diagnostic import LaunchError
from poprun.core.events import Event, InstanceEnded, InstanceStarted
from poprun.core.exitstatus import CANNOT_LAUNCH, NOT_EXECUTABLE, NOT_FOUND
from poprun.core.launching import EventSink, Gate, InstanceSink, OutputSink, Restarter, Stream, TemporaryCache
from poprun.core.outcome import ApplyResult, InstanceFailure, signal_name
from poprun.core.record import record
from poprun.planner.plan import Instance, LaunchPlan
from poprun.planner.setting import Setting
from poprun.planner.trait import Traits

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from typing import ClassVar, Protocol

    from poprun.planner.machine import HostTopology

else:
    Protocol = object  # the protocols below are for type checkers; at run time, plain classes

PROCESSES = "processes"
"""Capability: the instances are real processes that run the plan's argv (a test double's are not)."""
CHECKS_BEFORE_START = "checks-before-start"
"""Capability: a plan that cannot start (its working directory is missing) raises :class:`LaunchError` from launch."""
RESTARTS_INSTANCES = "restarts-instances"
"""Capability: :meth:`Backend.launch` takes ``restarter=`` (a :class:`Restarter`) and starts a failed instance again when it says so."""

__all__ = ["CANNOT_LAUNCH", "CHECKS_BEFORE_START", "NOT_EXECUTABLE", "NOT_FOUND", "PROCESSES", "RESTARTS_INSTANCES",
           "ApplyResult", "Backend", "Closes", "Describing", "Event", "EventSink", "FormatRequest", "Formatting", "Gate",
           "HostCommands", "HostStates", "InstanceEnded", "InstanceFailure", "InstanceSink", "InstanceStarted", "Launch",
           "LaunchError", "OutputSink", "PlanFormat", "Restarter", "Setting", "Stream", "TemporaryCache", "TopologyProbing", "Traits",
           "accepts_keyword", "capabilities", "environment", "signal_name"]


def environment(instance: Instance, env_source: Mapping[str, str]) -> dict[str, str]:
    """Return the environment of ``instance``: ``env_source`` minus ``unset`` plus ``set``."""
    env = {k: v for k, v in env_source.items() if k not in instance.env.unset}
    env.update(instance.env.set)
    return env


def accepts_keyword(function: object, name: str) -> bool:
    """
    Return whether ``function`` takes the keyword argument ``name`` (a parameter of that name, or ``**kwargs``).

    Read from the code object, without :mod:`inspect` (start-up); a callable without one
    (a builtin, a ``functools.partial``) is taken not to.
    """
    code = getattr(getattr(function, "__func__", function), "__code__", None)
    if code is None:
        return False
    named = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
    return name in named[1 if hasattr(function, "__self__") else 0:] or bool(code.co_flags & _VARKEYWORDS)


_VARKEYWORDS = 0x08  # inspect.CO_VARKEYWORDS: the function takes **kwargs


class Launch(Protocol):
    """A running plan. Safe to :meth:`terminate` from a signal handler or another thread."""

    def wait(self) -> ApplyResult:
        """
        Block until every instance has ended and its output is forwarded; return the result.

        When an instance fails, the backend stops the others (SIGTERM, then SIGKILL after its
        grace period) before returning. Once it returns, no process of the launch is left.
        """

    def terminate(self, grace_s: float) -> None:
        """
        Stop every instance still running: SIGTERM now, SIGKILL after ``grace_s`` seconds.

        Returns at once; :meth:`wait` returns when they have ended. ``grace_s`` 0 kills at once;
        a second call with a grace only keeps the first deadline. After the end it does nothing.
        """

    def forward(self, sig: int) -> None:
        """
        Send ``sig`` to every instance still running, wherever it runs; returns at once, safe from a signal handler.

        The apply step forwards ``--signal SIG@SECONDS``'s signal before a time limit, and the
        command line Ctrl-Z (SIGTSTP) and ``fg`` (SIGCONT). After the end it does nothing. A
        backend that cannot deliver ``sig`` raises (``NotImplementedError``) rather than send
        nothing silently: a plugin's launch that raises, or has no ``forward``, ends its run
        with PR462 naming it. (A launcher that handles job control itself, ``mpirun`` and
        ``srun`` on a terminal, leaves SIGTSTP and SIGCONT to it.)
        """


class Backend(Protocol):
    """
    Something that runs a plan: ``local``, ``offline``, ``ssh``, ``mpirun``, ``slurm``, or a plugin's.

    A backend executes the plan's argv, cwd and environment exactly; it decides nothing.
    ``capabilities`` (optional; default none) names what it promises beyond this protocol:
    :data:`PROCESSES`, :data:`CHECKS_BEFORE_START`.
    """

    name: ClassVar[str]

    def launch(self, plan: LaunchPlan, *, env_source: Mapping[str, str], sink: OutputSink,
               cache: TemporaryCache | None = None, gate: Gate | None = None) -> Launch:
        """
        Start every instance of ``plan``; return without waiting for them.

        ``env_source`` is the launching environment: forwarded variables are read from it.
        ``cache`` is the temporary executable cache the apply step made (None: there is none
        to make or remove). ``gate``, when given, is awaited after a failure before the others
        are torn down (:data:`Gate`); a backend without the parameter is not given one.

        Raises:
            LaunchError: when no instance could be started (nothing is left running).
        """


def capabilities(backend: object) -> frozenset[str]:
    """Return the capabilities ``backend`` declares (its ``capabilities`` attribute), or none."""
    return frozenset(getattr(backend, "capabilities", ()))


@record
class FormatRequest:
    """What a plan view may need besides the plan: how to run the launch again, and the hosts the user named."""

    command: tuple[str, ...]  # the poprun command line that reruns the launch (argv)
    hosts: tuple[str, ...] = ()  # the hosts named in the spec, as written (empty: none named)


PlanFormat = Callable[[LaunchPlan, FormatRequest], str]
"""A view of a plan as text (``poprun plan --format NAME``)."""


class Describing(Protocol):
    """Optional: a backend that adds its own part to ``poprun plan``'s text (the command it will run)."""

    def describe(self, plan: LaunchPlan) -> str:
        """Return text (whole lines, or ``""``) shown after the program in ``poprun plan``; secrets masked."""


class Formatting(Protocol):
    """Optional: a backend that offers views of a plan to ``poprun plan --format NAME``."""

    def formats(self) -> Mapping[str, PlanFormat]:
        """Return the views by format name (``{"sbatch": ...}``)."""


class TopologyProbing(Protocol):
    """Optional: a backend that can read other hosts' CPU topologies, for placement."""

    def probe_topologies(self, hosts: tuple[str, ...], *,
                         environ: Mapping[str, str]) -> Mapping[str, HostTopology | str]:
        """Return each host's topology, or a one-line reason it could not be read; bounded in time."""


class Closes(Protocol):
    """
    Optional: a backend with local state (the ssh backend's kept connections), released by :meth:`close`.

    The registry that made the backend calls it from its own ``close()``, which a command calls
    in a ``finally`` once its launches have ended (TorchX's ``Scheduler.close()``).
    """

    def close(self) -> None:
        """Release what the backend keeps (connections, directories); idempotent, safe after a failure or a signal."""


class HostCommands(Protocol):
    """
    Optional: a backend that runs a short command on a host it launches on, as its instances would run there.

    The apply step uses it before each attempt (a free port on instance 0's host: the port plan)
    and before stopping a run that timed out or stalled (where each instance was: stacks).
    """

    def run_on_host(self, host: str, script: str, *, environ: Mapping[str, str],
                    timeout_s: float) -> tuple[int, bytes]:
        """
        Run ``script`` (POSIX sh, handed over on its standard input, never in an argv) on ``host``.

        Return its exit status and its standard output (at most 1 MiB). Its standard error is
        dropped. Bounded by ``timeout_s`` (then 124). A remote backend reuses the connection
        its launch uses, or leaves one that the launch reuses. ``environ``: the launching
        environment (ssh options, Slurm's variables).

        Raises:
            LaunchError: when the host cannot be reached (the message says why, in one line).
        """


class HostStates(Protocol):
    """
    Optional: a backend that knows which hosts cannot run instances now, as its scheduler says.

    With a membership policy (docs/membership.md), the apply step asks it before each restart:
    such hosts are left out of the next attempt, like a host that was lost.
    """

    def unavailable_hosts(self, hosts: tuple[str, ...], *, environ: Mapping[str, str]) -> Mapping[str, str]:
        """Return the hosts of ``hosts`` that cannot run instances now (a node drained or down in Slurm), with why."""


class Prepares(Protocol):
    """
    Optional: a backend that gets ready for a launch ahead of it (the ssh backend opens its hosts' connections).

    The apply step calls :meth:`prepare` just before it runs a host command on instance 0's host
    (the port plan), when that host is another machine.
    """

    def prepare(self, plan: LaunchPlan, *, environ: Mapping[str, str]) -> None:
        """
        Get ready to launch ``plan`` soon; what it opens, the launch (or :meth:`HostCommands.run_on_host`) uses.

        Never raises for a host: what fails here, the launch reports. Whatever it made is gone
        when poprun ends, even if no launch followed or poprun was killed.
        """


