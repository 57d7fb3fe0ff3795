"""
What the views of run records draw: one run as ``poprun ps`` lists it.

Layer: ``poprun.core``; imports only :mod:`poprun.core.record`. :mod:`poprun.runs.store` makes
these from a run's directory, :mod:`poprun.render.runs` draws them: the two stay independent.
"""

from __future__ import annotations

from poprun.core.record import record


@record
class RunInfo:
    """
    What ``poprun ps`` says of one run.

    ``state``: ``running``, ``ended`` (``status`` is poprun's exit status), ``lost`` (the supervisor is gone
    and wrote no report) or ``damaged`` (``problem`` says which file of the record cannot be read).
    """

    id: str
    path: str
    state: str
    status: int | None = None
    started: float | None = None  # UNIX seconds
    ended: float | None = None
    instances: int | None = None
    hosts: tuple[str, ...] = ()
    argv: tuple[str, ...] = ()
    backend: str = ""
    problem: str = ""
    incomplete: str = ""  # why the record of an ended run stops short (a full disk); its report still says how it ended
    # a running run's progress (progress.json, docs/progress.md): its least advanced instance's step and that
    # instance's total (None: no progress heard, or unreadable), and the largest of its instances' ETAs
    step: float | None = None
    total: int | None = None
    eta_s: float | None = None
    # the interface collectives used on each host, as read at launch (plan.json's network: docs/network.md),
    # one "HOST INTERFACE ADDRESS (HOW)" each; () when nothing was decided
    network: tuple[str, ...] = ()

    def duration(self, now: float) -> float | None:
        """Return how long it ran (until now while it runs), or None when its start is not known."""
        if self.started is None:
            return None
        return max(0.0, (self.ended if self.ended is not None else now) - self.started)


def network_lines(plan: object) -> tuple[str, ...]:
    """
    Return a run's ``plan.json`` interfaces as ``poprun report`` shows them (docs/network.md), one per host.

    ``plan`` is the file's JSON, untrusted: () when it has none, or they are not well formed.
    """
    network = plan.get("network") if isinstance(plan, dict) else None
    hosts = network.get("hosts") if isinstance(network, dict) else None
    if not isinstance(hosts, list):
        return ()
    lines = []
    for h in hosts[:1024]:
        if not isinstance(h, dict) or not all(isinstance(h.get(k, ""), str) for k in ("host", "interface", "address", "how")):
            return ()
        if h.get("interface"):
            lines.append(f"{h['host']} {h['interface']} {h.get('address', '')} ({h.get('how', '')})")
    return tuple(lines)
