"""Plan diffs: each kind of change (topology, placement, environment, partition, launch), text and JSON."""

import json

from poprun.core.record import evolve
from poprun.planner.context import Context
from poprun.planner.flags import parse_flags
from poprun.planner.plan import LaunchPlan
from poprun.planner.solve import solve
from poprun.render.diff import SECTIONS, Change, diff_plans, render_diff, render_diff_json, to_diff_dict

CTX = Context(environ={"PATH": "/bin"}, cwd="/w")
BASE = ("--num-replicas=8", "--host=pod[1-2]", "--vipu-partition=p8")


def plan_of(*argv: str, program: tuple[str, ...] = ("python3", "train.py")) -> LaunchPlan:
    return solve(parse_flags([*argv, *program]).spec, CTX).plan


def keys(changes: tuple[Change, ...]) -> list[str]:
    return [c.key for c in changes]


def test_the_same_plan_has_no_differences():
    plan = plan_of(*BASE, "--num-instances=2")

    diff = diff_plans(plan, plan)

    assert diff.equal
    assert "--- a.json\n+++ b\nno differences\n" == render_diff(diff, old_name="a.json", new_name="b")


def test_more_instances_change_topology_placement_and_environment():
    # GIVEN two instances, then four on the same two hosts
    diff = diff_plans(plan_of(*BASE, "--num-instances=2"), plan_of(*BASE, "--num-instances=4"))

    # THEN the counts change, instances 2 and 3 are added, and the variables of 0 and 1 follow
    topology = {c.key: (c.old, c.new) for c in diff.section("topology")}
    assert (2, 4) == topology["num_instances"]
    assert (4, 2) == topology["replicas_per_instance"]
    added = [c for c in diff.section("placement") if c.key == "instance"]
    assert [((2,), None), ((3,), None)] == [(c.instances, c.old) for c in added]
    assert "pod2, local 0, ILD 0, GCD 2, replicas 4-5" == added[0].new
    assert Change(section="environment", key="POPDIST_NUM_INSTANCES", old="2", new="4", instances=(0, 1)) \
        in diff.changes
    assert Change(section="partition", key="num_gcds", old=2, new=4) in diff.changes


def test_other_hosts_move_instances():
    diff = diff_plans(plan_of(*BASE, "--num-instances=4"),
                      plan_of("--num-replicas=8", "--host=pod[1-4]", "--vipu-partition=p8", "--num-instances=4"))

    assert Change(section="topology", key="hosts", old="pod[1-2]", new="pod[1-4]") in diff.changes
    moved = [(c.instances, c.old, c.new) for c in diff.section("placement") if c.key == "host"]
    assert [((1,), "pod1", "pod2"), ((2,), "pod2", "pod3"), ((3,), "pod2", "pod4")] == moved


def test_one_environment_variable_is_one_change_naming_every_instance():
    diff = diff_plans(plan_of(*BASE, "--num-instances=2", "--mpi-local-args=-x LOG=info"),
                      plan_of(*BASE, "--num-instances=2", "--mpi-local-args=-x LOG=debug -x NEW=1"))

    assert [Change(section="environment", key="LOG", old="info", new="debug", instances=(0, 1)),
            Change(section="environment", key="NEW", old=None, new="1", instances=(0, 1))] == list(diff.changes)
    text = render_diff(diff, old_name="old.json", new_name="new")
    assert "environment:\n  LOG: info -> debug (instances 0-1)\n  NEW: (none) -> 1 (instances 0-1)\n" in text


def test_forwarded_variables_are_compared_by_name():
    diff = diff_plans(plan_of(*BASE, "--num-instances=2"),
                      plan_of(*BASE, "--num-instances=2", "--mpi-local-args=-x DATA_DIR"))

    [change] = diff.changes
    assert ("environment", "(forwarded)", (0, 1)) == (change.section, change.key, change.instances)
    assert isinstance(change.new, tuple)
    assert "DATA_DIR" in change.new


def test_secret_values_are_masked_in_text_but_the_change_is_shown():
    diff = diff_plans(plan_of(*BASE, "--mpi-local-args=-x HF_TOKEN=abc"),
                      plan_of(*BASE, "--mpi-local-args=-x HF_TOKEN=xyz"))

    text = render_diff(diff, old_name="a", new_name="b")

    assert "HF_TOKEN: ******** -> ******** (instances 0-1)" in text
    assert "abc" not in text
    assert "xyz" not in text


def test_partition_actions_show_what_is_removed_and_added():
    diff = diff_plans(plan_of(*BASE), plan_of(*BASE, "--update-partition=yes"))

    text = render_diff(diff, old_name="a", new_name="b")

    assert "  update: no -> yes\n  actions:\n    - otherwise stop with an error (--update-partition=no)\n" in text
    assert "    + otherwise create it" in text


def test_offline_mode_drops_the_partition_and_changes_the_backend():
    diff = diff_plans(plan_of(*BASE), plan_of(*BASE, "--offline-mode=yes"))

    assert Change(section="partition", key="partition", old="p8 on localhost:8090", new=None) in diff.changes
    assert "offline" in keys(diff.section("launch"))
    assert ("partition:\n  partition: p8 on localhost:8090 -> (none)\n"
            in render_diff(diff, old_name="a", new_name="b"))


def test_program_changes_are_launch_changes_of_every_instance():
    diff = diff_plans(plan_of(*BASE, "--num-instances=2"),
                      plan_of(*BASE, "--num-instances=2", program=("python3", "train.py", "--epochs", "3")))

    assert [Change(section="launch", key="argv", old=("python3", "train.py"),
                   new=("python3", "train.py", "--epochs", "3"), instances=(0, 1))] == list(diff.changes)


def test_removed_instances_are_named():
    diff = diff_plans(plan_of(*BASE, "--num-instances=4"), plan_of(*BASE, "--num-instances=2"))

    text = render_diff(diff, old_name="a", new_name="b")

    assert "  instance 3: removed (was pod2, local 1, ILD 0, GCD 3, replicas 6-7)\n" in text


def test_explanations_and_versions_are_not_compared():
    plan = plan_of(*BASE)

    assert diff_plans(plan, evolve(plan, poprun_version="0.0.1", explanation=(), warnings=())).equal


def test_changes_come_in_section_order():
    diff = diff_plans(plan_of(*BASE, "--num-instances=2"),
                      plan_of("--num-replicas=16", "--host=pod[1-4]", "--num-instances=4", "--offline-mode=yes",
                              "--max-restarts=2", "--health-check=true", "--notify=true", "--rank-order=natural"))

    order = [SECTIONS.index(c.section) for c in diff.changes]
    assert sorted(order) == order
    assert set(SECTIONS) - {"devices"} == {c.section for c in diff.changes}  # devices: tests/unit/test_devices.py


def test_json_has_the_names_and_every_change_with_its_instances():
    diff = diff_plans(plan_of(*BASE, "--num-instances=2"), plan_of(*BASE, "--num-instances=4"))

    data = json.loads(render_diff_json(diff, old_name="old.json", new_name="new"))

    assert {"old", "new", "equal", "changes"} == set(data)
    assert ("old.json", "new", False) == (data["old"], data["new"], data["equal"])
    assert all({"section", "key", "old", "new", "instances"} == set(c) for c in data["changes"])
    assert {"section": "topology", "key": "num_instances", "old": 2, "new": 4, "instances": []} == data["changes"][0]
    assert data == to_diff_dict(diff, old_name="old.json", new_name="new")
