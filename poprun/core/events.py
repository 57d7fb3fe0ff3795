"""
What happens during a launch, as typed events: the seed of a run's event stream.

Layer: ``poprun.core``; imports only the standard library and :mod:`poprun.core.record`.

Backends report :class:`InstanceStarted` and :class:`InstanceEnded`; the apply step
(:mod:`poprun.apply`) reports its own steps around them. Every event is a record with a
stable ``kind`` and plain fields (ints, strings, tuples of them), so that :func:`to_dict` and
:func:`from_dict` turn it into JSON-ready data and back: ``{"v": 1, "event": KIND, ...}``.
``VERSION`` changes only when a field changes meaning or goes away; new kinds and new fields
with defaults keep it, and a reader skips kinds it does not know.
"""

from __future__ import annotations

from poprun.core.record import fields, record

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from typing import Any, ClassVar

VERSION = 1


@record
class InstanceStarted:
    """Instance ``index`` runs as process ``pid`` (on its host)."""

    kind: ClassVar[str] = "instance-started"

    index: int
    pid: int


@record
class InstanceEnded:
    """
    Instance ``index`` (process ``pid``) ended: ``exit_code``, or killed by ``signal``.

    ``stopped`` as in :class:`InstanceFailure`: poprun was already stopping the launch;
    ``lost``: its host stopped answering (its status is then the ssh client's).
    """

    kind: ClassVar[str] = "instance-ended"

    index: int
    pid: int
    exit_code: int | None = None
    signal: int | None = None
    stopped: bool = False
    lost: bool = False

    @property
    def status(self) -> int:
        """Return the exit code, or 128+N for signal N."""
        return 128 + self.signal if self.signal is not None else self.exit_code or 0


Event = InstanceStarted | InstanceEnded
_KINDS: dict[str, type[Event]] = {cls.kind: cls for cls in (InstanceStarted, InstanceEnded)}


def to_dict(event: Event) -> dict[str, Any]:
    """Return ``event`` as JSON-ready data: ``{"v": VERSION, "event": kind, field: value ...}``."""
    data: dict[str, Any] = {"v": VERSION, "event": event.kind}
    for field in fields(type(event)):
        value = getattr(event, field.name)
        data[field.name] = list(value) if isinstance(value, tuple) else value
    return data


def from_dict(data: dict[str, Any]) -> Event | None:
    """Return the event that :func:`to_dict` made, or None for a kind or a version this poprun does not know."""
    cls = _KINDS.get(data.get("event", ""))
    if cls is None or data.get("v") != VERSION:
        return None
    names = {f.name for f in fields(cls)}
    values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in data.items() if k in names}
    return cls(**values)
