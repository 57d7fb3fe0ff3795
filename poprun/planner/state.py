"""
The solver's working state: the spec, the context, the decisions so far and the diagnostics.

Layer: ``poprun.planner``; shared by :mod:`solve`, :mod:`policy`, :mod:`environment` and :mod:`binding`.
"""

from __future__ import annotations

from poprun.core.diagnostic import Diagnostics, error, warning
from poprun.core.span import SourceSpan
from poprun.planner import plan as p
from poprun.planner.context import Context
from poprun.planner.spec import Sourced, Spec

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from typing import TypeVar

    from poprun.planner.machine import HostTopology

    T = TypeVar("T")


class Solver:
    """One solve: the spec, the context, and what was decided so far."""

    def __init__(self, spec: Spec, ctx: Context) -> None:
        self.spec = spec
        self.ctx = ctx
        self.diags = Diagnostics()
        self.decisions: list[p.Decision] = []
        # Hosts' topologies read so far (placement, then devices, read each host once): a topology, why not, or None.
        self.topologies: dict[str, HostTopology | str | None] = {}

    # -- recording ---------------------------------------------------------------------
    def decide(self, key: str, value: T, origin: SourceSpan, reason: str) -> T:
        """Record a decision and return its value."""
        self.decisions.append(p.Decision(key=key, value=_shown(key, value), source=origin.describe(), reason=reason))
        return value

    def pick(self, key: str, given: Sourced[T] | None, default: T, reason: str) -> T:
        """Decide ``key`` from the spec, else from ``default``."""
        if given is not None:
            return self.decide(key, given.value, given.origin, "as given")
        return self.decide(key, default, SourceSpan.default(key), reason)

    def fail(self, code: str, summary: str, *, detail: str, span: SourceSpan, hint: str) -> None:
        """Record an error."""
        self.diags.add(error(code, summary, detail=detail, span=span, hint=hint))

    def warn(self, code: str, summary: str, *, detail: str, span: SourceSpan, hint: str) -> None:
        """Record a warning."""
        self.diags.add(warning(code, summary, detail=detail, span=span, hint=hint))

    def origin(self, name: str) -> SourceSpan:
        """Return where the user set ``name``, or a default span."""
        given = getattr(self.spec, name, None) if name != "hosts" else self.spec.hosts
        return given.origin if isinstance(given, Sourced) else SourceSpan.default(name)


def value_of(given: Sourced[T] | None) -> T | None:
    """Return the value of an optional spec value."""
    return given.value if given is not None else None


def is_on(given: Sourced[bool] | None) -> bool:
    """Return whether a yes/no option is given as yes."""
    return given is not None and given.value


def _shown(key: str, value: object) -> str | int | bool:
    """Return ``value`` as an explained decision shows it: tuples joined, None as JSON's null."""
    if isinstance(value, str | int | bool):
        return value
    if isinstance(value, tuple):
        return (" " if key == "program" else ",").join(map(str, value))
    if value is None:
        return "null"
    import json  # here, not at the top: the values above are all a launch has, and start-up stays lean

    return json.dumps(value)
