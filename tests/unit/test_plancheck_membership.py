"""A saved plan's membership policy is untrusted input: PR114 per broken rule of ``$.membership``; older plans load."""

import copy
import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from poprun.cli.main import main
from poprun.core.diagnostic import DiagnosticError
from poprun.planner._membershipcheck import MAX_SPEC
from poprun.planner.plan import NO_MEMBERSHIP
from poprun.planner.serde import from_json, to_json

GOLDEN = Path(__file__).parents[1] / "golden" / "diagnostics"


def _plan(*argv: str) -> dict:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = main(["plan", "--format", "json", *argv])
    assert 0 == status, err.getvalue()
    return json.loads(out.getvalue())


@pytest.fixture(scope="module")
def plan_data() -> dict:
    return _plan("--host", "pod[1-4]", "--num-instances", "4", "--num-replicas", "8", "--spare-host", "pod[5-6]",
                 "--min-hosts", "2", "--health-check", "test -e /dev/shm", "python3", "train.py")


def _refused(data: dict) -> list[tuple[str, str]]:
    with pytest.raises(DiagnosticError) as problem:
        from_json(json.dumps(data), file="saved.json")
    return [(d.code, d.span.key_path) for d in problem.value.diagnostics]


def test_a_plan_with_membership_round_trips(plan_data):
    """The solver's plan with spares, a minimum and a health check loads back unchanged."""
    plan = from_json(json.dumps(plan_data), file="saved.json")

    assert json.loads(to_json(plan)) == plan_data
    assert ("pod5", "pod6") == plan.membership.spares


@pytest.mark.parametrize(("key", "value", "path"), [
    ("spares", ["pod5", "pod1"], "$.membership.spares[1]"),
    ("spares", ["pod5", "pod5"], "$.membership.spares[1]"),
    ("spares", ["pod5", ""], "$.membership.spares[1]"),
    ("spares", ["pod5", "-oProxyCommand=x"], "$.membership.spares[1]"),
    ("spares", ["pod5", "a;b"], "$.membership.spares[1]"),
    ("spares", ["pod5", "a\nb"], "$.membership.spares[1]"),
    ("min_hosts", 5, "$.membership.min_hosts"),
    ("min_hosts", -1, "$.membership.min_hosts"),
    ("health_check", "x" * 4097, "$.membership.health_check"),
    ("health_check_timeout_ms", 0, "$.membership.health_check_timeout_ms"),
    ("health_check_timeout_ms", 3_600_001, "$.membership.health_check_timeout_ms"),
    ("spec", "[topology\n", "$.membership.spec"),
    ("spec", "[topology]\nreplicas = 0\n", "$.membership.spec"),
    ("spec", "[nonsense]\nkey = 1\n", "$.membership.spec"),
    ("spec", "", "$.membership.spec"),
    ("spec", "#" * (MAX_SPEC + 1), "$.membership.spec"),
])
def test_each_broken_rule_is_pr114_at_its_path(plan_data, key, value, path):
    """A spare that is a host, named twice or not a host name, a minimum out of range, a long check, a bad spec."""
    data = copy.deepcopy(plan_data)
    data["membership"][key] = value

    assert ("PR114", path) in _refused(data)


def test_a_spec_without_spares_or_a_smaller_minimum_is_refused(plan_data):
    """A kept spec with nothing a re-plan could change (no spares, every host) is not a plan poprun makes."""
    data = copy.deepcopy(plan_data)
    data["membership"] |= {"spares": [], "min_hosts": 4}

    assert [("PR114", "$.membership.spec")] == _refused(data)


def test_spares_with_a_backend_that_cannot_change_hosts_are_refused(plan_data):
    """A plan whose backend runs every attempt on the same hosts cannot hold spares (what PR228 refuses when planning)."""
    data = copy.deepcopy(plan_data)
    data["backend"]["traits"]["replaces_hosts"] = False

    assert [("PR114", "$.membership")] == _refused(data)


def test_a_health_check_alone_needs_no_spec(plan_data):
    """Only a health check: no spares, every host, no spec: a valid plan."""
    data = copy.deepcopy(plan_data)
    data["membership"] |= {"spares": [], "min_hosts": 0, "spec": ""}

    assert "test -e /dev/shm" == from_json(json.dumps(data), file="saved.json").membership.health_check


def test_an_older_plan_without_membership_loads_with_the_defaults():
    """A plan saved before membership existed (a golden case's) loads with no spares, every host and no check."""
    text = (GOLDEN / "PR430_output_file_planted_as_a_symlink" / "plan.json").read_text()
    assert '"membership"' not in text

    assert NO_MEMBERSHIP == from_json(text, file="old.json").membership


def test_apply_of_a_plan_with_a_broken_membership_starts_nothing(plan_data, tmp_path, monkeypatch):
    """`poprun apply` of a plan whose spare is also a host exits 2 with PR114, before any backend runs."""
    monkeypatch.chdir(tmp_path)
    data = copy.deepcopy(plan_data)
    data["membership"]["spares"] = ["pod1"]
    (tmp_path / "plan.json").write_text(json.dumps(data))
    err = io.StringIO()
    with redirect_stdout(io.StringIO()), redirect_stderr(err):
        status = main(["apply", "plan.json"])

    assert 2 == status
    assert "$.membership.spares[0] is 'pod1', a host of the plan too" in err.getvalue()
