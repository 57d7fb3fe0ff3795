"""Rank order: the natural order, the topology.conf reader (real and hostile files), Slurm's answer, and the plan."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from poprun.backends.mpirun.command import mpirun_command
from poprun.core.diagnostic import DiagnosticError
from poprun.core.record import evolve
from poprun.planner import plan as p
from poprun.planner.context import Context
from poprun.planner.flags import parse_flags
from poprun.planner.rankorder import natural, order, parse_topology, scontrol_topology
from poprun.planner.serde import from_json, to_json
from poprun.planner.solve import Solution, solve

CTX = Context(environ={"PATH": "/usr/bin"}, cwd="/work", local_names=("localhost", "me"))

# topology.conf of Slurm's topology guide: a two-level tree, leaves under two spines under a root.
TREE = """\
# topology.conf
# Switch Configuration
SwitchName=s0 Nodes=tux[0-3]  LinkSpeed=900
SwitchName=s1 Nodes=tux[4-7]
SwitchName=s2 Nodes=tux[8-11]
SwitchName=s3 Switches=s[0-1]
SwitchName=s4 Switches=s2
SwitchName=s5 Switches=s[3-4]
"""
# topology.conf of the block plugin (Slurm 23.11+): blocks in the file's order, and their sizes.
BLOCK = """\
BlockName=block1 Nodes=node[01-04]
BlockName=block2 Nodes=node[05-08]
BlockName=block3 Nodes=node[09-12]
BlockSizes=4,8
"""
# scontrol show topology of Slurm 22.05 (the test cluster's): a parent lists every node below it.
SCONTROL_OUTPUT = """\
SwitchName=leaf1 Level=0 LinkSpeed=1 Nodes=h2
SwitchName=leaf2 Level=0 LinkSpeed=100 Nodes=h1,h3
SwitchName=spine Level=1 LinkSpeed=1 Nodes=h[1-3] Switches=leaf[1-2]
"""


def plan_of(*argv: str, ctx: Context = CTX) -> Solution:
    return solve(parse_flags([*argv, "python3", "train.py"]).spec, ctx)


def problems(*argv: str, ctx: Context = CTX) -> list[tuple[str, str]]:
    with pytest.raises(DiagnosticError) as info:
        plan_of(*argv, ctx=ctx)
    return [(d.code, d.detail) for d in info.value.diagnostics if d.is_error]


def parse_problems(text: str) -> list[tuple[str, int | None, str]]:
    with pytest.raises(DiagnosticError) as info:
        parse_topology(text, file="topology.conf")
    return [(d.code, d.span.line, d.detail) for d in info.value.diagnostics]


# -- the natural order ------------------------------------------------------------------------
@pytest.mark.parametrize(("hosts", "expected"), [
    (["node66", "node8", "node7"], ["node7", "node8", "node66"]),
    (["node66", "node066", "node65"], ["node65", "node066", "node66"]),  # equal values: more leading zeros first
    (["n1a10", "n1a2", "n10a1", "n2a1"], ["n1a2", "n1a10", "n2a1", "n10a1"]),  # every digit run by value
    (["10.0.0.10", "10.0.0.9", "9.0.0.1", "10.0.1.1"], ["9.0.0.1", "10.0.0.9", "10.0.0.10", "10.0.1.1"]),
    (["node10.rack1.example", "node9.rack2.example", "node9.rack10.example"],
     ["node9.rack2.example", "node9.rack10.example", "node10.rack1.example"]),  # label by label
    (["node1.b", "node1"], ["node1", "node1.b"]),  # a name that is a prefix comes first
    (["pod-b", "pod-a10", "pod-a9"], ["pod-a9", "pod-a10", "pod-b"]),
    (["a1", "a", "1"], ["1", "a", "a1"]),  # a digit run before a text run
])
def test_natural_order(hosts: list[str], expected: list[str]) -> None:
    """Digit runs by value, text runs as text, fully qualified names label by label."""
    assert tuple(expected) == natural(hosts)


# -- the file ---------------------------------------------------------------------------------
def test_a_two_level_tree_is_walked_depth_first_in_the_files_order() -> None:
    """Leaves under one spine are consecutive: s0, s1 (under s3), then s2 (under s4); parents nearest first."""
    topology = parse_topology(TREE, file="topology.conf")

    assert "tree" == topology.kind
    assert [("s0", ("s3", "s5")), ("s1", ("s3", "s5")), ("s2", ("s4", "s5"))] == [
        (leaf.name, leaf.parents) for leaf in topology.leaves]
    assert tuple(f"tux{i}" for i in range(4)) == topology.leaves[0].hosts


def test_blocks_come_in_the_files_order_with_their_sizes() -> None:
    topology = parse_topology(BLOCK, file="topology.conf")

    assert ("block", ("block1", "block2", "block3"), (4, 8)) == (
        topology.kind, tuple(b.name for b in topology.leaves), topology.block_sizes)


def test_comments_continuations_case_and_quotes_are_read_as_slurm_reads_them() -> None:
    """Keys in any case, '#' comments (\\# is a '#'), a trailing backslash joins lines, a quoted value."""
    text = ("switchname=leaf1 \\\n   nodes=n[1-\\\n2]   # the first rack\n"
            'SWITCHNAME=leaf2 NODES="n3,n4"\n\n  # nothing here\nSwitchName=top Switches=leaf[1-2]\n')
    topology = parse_topology(text, file="t")

    assert [("leaf1", ("n1", "n2")), ("leaf2", ("n3", "n4"))] == [(leaf.name, leaf.hosts) for leaf in topology.leaves]


def test_several_roots_keep_the_files_order() -> None:
    topology = parse_topology("SwitchName=b Nodes=n2\nSwitchName=a Nodes=n1\n", file="t")

    assert ["b", "a"] == [leaf.name for leaf in topology.leaves]


def test_scontrols_answer_is_read_with_its_extra_keys() -> None:
    """Level= and a parent's Nodes= (every node below it) are Slurm's own and ignored there."""
    topology = parse_topology(SCONTROL_OUTPUT, file="scontrol show topology", scontrol=True)

    assert [("leaf1", ("h2",)), ("leaf2", ("h1", "h3"))] == [(leaf.name, leaf.hosts) for leaf in topology.leaves]


@pytest.mark.parametrize(("text", "code", "line", "detail"), [
    ("SwitchName=s1 Nodes=n1\nSwitchName=s2 Nodes=n2 Speed=1\n", "PR258", 2, "unknown key 'Speed'"),
    ("SwitchName=s1 Nodes=n1 Switches=s2\nSwitchName=s2 Nodes=n2\n", "PR258", 1,
     "switch s1 has both Nodes= and Switches="),
    ("SwitchName=s1\n", "PR258", 1, "switch s1 has neither Nodes= nor Switches="),
    ("Nodes=n1 SwitchName=s1\n", "PR258", 1, "a record starts with SwitchName=, BlockName= or BlockSizes="),
    ("SwitchName=s1 Nodes=n[1-\n", "PR258", 1, "Nodes=n[1-: "),
    ("SwitchName=s1 Nodes=\n", "PR258", 1, "Nodes= names nothing"),
    ("SwitchName=s1 Nodes=n1 Nodes=n2\n", "PR258", 1, "key 'Nodes' given twice on one line"),
    ("SwitchName=s[1-2] Nodes=n1\n", "PR258", 1, "switch name 's[1-2]' is not a name"),
    ("SwitchName=s\\#1 Nodes=n1\n", "PR258", 1, "switch name 's#1' is not a name"),  # \# is no comment
    ("SwitchName=s1 Nodes=n1 junk\n", "PR258", 1, "'junk' is not a Key=Value word"),
    ("SwitchName=s1 Nodes=n1\nBlockName=b1 Nodes=n2\n", "PR258", 2, "the file names both switches"),
    ("# only a comment\n\n", "PR258", None, "topology.conf names no switch and no block"),
    ("BlockName=b1 Nodes=n1\nBlockSizes=4,x\n", "PR258", 2, "BlockSizes=4,x is not a list of positive numbers"),
    ("BlockName=b1 Nodes=n1\nBlockSizes=4\nBlockSizes=8\n", "PR258", 3, "BlockSizes= is given twice"),
    ("SwitchName=s1 Nodes=n1\0\n", "PR258", 1, "the line holds a NUL character"),
    ("SwitchName=s1 Switches=s1\n", "PR259", 1, "switch s1 lists itself among its Switches="),
    ("SwitchName=a Switches=b\nSwitchName=b Switches=a\n", "PR259", 1, "switch a is below itself (a cycle through"),
    ("SwitchName=l Nodes=n1\nSwitchName=a Switches=l\nSwitchName=b Switches=l\n", "PR259", 3,
     "switch l is under two switches: a and b"),
    ("SwitchName=top Switches=leaf9\n", "PR259", 1, "switch top lists switch leaf9, which no SwitchName= line names"),
    ("SwitchName=s1 Nodes=n1\nSwitchName=s1 Nodes=n2\n", "PR259", 2, "switch s1 is named twice (first on line 1)"),
    ("BlockName=b1 Nodes=n[1-2]\nBlockName=b2 Nodes=n[2-3]\n", "PR259", 2, "node n2 is in two blocks: b1 and b2"),
])
def test_each_broken_file_is_a_diagnostic_at_its_line(text: str, code: str, line: int | None, detail: str) -> None:
    found = parse_problems(text)

    assert (code, line) == found[0][:2]
    assert found[0][2].startswith(detail), found


def test_a_continued_line_is_reported_at_its_first_line() -> None:
    assert ("PR258", 2) == parse_problems("SwitchName=a Nodes=n1\nSwitchName=b\\\n Nodes=n2\\\n Bad=1\n")[0][:2]


def test_a_file_naming_millions_of_hosts_is_refused_not_expanded() -> None:
    """Host lists are bounded in all: 40 lines of 100,000 hosts would be four million names."""
    text = "".join(f"SwitchName=s{i} Nodes=n{i}x[1-99999]\n" for i in range(40))

    found = parse_problems(text)

    assert ("PR258", 11) == found[0][:2]
    assert "more than 1000000 hosts and switches" in found[0][2]


def topology_file(tmp_path: Path, *argv: str) -> list[tuple[str, str]]:
    ctx = evolve(CTX, cwd=str(tmp_path))
    return problems("-H", "n[1-2]", "--num-replicas", "2", "--network-topology", *argv, ctx=ctx)


def test_hostile_files_are_refused_before_they_are_read(tmp_path: Path) -> None:
    """Missing, a directory, a FIFO, /dev/zero, 10 MB, NUL bytes: each a coded diagnostic, none blocks or grows."""
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    (tmp_path / "big").write_bytes(b"# " + b"x" * (10 * 1024 * 1024) + b"\n")
    (tmp_path / "nul").write_bytes(b"SwitchName=s1 Nodes=n[1-2]\nSwitchName=s2\0 Nodes=n3\n")

    assert "PR113" == topology_file(tmp_path, "missing.conf")[0][0]
    for name in ("dir", "fifo", "/dev/zero"):
        assert "PR116" == topology_file(tmp_path, name)[0][0], name
    assert "PR117" == topology_file(tmp_path, "big")[0][0]
    code, detail = topology_file(tmp_path, "nul")[0]
    assert "PR118" == code and "line 2" in detail


def test_a_symlink_to_the_file_is_read(tmp_path: Path) -> None:
    (tmp_path / "real.conf").write_text("SwitchName=s1 Nodes=n2\nSwitchName=s2 Nodes=n1\n")
    (tmp_path / "topology.conf").symlink_to(tmp_path / "real.conf")

    plan = plan_of("-H", "n[1-2]", "--num-replicas", "2", "--network-topology", "topology.conf",
                   ctx=evolve(CTX, cwd=str(tmp_path))).plan

    assert ("n2", "n1") == plan.topology.hosts


# -- Slurm's answer (real processes: a script in scontrol's place) -------------------------------
def scontrol(tmp_path: Path, body: str) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "scontrol").write_text("#!/bin/sh\n" + body)
    (bin_dir / "scontrol").chmod(0o755)
    return {"PATH": f"{bin_dir}:/usr/bin:/bin"}


def slurm_failure(environ: dict[str, str], timeout_s: float = 20.0) -> str:
    with pytest.raises(DiagnosticError) as info:
        scontrol_topology(environ, timeout_s=timeout_s)
    (found,) = info.value.diagnostics
    assert "PR324" == found.code
    return found.detail


def test_scontrols_answer_is_parsed(tmp_path: Path) -> None:
    env = scontrol(tmp_path, f"cat <<'EOF'\n{SCONTROL_OUTPUT}EOF\n")

    assert ["leaf1", "leaf2"] == [leaf.name for leaf in scontrol_topology(env).leaves]


def test_scontrol_that_is_missing_fails_or_names_nothing_is_pr324(tmp_path: Path) -> None:
    assert "scontrol is not on PATH" == slurm_failure({"PATH": str(tmp_path)})
    env = scontrol(tmp_path, "echo 'scontrol: error: No topology information available' >&2\nexit 1\n")
    assert "scontrol failed (exit 1): scontrol: error: No topology information available" == slurm_failure(env)
    env = scontrol(tmp_path, "exit 0\n")
    assert "Slurm names no switch and no block (nothing)" == slurm_failure(env)


def test_scontrol_that_hangs_is_killed_with_its_children_at_the_deadline(tmp_path: Path) -> None:
    """A shell whose child keeps the pipe open: the whole group is killed, the plan is not held."""
    env = scontrol(tmp_path, "sleep 600\n")

    assert "scontrol did not answer within 1 s" == slurm_failure(env, timeout_s=1)


def test_scontrol_that_prints_megabytes_is_refused(tmp_path: Path) -> None:
    env = scontrol(tmp_path, "head -c 5000000 /dev/zero | tr '\\0' x\n")

    assert "scontrol answered 5000000 bytes (at most 4194304)" == slurm_failure(env)


def test_inside_an_allocation_without_a_file_slurms_topology_orders_the_hosts(tmp_path: Path) -> None:
    env = scontrol(tmp_path, f"cat <<'EOF'\n{SCONTROL_OUTPUT}EOF\n")
    ctx = evolve(CTX, environ={**env, "SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "h[1-3]",
                               "SLURM_TASKS_PER_NODE": "2(x3)", "SLURM_NTASKS": "6"})

    plan = plan_of("--rank-order", "topology", "--num-replicas", "6", "--backend", "slurm", ctx=ctx).plan

    assert ("h2", "h1", "h3") == plan.topology.hosts
    assert ["h2", "h2", "h1", "h1", "h3", "h3"] == [i.host for i in plan.instances]
    assert "scontrol show topology" == plan.rank_order.source


# -- the plan -----------------------------------------------------------------------------------
def write(tmp_path: Path, text: str = TREE) -> Context:
    (tmp_path / "topology.conf").write_text(text)
    return evolve(CTX, cwd=str(tmp_path))


def test_natural_order_gives_instance_indices_in_host_order_keeping_each_hosts_instances_together() -> None:
    plan = plan_of("-H", "node66,node[7-8]", "--num-instances", "6", "--num-replicas", "6",
                   "--rank-order", "natural").plan

    assert ["node7", "node7", "node8", "node8", "node66", "node66"] == [i.host for i in plan.instances]
    assert [0, 1, 0, 1, 0, 1] == [i.local_index for i in plan.instances]
    assert "node7" == plan.instances[0].env.get("MASTER_ADDR")
    assert (p.RankOrder(mode="natural"), None) == (plan.rank_order, plan.instances[0].group)


def test_given_order_is_the_plan_of_before(tmp_path: Path) -> None:
    """--rank-order given changes nothing in the plan but its explanation; its JSON has no rank order."""
    base = plan_of("-H", "node66,node[7-8]", "--num-replicas", "3").plan
    given = plan_of("-H", "node66,node[7-8]", "--num-replicas", "3", "--rank-order", "given").plan

    assert evolve(base, explanation=()) == evolve(given, explanation=())
    assert "rank_order" not in json.loads(to_json(given))
    assert "group" not in json.loads(to_json(given))["instances"][0]


def test_topology_order_groups_by_leaf_and_names_each_instances_group(tmp_path: Path) -> None:
    plan = plan_of("-H", "tux[11,0,5,1]", "--num-replicas", "4", "--network-topology", "topology.conf",
                   ctx=write(tmp_path)).plan

    assert ("tux0", "tux1", "tux5", "tux11") == plan.topology.hosts
    assert ["s0", "s0", "s1", "s2"] == [i.group for i in plan.instances]
    assert [("s0", ("tux0", "tux1")), ("s1", ("tux5",)), ("s2", ("tux11",))] == [
        (g.name, g.hosts) for g in plan.rank_order.groups]
    assert ("topology", "tree", "topology.conf") == (plan.rank_order.mode, plan.rank_order.kind, plan.rank_order.source)


def test_a_topology_plan_reads_back_from_json_unchanged(tmp_path: Path) -> None:
    plan = plan_of("-H", "node[01-08]", "--num-replicas", "8", "--rank-order", "topology", "--network-topology",
                   "topology.conf", ctx=write(tmp_path, BLOCK.replace("node[09-12]", "node[09-12]"))).plan

    assert plan == from_json(to_json(plan))
    assert ["block1"] * 4 + ["block2"] * 4 == [i.group for i in plan.instances]


def test_hosts_and_spares_the_topology_does_not_name_are_pr322(tmp_path: Path) -> None:
    found = problems("-H", "tux[1-2],other", "--num-replicas", "3", "--spare-host", "tux3,spare9",
                     "--network-topology", "topology.conf", ctx=write(tmp_path))

    assert [("PR322", "other is under no leaf switch of topology.conf"),
            ("PR322", "spare9 is under no leaf switch of topology.conf")] == found


def test_topology_without_a_file_outside_an_allocation_is_pr257() -> None:
    assert "PR257" == problems("-H", "n[1-2]", "--num-replicas", "2", "--rank-order", "topology")[0][0]


def test_a_file_with_another_order_is_a_warning_and_not_read(tmp_path: Path) -> None:
    """--rank-order natural with --network-topology: PR256, the file is not even opened (it does not exist)."""
    solution = plan_of("-H", "n2,n1", "--num-replicas", "2", "--rank-order", "natural", "--network-topology", "nosuch")

    assert ["PR256"] == [w.code for w in solution.warnings]
    assert ("n1", "n2") == solution.plan.topology.hosts


def test_order_puts_a_host_under_two_leaves_in_the_first() -> None:
    topology = parse_topology("SwitchName=r1 Nodes=n[1-2]\nSwitchName=r2 Nodes=n[2-3]\n", file="t")

    groups, missing = order(("n3", "n2", "n1", "n9"), topology)

    assert ([("r1", ("n1", "n2")), ("r2", ("n3",))], ("n9",)) == ([(g.name, g.hosts) for g in groups], missing)


# -- the backends obey the order -------------------------------------------------------------------
def test_mpirun_gives_rank_i_to_instance_is_host(tmp_path: Path) -> None:
    plan = plan_of("-H", "tux[11,0,5]", "--num-replicas", "3", "--network-topology", "topology.conf",
                   "--backend", "mpirun", ctx=write(tmp_path)).plan
    argv = mpirun_command(plan)
    contexts = " ".join(argv).split(" : ")

    assert ["tux0:1", "tux5:1", "tux11:1"] == [c.split("--host ")[1].split()[0] for c in contexts]
    assert "-H tux0:1,tux5:1,tux11:1" in contexts[0]


def test_mpirun_inside_a_slurm_allocation_leaves_the_host_order_to_each_context(tmp_path: Path) -> None:
    """OpenMPI under Slurm refuses a -H in another order than the allocation's: each context's --host pins alone."""
    plan = plan_of("-H", "tux[11,0,5]", "--num-replicas", "3", "--backend", "mpirun").plan

    inside = mpirun_command(plan, environ={"SLURM_JOB_ID": "7"})

    assert "-H" not in inside
    assert ["tux11:1", "tux0:1", "tux5:1"] == [inside[i + 1] for i, w in enumerate(inside) if w == "--host"]
    assert "-H" in mpirun_command(plan, environ={"PATH": "/usr/bin"})


def test_slurms_hostfile_lists_each_instances_planned_host(tmp_path: Path) -> None:
    """The slurm backend's SLURM_HOSTFILE (--distribution=arbitrary) is one line per instance, in index order."""
    from poprun.backends.slurm.backend import srun_command

    plan = plan_of("-H", "tux[11,0]", "--num-instances", "4", "--num-replicas", "4", "--network-topology",
                   "topology.conf", "--backend", "slurm", ctx=write(tmp_path)).plan

    assert "--distribution=arbitrary" in srun_command(plan)
    assert ["tux0", "tux0", "tux11", "tux11"] == [i.host for i in plan.instances]


# -- a saved plan's rank order is untrusted ------------------------------------------------------
def tampered(tmp_path: Path, change: Callable[[dict[str, Any]], object]) -> list[str]:
    """Return the PR114 details of the saved topology plan after ``change(data)``."""
    plan = plan_of("-H", "tux[0-1,5]", "--num-replicas", "3", "--network-topology", "topology.conf",
                   ctx=write(tmp_path)).plan
    data = json.loads(to_json(plan))
    change(data)
    with pytest.raises(DiagnosticError) as info:
        from_json(json.dumps(data))
    return [d.detail for d in info.value.diagnostics]


@pytest.mark.parametrize(("change", "detail"), [
    (lambda d: d["rank_order"].update(mode="alphabetical"), "$.rank_order.mode is 'alphabetical', not one of"),
    (lambda d: d["rank_order"].update(mode="natural"), "$.rank_order.source must be empty under the natural order"),
    (lambda d: d["rank_order"]["groups"][0]["hosts"].append("tux5"), "$.rank_order.groups must name the plan's hosts"),
    (lambda d: d["rank_order"]["groups"].reverse(), "$.rank_order.groups must name the plan's hosts"),
    (lambda d: d["instances"][2].update(group="s0"), "$.instances[2].group is 's0'; host tux5 is in group 's1'"),
    (lambda d: d["rank_order"]["groups"][0].update(name="s 0"), "$.rank_order.groups[0].name is 's 0'"),
    (lambda d: d["rank_order"].update(kind="torus"), "$.rank_order.kind is 'torus', not tree or block"),
    (lambda d: d.pop("rank_order"), "$.instances[0].group names a group under the given order"),
])
def test_a_saved_plans_rank_order_is_checked(tmp_path: Path, change: Callable[[dict[str, Any]], object],
                                             detail: str) -> None:
    found = tampered(tmp_path, change)

    assert any(f.startswith(detail) for f in found), found


def test_a_saved_natural_plan_must_be_in_natural_order() -> None:
    data = json.loads(to_json(plan_of("-H", "n10,n9", "--num-replicas", "2", "--rank-order", "natural").plan))
    data["topology"]["hosts"].reverse()

    with pytest.raises(DiagnosticError) as info:
        from_json(json.dumps(data))

    assert "$.topology.hosts are not in natural order" in info.value.diagnostics[0].detail


def test_diff_shows_the_order_the_groups_and_each_instances_new_host(tmp_path: Path) -> None:
    from poprun.render.diff import diff_plans

    ctx = write(tmp_path)
    old = plan_of("-H", "tux[5,0]", "--num-replicas", "2", ctx=ctx).plan
    new = plan_of("-H", "tux[5,0]", "--num-replicas", "2", "--network-topology", "topology.conf", ctx=ctx).plan

    diff = diff_plans(old, new).changes
    changes = {(c.section, c.key): (c.old, c.new) for c in diff}

    assert ("given", "topology") == changes[("rank_order", "mode")]
    assert ("tux5,tux0", "tux0,tux5") == changes[("rank_order", "host order")]
    assert (None, "tux0") == changes[("rank_order", "group s0")]
    assert [((0,), None, "s0"), ((1,), None, "s1")] == [(c.instances, c.old, c.new) for c in diff if c.key == "group"]
    assert [((0,), "tux5", "tux0"), ((1,), "tux0", "tux5")] == [(c.instances, c.old, c.new) for c in diff if c.key == "host"]


def test_toml_and_dsl_say_the_same_as_the_flags(tmp_path: Path) -> None:
    from poprun.planner.dsl.read import parse_dsl
    from poprun.planner.tomlspec import parse_toml

    toml = parse_toml('[placement]\nrank_order = "natural"\nnetwork_topology = "t.conf"\n', file="s.toml")
    dsl = parse_dsl("rank order natural\nnetwork topology t.conf\n", file="s.pop")
    flags = parse_flags(["--rank-order", "natural", "--network-topology", "t.conf"]).spec

    assert (toml.rank_order, toml.network_topology) == (dsl.rank_order, dsl.network_topology) == (
        flags.rank_order, flags.network_topology)


def test_a_file_name_with_a_newline_is_shown_on_one_line(tmp_path: Path) -> None:
    ctx = write(tmp_path)
    (tmp_path / "top\nology.conf").write_text("SwitchName=s Nodes=n[1-2]\n")

    plan = plan_of("-H", "n2,n1", "--num-replicas", "2", "--network-topology", "top\nology.conf", ctx=ctx).plan

    assert "'top\\nology.conf'" == plan.rank_order.source
    assert plan == from_json(to_json(plan))


def test_a_replan_keeps_the_topology_order_with_the_spare_in_its_group(tmp_path: Path) -> None:
    """tux1 is lost, spare tux2 takes its place: the next attempt is grouped again, tux2 under s0."""
    from poprun.planner.replan import replan

    ctx = write(tmp_path)
    plan = plan_of("-H", "tux[5,1]", "--num-replicas", "2", "--spare-host", "tux2", "--network-topology",
                   "topology.conf", ctx=ctx).plan

    again = replan(plan, {"tux1": "lost"}, ctx).plan

    assert (("tux1", "tux5"), ("tux2", "tux5")) == (plan.topology.hosts, again.topology.hosts)
    assert ["s0", "s1"] == [i.group for i in again.instances]


def test_a_chain_of_switches_is_checked_in_linear_time_and_bounded_in_depth() -> None:
    """100,000 switches each under the next: refused for its depth at once, not walked quadratically."""
    text = "SwitchName=s0 Nodes=n1\n" + "".join(f"SwitchName=s{i} Switches=s{i - 1}\n" for i in range(1, 100_000))

    found = parse_problems(text)

    assert [("PR259", 99935, "switch s99934 is more than 64 levels below the top of its tree")] == found


def test_a_long_cycle_is_found() -> None:
    text = "".join(f"SwitchName=s{i} Switches=s{(i + 1) % 50}\n" for i in range(50))

    found = parse_problems(text)

    assert "PR259" == found[0][0] and found[0][2].startswith("switch s0 is below itself (a cycle through s0 -> s49 ->")
