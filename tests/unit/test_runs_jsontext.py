"""The run record writes JSON without the json module: the same text json.dumps writes, and plans as serde does."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from poprun.planner.serde import to_dict, to_json
from poprun.runs.jsontext import dumps
from poprun.runs.record import plan_data
from tests.e2e.helpers import plan_of

VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                      lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
                      max_leaves=20)


@given(VALUES)
def test_the_text_is_json_dumps_text(value):
    """Indented and sorted as plan.json, compact as events.jsonl: byte for byte json.dumps's."""
    assert json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False) == dumps(value, indent=2, sort_keys=True)
    assert json.dumps(value, ensure_ascii=False, separators=(",", ":")) == dumps(value)


def test_what_json_cannot_write_is_refused_as_json_refuses_it():
    """A key that is not a string, or an object, is a TypeError as with json.dumps."""
    for value in ({1: "a"}, {"a": object()}):
        with pytest.raises(TypeError):
            dumps(value)


@pytest.mark.parametrize("argv", [
    ("--num-instances", "2", "--num-replicas", "4", "python3", "train.py"),
    ("--host", "h1,h2", "--num-instances", "4", "--num-replicas", "8", "--ipus-per-replica", "2", "--mpi-global-args=-x A=1",
     "--mpi-local-args=-x HOME", "--vipu-partition", "p", "--numa-aware", "yes", "python3", "t.py", "--lr", "0.1"),
    ("--offline-mode=on", "--num-instances", "3", "--num-replicas", "3", "--mask", "X", "--only-output-from-instance", "1", "sh", "-c",
     "echo 'quotes \" and $(x)'\n"),
], ids=["simple", "hosts-partition-numa", "offline-tagged"])
def test_plan_json_is_what_poprun_plan_writes(argv):
    """plan.json of a record equals 'poprun plan --format json': the same data, the same text."""
    plan = plan_of(*argv)

    assert to_dict(plan) == plan_data(plan)
    assert to_json(plan) == dumps(plan_data(plan), indent=2, sort_keys=True) + "\n"


def test_plan_json_of_a_rank_ordered_plan_is_what_poprun_plan_writes(tmp_path):
    """A plan with a topology order (its rank_order and each instance's group) is written the same both ways."""
    (tmp_path / "t.conf").write_text("SwitchName=a Nodes=h2\nSwitchName=b Nodes=h1\n")
    from poprun.planner.context import Context
    from poprun.planner.flags import parse_flags
    from poprun.planner.solve import solve

    ctx = Context(environ={"PATH": "/usr/bin"}, cwd=str(tmp_path), local_names=("localhost",))
    plan = solve(parse_flags(["-H", "h1,h2", "--num-replicas", "2", "--network-topology", "t.conf", "true"]).spec,
                 ctx).plan

    assert "rank_order" in to_dict(plan) and "group" in to_dict(plan)["instances"][0]
    assert to_dict(plan) == plan_data(plan)
    assert to_json(plan) == dumps(plan_data(plan), indent=2, sort_keys=True) + "\n"
