"""
Golden tests for the ``--print-topology=yes`` table.

Each scenario's expected text is in ``tests/golden/topology/<scenario>.txt`` and
is compared byte for byte. Set ``POPRUN_UPDATE_GOLDEN=1`` to rewrite the files
from the renderer's output instead. Tables quoted from real poprun output are
also checked against the quotation, so rewriting cannot hide a regression.
"""

import os
from collections.abc import Sequence
from pathlib import Path

import pytest

from poprun.render.topology import TopologyRow, render_topology

_GOLDEN = Path(__file__).parent / "topology"

_REAL_ONE_INSTANCE_FOUR_REPLICAS = """\
 ===========================
|      poprun topology      |
|===========================|
| hosts     | gc-poplar-02  |
|-----------|---------------|
| ILDs      |       0       |
|-----------|---------------|
| instances |       0       |
|-----------|---------------|
| replicas  | 0 | 1 | 2 | 3 |
 ---------------------------
"""

_REAL_TWO_INSTANCES_TWO_REPLICAS = """\
 ===================
|  poprun topology  |
|===================|
| hosts     |  [0]  |
|-----------|-------|
| ILDs      |   0   |
|-----------|-------|
| instances | 0 | 1 |
|-----------|-------|
| replicas  | 0 | 1 |
 -------------------
"""

_REAL_ONE_INSTANCE_SIXTEEN_REPLICAS = """\
 ===========================================================================================
|                                      poprun topology                                      |
|===========================================================================================|
| hosts     |                                   localhost                                   |
|-----------|-------------------------------------------------------------------------------|
| ILDs      |                                       0                                       |
|-----------|-------------------------------------------------------------------------------|
| instances |                                       0                                       |
|-----------|-------------------------------------------------------------------------------|
| replicas  | 0  | 1  | 2  | 3  | 4  | 5  | 6  | 7  | 8  | 9  | 10 | 11 | 12 | 13 | 14 | 15 |
 -------------------------------------------------------------------------------------------
"""

_SEED_GUIDE_CONTENT_ROWS = [
    "|              poprun topology              |",
    "| hosts     |           localhost           |",
    "| ILDs      |               0               |",
    "| instances |       0       |       1       |",
    "| replicas  | 0 | 1 | 2 | 3 | 4 | 5 | 6 | 7 |",
]


def _layout(
    hosts: Sequence[str], instances_per_host: int, replicas: int, ilds: int = 1
) -> list[TopologyRow]:
    """Build rows: each host runs the same number of instances of ``replicas``."""
    count = len(hosts) * instances_per_host
    return [
        TopologyRow(
            index=i,
            host=hosts[i // instances_per_host],
            ild=i * ilds // count,
            replica_offset=i * replicas,
            num_replicas=replicas,
        )
        for i in range(count)
    ]


def _assert_golden(scenario: str, actual: str) -> None:
    """Compare ``actual`` with the scenario's golden file, or rewrite the file."""
    path = _GOLDEN / f"{scenario}.txt"
    if os.environ.get("POPRUN_UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(actual.encode())
        return
    assert path.is_file(), f"{path} is missing; set POPRUN_UPDATE_GOLDEN=1 to create it"
    expected = path.read_bytes().decode()
    assert actual == expected, (
        f"topology table differs from {path}; "
        "set POPRUN_UPDATE_GOLDEN=1 to update the golden file"
    )


def _content_rows(table: str) -> list[str]:
    """Return the table's rows that hold text, without its rules and separators."""
    return [
        line
        for line in table.splitlines()
        if line.startswith("|") and not line.startswith(("|=", "|-"))
    ]


def test_one_instance_with_four_replicas_matches_real_poprun() -> None:
    """One instance of four replicas on one host renders as real poprun did."""
    table = render_topology(_layout(["gc-poplar-02"], 1, 4))
    assert table == _REAL_ONE_INSTANCE_FOUR_REPLICAS
    _assert_golden("single_host_one_instance_four_replicas", table)


def test_host_name_too_wide_for_two_replicas_is_tagged_and_listed() -> None:
    """A host name wider than its cell shows as [0] and is listed after the table."""
    table = render_topology(_layout(["localhost"], 2, 1))
    assert table == _REAL_TWO_INSTANCES_TWO_REPLICAS + "[0]: localhost\n"
    _assert_golden("two_instances_one_replica_each_tag_the_host", table)


def test_two_digit_replicas_widen_every_replica_cell() -> None:
    """Sixteen replicas on one instance pad every replica cell to two digits."""
    table = render_topology(_layout(["localhost"], 1, 16))
    assert table == _REAL_ONE_INSTANCE_SIXTEEN_REPLICAS
    _assert_golden("single_host_one_instance_sixteen_replicas", table)


def test_seed_guide_example_has_the_guides_content_rows() -> None:
    """Two instances of four replicas on localhost give the seed guide's rows."""
    table = render_topology(_layout(["localhost"], 2, 4))
    assert _content_rows(table) == _SEED_GUIDE_CONTENT_ROWS
    _assert_golden("single_host_two_instances_eight_replicas", table)


def test_four_hosts_each_span_seventy_nine_columns() -> None:
    """Four hosts of four instances of four replicas give 79-wide host cells."""
    hosts = [f"gc-poplar-0{i}" for i in range(1, 5)]
    table = render_topology(_layout(hosts, 4, 4))
    hosts_row = table.splitlines()[3]
    cells = hosts_row.split("|")[2:-1]
    assert [cell.strip() for cell in cells] == hosts
    assert [len(cell) for cell in cells] == [79] * 4
    _assert_golden("four_hosts_sixteen_instances_sixty_four_replicas", table)


def test_two_ilds_over_four_hosts_each_span_two_hosts() -> None:
    """Two ILDs over four hosts each span the replicas of two hosts."""
    hosts = [f"gc-pod-host-0{i}" for i in range(1, 5)]
    table = render_topology(_layout(hosts, 2, 2, ilds=2))
    ilds_row = table.splitlines()[5]
    assert [cell.strip() for cell in ilds_row.split("|")[2:-1]] == ["0", "1"]
    _assert_golden("four_hosts_two_ilds_eight_instances_sixteen_replicas", table)


def test_only_hosts_that_do_not_fit_are_tagged_and_listed() -> None:
    """A short host name stays in the table while a long one becomes [1]."""
    table = render_topology(_layout(["gc-01", "gc-poplar-02.cluster.example"], 1, 2))
    assert table.splitlines()[3] == "| hosts     | gc-01 |  [1]  |"
    assert table.endswith(
        " ---------------------------\n[1]: gc-poplar-02.cluster.example\n"
    )
    _assert_golden("long_host_name_is_tagged_and_listed_after_the_table", table)


def test_single_replica_cells_widen_to_fit_the_host_tag() -> None:
    """A single replica's cell widens so that the host tag [0] fits with spaces."""
    table = render_topology(_layout(["localhost"], 1, 1))
    assert "| hosts     | [0] |" in table.splitlines()
    _assert_golden("single_replica_widens_to_fit_the_host_tag", table)


def test_empty_topology_is_rejected() -> None:
    """Rendering no instances raises ValueError rather than an empty table."""
    with pytest.raises(ValueError, match="at least one instance"):
        render_topology([])


def test_devices_row_under_the_instances_when_devices_are_assigned() -> None:
    """--devices-per-instance: a devices row, each instance's devices over its replicas; wide lists widen the cells."""
    rows = [TopologyRow(index=i, host="hgx1" if i < 2 else "hgx2", ild=0, replica_offset=i, num_replicas=1,
                        devices=f"{4 * (i % 2)},{4 * (i % 2) + 1},{4 * (i % 2) + 2},{4 * (i % 2) + 3}")
            for i in range(4)]

    table = render_topology(rows)

    _assert_golden("devices_four_gpus_each_on_two_hosts", table)
    assert "| devices   |" in table
    assert "devices" not in render_topology(_layout(["hgx1"], 2, 1))  # none assigned: real poprun's table


def test_an_instance_without_devices_shows_a_dash_in_the_devices_row() -> None:
    """A row of a plan where some instance has no device (a saved plan edited): '-' rather than an empty cell."""
    rows = [TopologyRow(0, "h", 0, 0, 2, "0"), TopologyRow(1, "h", 0, 2, 2, "")]

    assert "| devices   |   0   |   -   |" in render_topology(rows)
