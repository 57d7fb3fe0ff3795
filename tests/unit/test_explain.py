"""The text view of a plan: summary, per-instance table, decisions, masked secrets."""

from poprun.planner.context import Context
from poprun.planner.flags import parse_flags
from poprun.planner.solve import solve
from poprun.render.explain import render_plan

CTX = Context(environ={"PATH": "/bin"}, cwd="/w")


def explain(*argv: str) -> str:
    return render_plan(solve(parse_flags([*argv, "python3", "train.py"]).spec, CTX).plan, explain=True)


def test_secret_values_are_masked():
    """Variables whose names look secret are shown masked; others in full."""
    text = explain("--num-replicas=2", "--mpi-local-args=-x HF_TOKEN=abc123 -x MY_PASSWORD=pw -x LEVEL=3")

    assert "HF_TOKEN=********" in text
    assert "MY_PASSWORD=********" in text
    assert "abc123" not in text
    assert "LEVEL=3" in text


def test_table_shows_each_instance_with_its_replicas():
    """The per-instance table has host, local index, ILD, GCD and the replica range."""
    text = explain("--num-replicas=8", "--num-instances=4", "--host=pod1,pod2")

    assert "  2         pod2  0      0    2    4-5       spreadnuma" in text


def test_decisions_name_their_sources():
    """Each decision line names where the value came from."""
    text = explain("--num-replicas=8", "--num-instances=2")

    assert "num_replicas                  8" in text
    assert "--num-replicas" in text
    assert "rule replicas_over_instances  holds" in text


def test_variables_that_differ_between_instances_are_named():
    """After instance 0's environment, the variables that vary between instances are listed."""
    assert "other instances differ only in: " in explain("--num-replicas=4", "--num-instances=2")
