"""
What happens during a launch, as typed events: the seed of a run's event stream.

Layer: ``poprun.core``; imports only the standard library, :mod:`poprun.core.record` and :mod:`poprun.core.exitstatus`.

Backends report :class:`InstanceStarted` and :class:`InstanceEnded`; the apply step
(:mod:`poprun.apply`) reports its own steps around them. Every event is a record with a
stable ``kind`` and plain fields (ints, strings, tuples of them), so that :func:`to_dict` and
:func:`from_dict` turn it into JSON-ready data and back: ``{"v": 1, "event": KIND, ...}``.
``VERSION`` changes only when a field changes meaning or goes away; new kinds and new fields
with defaults keep it, and a reader skips kinds it does not know.
"""

from __future__ import annotations

from poprun.core.exitstatus import SIGNALLED
from poprun.core.record import fields, record

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any, ClassVar

VERSION = 1


@record
class InstanceStarted:
    """Instance ``index`` runs as process ``pid`` (on its host)."""

    kind: ClassVar[str] = "instance-started"

    index: int
    pid: int
    host: str = ""  # filled in by the apply step from the plan
    restart: int = 0  # how many times this instance was started again before (--restart-scope instance)


@record
class InstanceEnded:
    """
    Instance ``index`` (process ``pid``) ended: ``exit_code``, or killed by ``signal``.

    ``stopped`` as in :class:`InstanceFailure`: poprun was already stopping the launch;
    ``lost``: its host stopped answering (its status is then the ssh client's); ``via``: when
    it is the relay through which its host was reached that stopped answering, that relay.
    """

    kind: ClassVar[str] = "instance-ended"

    index: int
    pid: int
    exit_code: int | None = None
    signal: int | None = None
    stopped: bool = False
    lost: bool = False
    via: str = ""
    restarting: bool = False  # the backend starts it again (--restart-scope instance): the run goes on

    @property
    def status(self) -> int:
        """Return the exit code, or 128+N for signal N."""
        return SIGNALLED + self.signal if self.signal is not None else self.exit_code or 0


@record
class RunStarted:
    """
    A run begins: its id (empty without a run record), the backend, the instances and hosts of the plan.

    The first event of a run's stream.
    """

    kind: ClassVar[str] = "run-started"

    run: str
    backend: str
    instances: int
    hosts: tuple[str, ...] = ()


@record
class HostChecked:
    """
    A host's preflight answered (the ssh backend): whether it can run its instances, and why not.

    ``problem`` is the diagnostic's code and summary (``PR409: 'h2' cannot run the program``),
    "" when the host passed.
    """

    kind: ClassVar[str] = "host-checked"

    host: str
    ok: bool
    problem: str = ""


@record
class HealthChecked:
    """
    The plan's health check ended on ``host`` (before an attempt starts): ``outcome`` passed, failed, timed out or unreachable.

    ``status``: the check's exit status (None when it timed out or could not run); ``ms``: how
    long it took; ``tail``: its output's last lines (standard output and error together,
    printable-escaped, secrets masked); ``reason``: why the host could not be reached.
    """

    kind: ClassVar[str] = "health-check"

    host: str
    ok: bool
    outcome: str = ""
    status: int | None = None
    ms: int = 0
    tail: tuple[str, ...] = ()
    reason: str = ""


@record
class HostConnected:
    """
    The ssh backend's shared connection to a host is up: how long it took (from the moment it was opened, in the fan-out window) and in how many attempts.

    ``slow``: it took much longer than the others (or more than one attempt): the host answers,
    but late; ``-v`` names it.
    """

    kind: ClassVar[str] = "host-connected"

    host: str
    ms: int
    attempts: int = 1
    slow: bool = False


@record
class PhaseEnded:
    """
    A phase of a launch ended, after ``ms`` milliseconds.

    ``phase``: ``connect`` (the ssh backend's shared connections to every host), ``preflight``
    (every host's check answered), ``start`` (every instance told to start: the last of them
    started), ``first-output`` (every instance printed something; ``detail`` says how many did
    when not all did before the launch ended).
    """

    kind: ClassVar[str] = "phase-ended"

    phase: str
    ms: int
    detail: str = ""


@record
class PartitionAcquiring:
    """The partition step began: the partition is being acquired from the V-IPU service."""

    kind: ClassVar[str] = "partition-acquiring"

    partition: str | None = None  # its name, when the plan names it


@record
class PartitionAcquired:
    """The partition is this launch's: its variables are in every instance's environment."""

    kind: ClassVar[str] = "partition-acquired"

    partition: str | None = None


@record
class PartitionReleased:
    """The partition was released (and removed, when poprun created it), whatever the launch did."""

    kind: ClassVar[str] = "partition-released"

    partition: str | None = None


@record
class LaunchStarting:
    """
    The backend starts the instances of the plan.

    ``variables`` are what the apply step added to every instance's environment (the
    partition's, the temporary executable cache's), sorted by name; ``cache`` is the temporary
    executable cache, or None.
    """

    kind: ClassVar[str] = "launch-starting"

    backend: str
    instances: int
    variables: tuple[tuple[str, str], ...] = ()
    cache: str | None = None


@record
class LaunchRunning:
    """The backend has started every instance; poprun waits for them."""

    kind: ClassVar[str] = "launch-running"


@record
class Stopping:
    """Every instance is being stopped, and why (told once, for the first reason)."""

    kind: ClassVar[str] = "stopping"

    reason: str


@record
class InstanceOutputTruncated:
    """The run record keeps no more of instance ``index``'s output: ``kept`` bytes were kept (the limit per instance)."""

    kind: ClassVar[str] = "instance-output-truncated"

    index: int
    kept: int


@record
class MpiWithoutLauncher:
    """
    Instance ``index`` has an MPI library loaded (``library``, its path) though no MPI launcher started it.

    Its MPI world is itself alone (the local and offline backends start no MPI launcher): told
    once per launch, for the first instance found; ``--backend mpirun`` makes them one world.
    """

    kind: ClassVar[str] = "mpi-without-launcher"

    index: int
    library: str


@record
class Teardown:
    """Every instance has ended; what the launch made is being undone (the cache, the partition)."""

    kind: ClassVar[str] = "teardown"


@record
class LaunchEnded:
    """Every instance has ended: each one's status by index, and the root cause's index, or None."""

    kind: ClassVar[str] = "launch-ended"

    statuses: tuple[int, ...]
    root_cause: int | None = None


@record
class RunEnded:
    """
    The run is over: poprun's exit status and the root cause's index, or None; the last event of a run's stream.

    ``error`` is poprun's own failure in one line ("" when none).
    """

    kind: ClassVar[str] = "run-ended"

    status: int
    root_cause: int | None = None
    error: str = ""


@record
class AttemptStarted:
    """
    Attempt ``attempt`` of the run begins (0 first, then one per restart of every instance).

    ``master_port`` is the instances' MASTER_PORT for this attempt (chosen at apply time when
    ``chosen``, else the user's), 0 when the plan has none.
    """

    kind: ClassVar[str] = "attempt-started"

    attempt: int
    master_port: int = 0
    chosen: bool = False


@record
class AttemptEnded:
    """
    Attempt ``attempt`` ended with poprun's ``status`` for it; ``restart``: the run starts again, in ``delay_ms``.

    ``reason`` says why in one line: what failed, and why it is or is not restarted (the budget,
    a status never retried, the crash-loop guard, the pre-restart command, a stop).
    """

    kind: ClassVar[str] = "attempt-ended"

    attempt: int
    status: int
    root_cause: int | None = None
    restart: bool = False
    delay_ms: int = 0
    reason: str = ""


@record
class Replan:
    """
    Attempt ``attempt`` runs on other hosts than the one before: the plan was solved again (docs/membership.md).

    ``removed`` are the hosts left out (lost, failed their preflight or their health check),
    ``added`` the spares that took their places, ``shrunk`` whether the plan has fewer hosts;
    ``hosts``, ``instances`` and ``replicas`` are the new plan's; ``reason`` says what changed
    and why, in one line.
    """

    kind: ClassVar[str] = "replan"

    attempt: int
    removed: tuple[str, ...]
    added: tuple[str, ...] = ()
    shrunk: bool = False
    hosts: tuple[str, ...] = ()
    instances: int = 0
    replicas: int = 0
    reason: str = ""


@record
class LimitReached:
    """
    A time limit was reached: ``limit`` ``timeout`` (the run's), ``stall`` (no output) or ``signal`` (``--signal``'s).

    ``after_ms``: since the run started (timeout, signal) or since the last output (stall);
    ``signal``: the signal sent to every instance (``signal`` only), else 0.
    """

    kind: ClassVar[str] = "limit-reached"

    limit: str
    after_ms: int
    signal: int = 0


@record
class StacksCollected:
    """Where each Python instance was, read before a timed-out or stalled run was stopped: ``instances`` that have a stack."""

    kind: ClassVar[str] = "stacks-collected"

    instances: tuple[int, ...]
    how: str = ""


@record
class InstanceProgressed:
    """
    Instance ``index`` on ``host`` said how far it is (``popdist.progress``; docs/progress.md): its latest state.

    ``step`` (None: heartbeats only) of ``total`` (None: unknown); ``step_time_ms``: its median
    step time over the last W steps; ``eta_ms``: what is left at that pace; ``metrics``: its
    latest, as (name, value) pairs. At most one a second per instance, and each instance's last
    state as its attempt ends.
    """

    kind: ClassVar[str] = "instance-progress"

    index: int
    host: str
    attempt: int
    step: float | None = None
    total: int | None = None
    step_time_ms: float | None = None
    eta_ms: int | None = None
    metrics: tuple[tuple[str, float | str | None], ...] = ()


Event = (RunStarted | HostChecked | HealthChecked | HostConnected | PhaseEnded | InstanceStarted | InstanceEnded | InstanceOutputTruncated | PartitionAcquiring | PartitionAcquired
         | PartitionReleased | LaunchStarting | LaunchRunning | Stopping | LaunchEnded | Teardown | RunEnded
         | AttemptStarted | AttemptEnded | Replan | LimitReached | StacksCollected | MpiWithoutLauncher
         | InstanceProgressed)
_KINDS: dict[str, type[Event]] = {cls.kind: cls for cls in (
    RunStarted, HostChecked, HealthChecked, HostConnected, PhaseEnded, PartitionAcquiring, PartitionAcquired, PartitionReleased, LaunchStarting, InstanceStarted,
    InstanceOutputTruncated, LaunchRunning, InstanceEnded, Stopping, LaunchEnded, Teardown, RunEnded,
    AttemptStarted, AttemptEnded, Replan, LimitReached, StacksCollected, MpiWithoutLauncher, InstanceProgressed)}


def to_dict(event: Event) -> dict[str, Any]:
    """Return ``event`` as JSON-ready data: ``{"v": VERSION, "event": kind, field: value ...}``."""
    data: dict[str, Any] = {"v": VERSION, "event": event.kind}
    for field in fields(type(event)):
        value = getattr(event, field.name)
        data[field.name] = _plain(value)
    return data


def from_dict(data: object) -> Event | None:
    """
    Return the event that :func:`to_dict` made, or None for a kind or a version this poprun does not know.

    Data that is not such an event (not an object, a required field missing, a field of another
    type than declared) is None too: a reader of events written by someone else never gets an
    exception from here. Fields this poprun does not know are skipped.
    """
    if not isinstance(data, dict):
        return None
    kind, version = data.get("event"), data.get("v")
    cls = _KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None or type(version) is not int or version != VERSION:
        return None
    values: dict[str, Any] = {}
    for field in fields(cls):
        if field.name not in data:
            if field.required:
                return None
            continue
        value = _tuple(data[field.name])
        if not _TYPES[cls.__annotations__[field.name]](value):
            return None
        values[field.name] = value
    return cls(**values)


def _plain(value: object) -> object:
    return [_plain(v) for v in value] if isinstance(value, tuple) else value


def _tuple(value: object) -> object:
    return tuple(_tuple(v) for v in value) if isinstance(value, list) else value


def _is_int(value: object) -> bool:
    return type(value) is int  # not a bool


def _is_number(value: object) -> bool:
    return (type(value) is int or type(value) is float) and value - value == 0  # finite, not a bool


# What a field's value may be, by its annotation (every annotation of every event is here; a test checks)
_TYPES: dict[str, Callable[[object], bool]] = {
    "int": _is_int,
    "int | None": lambda v: v is None or _is_int(v),
    "bool": lambda v: type(v) is bool,
    "str": lambda v: type(v) is str,
    "str | None": lambda v: v is None or type(v) is str,
    "tuple[int, ...]": lambda v: type(v) is tuple and all(_is_int(i) for i in v),
    "tuple[str, ...]": lambda v: type(v) is tuple and all(type(i) is str for i in v),
    "float | None": lambda v: v is None or _is_number(v),
    "tuple[tuple[str, float | str | None], ...]": lambda v: type(v) is tuple and all(
        type(p) is tuple and len(p) == len(("name", "value")) and type(p[0]) is str
        and (p[1] is None or type(p[1]) is str or _is_number(p[1])) for p in v),
    "tuple[tuple[str, str], ...]": lambda v: type(v) is tuple and all(
        type(p) is tuple and len(p) == len(("name", "value")) and all(type(i) is str for i in p) for p in v),
}
