"""
The progress channel's values: one instance's datagram (:class:`Update`), what poprun knows of an instance (:class:`InstanceProgress`), and the parser.

Layer: ``poprun.core``; imports only :mod:`poprun.core.record` and the standard library (``json`` and
``hmac`` on the first :func:`parse`, never at import: a launch without a receiver loads neither).

The wire format, version 1 (``popdist/_progress.py`` writes it; ``docs/progress.md``): one UDP
datagram per send, at most :data:`MAX_DATAGRAM` bytes::

    b"PRP1 " + TOKEN (32 lowercase hex bytes) + b" " + JSON

the JSON a compact object: ``i`` instance index (int >= 0), ``a`` attempt (int >= 0), ``k``
``"p"`` (progress) or ``"h"`` (heartbeat), ``s`` step (int or finite float; progress only),
``n`` total (int or null), ``t`` the instance's ``time.time()`` of the last coalesced call,
``c`` calls coalesced (int >= 1), ``d`` the instance's own step time in seconds (finite float
>= 0, optional), ``m`` metrics (string keys of at most 64 characters to finite numbers, null or
strings of at most 64 characters), ``x`` metrics left out (int >= 0, optional). Keys this
version does not know are skipped, so that a later sender stays readable.

:func:`parse` never raises: a datagram that is not exactly that, or whose token is not the
run's (compared in constant time), is None, and the receiver counts it as dropped. A metric
entry that breaks its rules is left out (and counted in :attr:`Update.left_out`) rather than
losing the instance's step with it.
"""

from __future__ import annotations

from poprun.core.record import record

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from typing import TypeGuard

MAGIC = b"PRP1 "
TOKEN_BYTES = 32  # os.urandom(16).hex()
MAX_DATAGRAM = 1400
MAX_METRIC_KEY = 64
MAX_METRIC_TEXT = 64
_MAX_INDEX = 2**31 - 1
_PROGRESS, _HEARTBEAT = "p", "h"

Metric = float | str | None


@record
class Update:
    """
    One datagram of one instance, as :func:`parse` read it.

    ``step`` is None for a heartbeat; ``time``: the instance's own clock (``time.time()``) at the
    last call it coalesced; ``calls``: how many calls this datagram stands for; ``step_time``:
    the instance's own step time (``step_time=``), None when it gave none; ``metrics``: sorted
    pairs (name, value); ``left_out``: metrics the sender or the parser left out.
    """

    index: int
    attempt: int
    step: float | None
    total: int | None
    time: float
    calls: int = 1
    step_time: float | None = None
    metrics: tuple[tuple[str, Metric], ...] = ()
    left_out: int = 0

    @property
    def heartbeat(self) -> bool:
        """Whether this is a heartbeat (no step)."""
        return self.step is None


@record
class InstanceProgress:
    """
    What poprun knows of one instance of the current attempt (:meth:`poprun.apply.progress.Board.snapshot`).

    ``step`` is None while only heartbeats came; ``steps_per_s`` and ``step_time_s`` are over
    the last W step times (the median for ``step_time_s``); ``eta_s`` is ``(total - step) *
    step_time_s`` (never below 0), None without a total or a step time; ``heard_s``: seconds
    since poprun last heard from it; ``calls``: the calls it counted (the sum of ``c``);
    ``metrics``: its latest, as sorted pairs; ``straggler_ratio``: set by the straggler rule
    (None: not a straggler).
    """

    index: int
    host: str
    attempt: int
    step: float | None
    total: int | None
    steps_per_s: float | None
    step_time_s: float | None
    eta_s: float | None
    heard_s: float
    calls: int
    metrics: tuple[tuple[str, Metric], ...] = ()
    straggler_ratio: float | None = None


def parse(datagram: bytes, token: bytes) -> Update | None:
    """
    Return the update in ``datagram``, or None when it is not a well-formed version-1 datagram bearing ``token``.

    Never raises, whatever ``datagram`` holds; the token is compared in constant time.
    """
    try:
        return _parse(datagram, token)
    except Exception:  # noqa: BLE001 - any datagram whatever is None, never an exception (RecursionError, MemoryError's kin)
        return None


def _parse(datagram: bytes, token: bytes) -> Update | None:
    import hmac

    head = len(MAGIC) + TOKEN_BYTES
    if (type(datagram) is not bytes or len(datagram) > MAX_DATAGRAM or len(datagram) <= head + 1
            or len(token) != TOKEN_BYTES or not datagram.startswith(MAGIC) or datagram[head:head + 1] != b" "):
        return None
    if not hmac.compare_digest(datagram[len(MAGIC):head], token):
        return None
    data = _json(datagram[head + 1:])
    return _update(data) if type(data) is dict else None


def _json(body: bytes) -> object:
    import json

    text = body.decode("ascii")  # the sender writes ensure_ascii JSON: anything else is not ours
    return json.loads(text, parse_constant=_refuse_constant)


def _refuse_constant(name: str) -> object:
    raise ValueError(name)  # NaN, Infinity: not finite


def _update(data: dict[str, object]) -> Update | None:
    index, attempt, kind, calls = data.get("i"), data.get("a"), data.get("k"), data.get("c", 1)
    if not (_count(index, 0) and _count(attempt, 0) and _count(calls, 1)) or kind not in {_PROGRESS, _HEARTBEAT}:
        return None
    when = _finite(data.get("t"))
    if when is None:
        return None
    step: float | None = None
    total = data.get("n")
    if kind == _PROGRESS:
        sent = data.get("s")  # a whole step stays whole (a float would round one above 2**53)
        step = sent if type(sent) is int and abs(sent) < 2**63 else _finite(sent)
        if step is None or not (total is None or _count(total, 0)):
            return None
    else:
        total = None
    step_time = None
    if "d" in data:
        step_time = _finite(data["d"])
        if step_time is None or step_time < 0:
            return None
    left = data.get("x", 0)
    metrics, bad = _metrics(data.get("m", {}))
    if metrics is None or not _count(left, 0):
        return None
    return Update(index=index, attempt=attempt, step=step, total=total if isinstance(total, int) else None,
                  time=when, calls=calls, step_time=step_time, metrics=metrics, left_out=left + bad)


def _count(value: object, least: int) -> TypeGuard[int]:
    return type(value) is int and least <= value <= _MAX_INDEX


def _finite(value: object) -> float | None:
    if type(value) is not int and type(value) is not float:
        return None
    number = float(value)  # a huge int raises OverflowError (caught by parse)
    return number if number - number == 0 else None  # NaN and infinities are not finite


def _metrics(value: object) -> tuple[tuple[tuple[str, Metric], ...] | None, int]:
    """Return the metrics as sorted pairs and how many entries broke the rules, or (None, 0) when ``m`` is not an object."""
    if type(value) is not dict:
        return None, 0
    kept: list[tuple[str, Metric]] = []
    for key, item in value.items():
        metric = _metric(item)
        if len(key) > MAX_METRIC_KEY or metric is _BAD:
            continue
        kept.append((key, metric))  # type: ignore[arg-type] # not _BAD, checked above
    return tuple(sorted(kept, key=lambda pair: pair[0])), len(value) - len(kept)


_BAD = object()


def _metric(value: object) -> object:
    if value is None:
        return None
    if type(value) is bool:
        return float(value)
    if type(value) is str:
        return value if len(value) <= MAX_METRIC_TEXT else _BAD
    number = _finite(value) if type(value) is float or (type(value) is int and abs(value) < 2**1023) else None
    return _BAD if number is None else number
