"""The topology graph: DOT quoting, ranges, cells, the grouping rule for large plans, --expand."""

import re

import pytest

from poprun.planner.context import Context
from poprun.planner.flags import parse_flags
from poprun.planner.plan import LaunchPlan
from poprun.planner.solve import solve
from poprun.render.graph import GROUP_ABOVE, cells, group_cells, quote, ranges, render_dot

CTX = Context(environ={"PATH": "/bin"}, cwd="/w")


def plan_of(*argv: str) -> LaunchPlan:
    return solve(parse_flags([*argv, "python3", "train.py"]).spec, CTX).plan


def labels(dot: str) -> list[str]:
    return re.findall(r'label="((?:[^"\\]|\\.)*)"', dot)


@pytest.mark.parametrize(("text", "expected"), [
    ("plain", '"plain"'),
    ('say "hi"', '"say \\"hi\\""'),
    ("back\\slash", '"back\\\\slash"'),
    ("two\nlines", '"two\\nlines"'),
    ("crlf\r\nline", '"crlf\\nline"'),
])
def test_quote_escapes_quotes_backslashes_and_newlines(text, expected):
    assert expected == quote(text)


def test_quote_left_justifies_every_line():
    assert '"a\\lb\\l"' == quote("a\nb", left=True)


@pytest.mark.parametrize(("numbers", "expected"), [
    ([0], "0"), ([0, 1, 2, 3], "0-3"), ([5, 0, 1, 2], "0-2,5"), ([1, 3, 3], "1,3"), (range(16, 32), "16-31"),
])
def test_ranges_collapse_consecutive_numbers(numbers, expected):
    assert expected == ranges(numbers)


def test_cells_cut_where_host_or_ild_changes():
    # GIVEN two hosts of two instances each, over two ILDs, then one host over two ILDs
    by_host = cells(plan_of("--num-replicas=8", "--num-instances=4", "--host=pod[1-2]", "--num-ilds=2"))
    split = cells(plan_of("--num-replicas=8", "--num-instances=4", "--host=pod1", "--num-ilds=2"))

    # THEN
    assert [(0, "pod1", 2), (1, "pod2", 2)] == [(c.ild, c.host, len(c.instances)) for c in by_host]
    assert [(0, "pod1", 2), (1, "pod1", 2)] == [(c.ild, c.host, len(c.instances)) for c in split]


def test_small_plan_draws_every_host_and_instance():
    dot = render_dot(plan_of("--num-replicas=64", "--num-instances=16", "--host=pod[1-4]"))

    assert 16 == dot.count('[fillcolor="#fdf3e1", label="instance ')
    assert ["host pod1", "host pod2", "host pod3", "host pod4"] == [x for x in labels(dot) if x.startswith("host")]
    assert "instance 5\\nlocal 1, GCD 5\\nreplicas 20-23\\nIPUs 20-23" in labels(dot)


def test_large_plan_groups_alike_hosts_and_ilds():
    # GIVEN 64 hosts of 4 instances of 4 replicas: more than GROUP_ABOVE instances
    plan = plan_of("--num-replicas=1024", "--num-instances=256", "--host=pod[1-64]")
    assert len(plan.instances) > GROUP_ABOVE

    # WHEN
    dot = render_dot(plan)

    # THEN one ILD cluster, one host cluster, one node for all 256 instances
    assert "ILDs 0-15 x 4 hosts each" in labels(dot)
    assert "pod[1-64] x 4 instances each" in labels(dot)
    assert ("instances 0-255\\nlocal 0-3 on each host\\nGCDs 0-255\\nreplicas 0-1023 (4 replicas each)\\n"
            "IPUs 0-1023") in labels(dot)
    assert ["cluster_ild_0"] == re.findall(r'subgraph "(cluster_ild_\d+)" ', dot)
    assert len(dot.splitlines()) < 20


def test_grouping_keeps_unlike_ilds_apart():
    # GIVEN instances that split one host between ILDs: the ILD runs have the same cells, so they merge
    plan = plan_of("--num-replicas=128", "--num-instances=64", "--host=pod[1-2]", "--num-ilds=4", "--offline-mode=yes")

    # WHEN
    groups = group_cells(cells(plan), grouped=True)

    # THEN
    assert [(0, 1, 2, 3)] == [g[0].ilds for g in groups]
    assert [("pod1", "pod2")] == [g[0].hosts for g in groups]
    assert "ILDs 0-3 x 16 instances each" in labels(render_dot(plan))


def test_expand_draws_large_plans_in_full_with_a_node_per_replica():
    plan = plan_of("--num-replicas=128", "--num-instances=64", "--host=pod[1-16]", "--ipus-per-replica=2")

    dot = render_dot(plan, expand=True)

    assert 16 == sum(1 for x in labels(dot) if x.startswith("host pod"))
    assert 128 == sum(1 for x in labels(dot) if x.startswith("replica "))
    assert "replica 127\\nIPUs 254-255" in labels(dot)
    assert "instance 63: local 3, GCD 63" in labels(dot)


def test_partition_note_lists_its_actions_and_offline_plans_say_so():
    online = render_dot(plan_of("--num-replicas=4", "--vipu-partition=p4", "--update-partition=yes"))
    offline = render_dot(plan_of("--num-replicas=4", "--offline-mode=yes", "--offline-target=pod16"))

    assert "partition p4\\lV-IPU server localhost:8090\\l4 IPUs, 1 GCD, 1 ILD\\l- use partition" in online
    assert "(--update-partition=yes)\\l" in online
    assert 'label="no partition (offline mode)\\loffline target pod16\\l"' in offline


def test_dot_is_deterministic_and_ends_with_a_newline():
    argv = ("--num-replicas=32", "--num-instances=2", "--num-ilds=2", "--host=pod[1-2]")

    assert render_dot(plan_of(*argv)) == render_dot(plan_of(*argv))
    assert render_dot(plan_of(*argv)).endswith("}\n")
