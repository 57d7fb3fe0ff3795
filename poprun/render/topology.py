"""
Render PopRun's ``--print-topology=yes`` table, byte for byte.

Layer: ``poprun.render``; imports only ``poprun.core`` and the standard
library/attrs.

The table has one column per replica. Hosts, ILDs and instances are cells
that span the replicas beneath them; their labels are centred, with the odd
space of padding (if any) on the right. Replica cells all have the same
width: the widest replica label plus one space each side, widened if needed
so that every spanning label fits with at least one space each side.
"""

from collections.abc import Callable, Sequence

from poprun.core.record import positional_record

_TITLE = "poprun topology"
_LABEL_WIDTH = 10  # the label column is ``" " + label.ljust(10)``
_LABEL_COLUMN = _LABEL_WIDTH + 1


@positional_record
class TopologyRow:
    """
    One instance of the topology table.

    Attributes:
        index: The instance index.
        host: The name of the host that runs the instance.
        ild: The index of the IPU-Link domain the instance's replicas are in.
        replica_offset: The global index of the instance's first replica.
        num_replicas: How many replicas the instance controls.
        devices: The instance's devices (``0,1``; ``--devices-per-instance``), "" for none: a
            ``devices`` row under the instances is drawn only when some instance has devices.
    """

    index: int
    host: str
    ild: int
    replica_offset: int
    num_replicas: int
    devices: str = ""


@positional_record
class _Span:
    """A run of consecutive replicas that share one label."""

    label: str
    replicas: int


def render_topology(rows: Sequence[TopologyRow]) -> str:
    r"""
    Render the topology table for ``rows``, sorted by instance index.

    A host whose name does not fit in its cell with one space each side is
    shown as ``[i]``, ``i`` being the host's position in order of appearance,
    and the table is then followed by a legend with one line per such host,
    ``[i]: full.host.name``.

    Args:
        rows: One row per instance; a host's and an ILD's rows are contiguous.

    Returns:
        The table's lines (and any legend lines), each ending with ``"\\n"``.

    Raises:
        ValueError: If ``rows`` is empty or an instance has no replicas.
    """
    _check(rows)
    hosts = _runs(rows, lambda row: row.host)
    tags = [_Span(f"[{i}]", host.replicas) for i, host in enumerate(hosts)]
    ilds = _runs(rows, lambda row: str(row.ild))
    instances = [_Span(str(row.index), row.num_replicas) for row in rows]
    devices = [_Span(row.devices or "-", row.num_replicas) for row in rows] if any(r.devices for r in rows) else []
    replicas = [
        str(row.replica_offset + j) for row in rows for j in range(row.num_replicas)
    ]
    width = _replica_width(replicas, [*tags, *ilds, *instances, *devices])
    shown = [host if _fits(host, width) else tag for host, tag in zip(hosts, tags, strict=True)]
    body = [
        _span_row("hosts", shown, width),
        _span_row("ILDs", ilds, width),
        _span_row("instances", instances, width),
        *([_span_row("devices", devices, width)] if devices else []),
        _row("replicas", [" " + label.ljust(width - 1) for label in replicas]),
    ]
    hidden = [(tag, host) for host, tag in zip(hosts, tags, strict=True) if not _fits(host, width)]
    legend = [f"{tag.label}: {host.label}" for tag, host in hidden]
    table = _frame(body, _span_width(len(replicas), width))
    return "".join(line + "\n" for line in [*table, *legend])


def _check(rows: Sequence[TopologyRow]) -> None:
    """Raise ValueError unless every one of at least one instance has replicas."""
    if not rows:
        raise ValueError("the topology table needs at least one instance")
    for row in rows:
        if row.num_replicas < 1:
            raise ValueError(
                f"instance {row.index} has {row.num_replicas} replicas; needs >= 1"
            )


def _runs(
    rows: Sequence[TopologyRow], key: Callable[[TopologyRow], str]
) -> list[_Span]:
    """Group consecutive rows with equal keys into spans labelled by the key."""
    spans: list[_Span] = []
    for row in rows:
        if spans and spans[-1].label == key(row):
            spans[-1] = _Span(spans[-1].label, spans[-1].replicas + row.num_replicas)
        else:
            spans.append(_Span(key(row), row.num_replicas))
    return spans


def _span_width(replicas: int, width: int) -> int:
    """Return the width of a cell over ``replicas`` cells of ``width``, with borders."""
    return replicas * (width + 1) - 1


def _fits(span: _Span, width: int) -> bool:
    """Return whether the span's label fits its cell with one space each side."""
    return len(span.label) + 2 <= _span_width(span.replicas, width)


def _replica_width(replicas: Sequence[str], spans: Sequence[_Span]) -> int:
    """Return the narrowest replica cell width that fits every label and the title."""
    width = max(len(label) for label in replicas) + 2
    needs = [(len(span.label) + 2, span.replicas) for span in spans]
    # the title spans the label column, its border and all the replica cells
    needs.append((len(_TITLE) + 2 - _LABEL_COLUMN - 1, len(replicas)))
    for need, count in needs:
        # the smallest w with count * (w + 1) - 1 >= need
        width = max(width, -(-(need + 1) // count) - 1)
    return width


def _centre(text: str, width: int) -> str:
    """Centre ``text`` in ``width`` columns; an odd padding space goes on the right."""
    left = (width - len(text)) // 2
    return " " * left + text + " " * (width - len(text) - left)


def _span_row(name: str, spans: Sequence[_Span], width: int) -> str:
    """Return the row ``name`` whose cells are the centred labels of ``spans``."""
    return _row(
        name, [_centre(span.label, _span_width(span.replicas, width)) for span in spans]
    )


def _row(name: str, cells: Sequence[str]) -> str:
    """Return a table row: the label column, then the cells, each closed by ``|``."""
    return f"| {name.ljust(_LABEL_WIDTH)}|" + "".join(cell + "|" for cell in cells)


def _frame(body: Sequence[str], data_width: int) -> list[str]:
    """Put the title, rules and separators around the body rows."""
    inner = _LABEL_COLUMN + 1 + data_width
    separator = "|" + "-" * _LABEL_COLUMN + "|" + "-" * data_width + "|"
    lines = [
        " " + "=" * inner,
        "|" + _centre(_TITLE, inner) + "|",
        "|" + "=" * inner + "|",
    ]
    for i, row in enumerate(body):
        lines.extend([separator, row] if i else [row])
    return [*lines, " " + "-" * inner]
