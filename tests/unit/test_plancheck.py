"""A saved plan is checked as strictly as the solver builds one: each broken rule is PR114 at its JSON path."""

import copy
import io
import json
from contextlib import redirect_stderr, redirect_stdout

import pytest

from poprun.cli.main import main
from poprun.core.diagnostic import DiagnosticError
from poprun.planner.serde import from_json, to_json


def _run(argv):
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = main(argv)
    return status, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def plan_data():
    status, out, _ = _run(["plan", "--format", "json", "--host", "localhost,pod2", "--num-instances", "2",
                           "--num-replicas", "4", "--mpi-local-args=-x FOO", "--backend", "offline",
                           "python3", "train.py"])
    assert 0 == status
    return json.loads(out)


def _set(data, path, value):
    *parents, last = path
    for step in parents:
        data = data[step]
    if value is _DELETE:
        del data[last]
    else:
        data[last] = value


_DELETE = object()
CASES = [
    # (what is changed, its new value, the JSON path the diagnostic names)
    (("format_version",), True, "$.format_version"),
    (("format_version",), 1.0, "$.format_version"),
    (("format_version",), "1", "$.format_version"),
    (("instances", 1, "index"), 0, "$.instances[1].index"),
    (("instances", 1, "index"), 5, "$.instances[1].index"),
    (("instances", 0, "host"), "-oProxyCommand=x", "$.instances[0].host"),
    (("instances", 0, "host"), "a;b", "$.instances[0].host"),
    (("instances", 0, "host"), "a b", "$.instances[0].host"),
    (("instances", 0, "host"), "elsewhere", "$.instances[0].host"),
    (("topology", "hosts", 1), "$(id)", "$.topology.hosts[1]"),
    (("instances", 0, "env_unset"), ["A;rm -rf x"], "$.instances[0].env_unset[0]"),
    (("instances", 0, "env_forward"), ["-x"], "$.instances[0].env_forward[0]"),
    (("instances", 0, "env"), {"A B": "c"}, "$.instances[0].env['A B']"),
    (("instances", 0, "argv"), ["python3", "a\0b"], "$.instances[0].argv[1]"),
    (("instances", 0, "argv"), "python3", "$.instances[0].argv"),
    (("instances", 0, "cwd"), "", "$.instances[0].cwd"),
    (("instances", 0, "placement", "cpus"), "0-4000000000", "$.instances[0].placement.cpus"),
    (("instances", 0, "placement", "numa_nodes"), "3-1", "$.instances[0].placement.numa_nodes"),
    (("instances", 0, "replica_offset"), 1, "$.instances[0].replica_offset"),
    (("instances", 0, "num_local_replicas"), 0, "$.instances[0].num_local_replicas"),
    (("topology", "num_replicas"), "4", "$.topology.num_replicas"),
    (("topology", "num_replicas"), 10**30, "$.topology.num_replicas"),
    (("topology", "num_instances"), 3, "$.topology.num_instances"),
    (("output", "only_from_instance"), 2, "$.output.only_from_instance"),
    (("output", "tag"), 1, "$.output.tag"),
    (("mask",), ["NOT A NAME"], "$.mask[0]"),
    (("cache",), {"mode": "user", "path": "/tmp/x", "per_host": False, "remove_at_exit": True}, "$.cache"),
    (("backend", "name"), "a b", "$.backend.name"),
    (("mpi", "srun_plugin"), "pmix --export=NONE", "$.mpi.srun_plugin"),
    (("mpi", "srun_plugin"), "", "$.mpi.srun_plugin"),
    (("instances",), [], "$.instances"),
    (("topology",), _DELETE, "$.topology"),
    (("recovery", "scope"), "some", "$.recovery.scope"),
    (("recovery", "max_restarts"), -1, "$.recovery.max_restarts"),
    (("recovery", "max_restarts"), 10**9, "$.recovery.max_restarts"),
    (("recovery", "crash_loop"), 0, "$.recovery.crash_loop"),
    (("recovery", "backoff_ms"), -5, "$.recovery.backoff_ms"),
    (("recovery", "timeout_ms"), 10**15, "$.recovery.timeout_ms"),
    (("recovery", "backoff_ms"), 0.5, "$.recovery.backoff_ms"),
    (("recovery", "never_retry"), [2, 256], "$.recovery.never_retry[1]"),
    (("recovery", "never_retry"), "2", "$.recovery.never_retry"),
    (("recovery", "signal"), 65, "$.recovery.signal"),
    (("recovery", "signal_before_ms"), 5, "$.recovery.signal_before_ms"),
    (("recovery", "pre_restart"), "check\0", "$.recovery.pre_restart"),
    (("recovery", "pre_restart"), "x" * 5000, "$.recovery.pre_restart"),
    (("recovery", "choose_port"), 1, "$.recovery.choose_port"),
    (("recovery", "heartbeat_timeout_ms"), -1, "$.recovery.heartbeat_timeout_ms"),
    (("recovery", "heartbeat_timeout_ms"), 10**15, "$.recovery.heartbeat_timeout_ms"),
    (("recovery", "heartbeat_timeout_ms"), "5", "$.recovery.heartbeat_timeout_ms"),
    (("recovery", "straggler_policy"), "kill", "$.recovery.straggler_policy"),
    (("recovery", "straggler_policy"), None, "$.recovery.straggler_policy"),
]


@pytest.mark.parametrize(("path", "value", "where"), CASES, ids=[c[2] + "=" + repr(c[1])[:20] for c in CASES])
def test_broken_rule_is_pr114_at_its_path(plan_data, path, value, where):
    """The plan is refused with PR114 naming the path of what was changed."""
    data = copy.deepcopy(plan_data)
    _set(data, path, value)

    with pytest.raises(DiagnosticError) as caught:
        from_json(json.dumps(data), file="plan.json")

    assert "PR114" == caught.value.diagnostics[0].code
    assert where in [d.span.key_path for d in caught.value.diagnostics]


def test_two_instances_of_index_0_are_refused_by_apply_diff_and_explain(plan_data, tmp_path, monkeypatch):
    """The plan that made --diff say 'no differences' while apply ran a hidden program is refused by all three."""
    data = copy.deepcopy(plan_data)
    data["instances"][1]["index"] = 0
    data["instances"][1]["argv"] = ["sh", "-c", "echo hidden"]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plan.json").write_text(json.dumps(data))

    results = [_run(argv) for argv in (["apply", "plan.json"], ["plan", "--explain", "plan.json"],
                                       ["plan", "--diff", "plan.json", "python3", "train.py"])]

    assert [2, 2, 2] == [status for status, _, _ in results]
    assert all("$.instances[1].index" in err for _, _, err in results)


def test_plan_without_mask_written_before_it_existed_loads(plan_data):
    """Older plans lack the mask key; they load with an empty mask."""
    data = copy.deepcopy(plan_data)
    del data["mask"]

    assert () == from_json(json.dumps(data), file="old.json").mask


def test_plan_without_recovery_written_before_it_existed_loads(plan_data):
    """Older plans lack the recovery key; they load with no restart, no limit and MASTER_PORT in the plan."""
    data = copy.deepcopy(plan_data)
    del data["recovery"]
    plan = from_json(json.dumps(data), file="old.json")

    assert (0, 0, False) == (plan.recovery.max_restarts, plan.recovery.timeout_ms, plan.recovery.choose_port)


def test_plan_without_srun_plugin_written_before_it_existed_loads(plan_data):
    """Older plans lack mpi.srun_plugin; they load with srun's default (None)."""
    data = copy.deepcopy(plan_data)
    del data["mpi"]["srun_plugin"]

    assert from_json(json.dumps(data), file="old.json").mpi.srun_plugin is None


def test_solver_plans_round_trip(plan_data):
    """A plan the solver made passes every check and round-trips byte for byte."""
    text = json.dumps(plan_data, indent=2, sort_keys=True, ensure_ascii=False) + "\n"

    assert text == to_json(from_json(text, file="plan.json"))


def test_explain_of_a_saved_plan_shows_each_program_when_they_differ(plan_data, tmp_path, monkeypatch):
    """Instances running different programs are each named in the explain text."""
    data = copy.deepcopy(plan_data)
    data["instances"][1]["argv"] = ["python3", "other.py", "a b"]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plan.json").write_text(json.dumps(data))

    status, out, _ = _run(["plan", "plan.json"])

    assert 0 == status
    assert "instance 0 (localhost): python3 train.py" in out
    assert "instance 1 (pod2): python3 other.py 'a b'" in out


def test_explain_of_a_saved_plan_shows_forwarded_variables_that_differ(plan_data, tmp_path, monkeypatch):
    """An instance forwarding other variables than instance 0 is named with them."""
    data = copy.deepcopy(plan_data)
    data["instances"][1]["env_forward"] = ["PATH", "AWS_PROFILE"]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plan.json").write_text(json.dumps(data))

    status, out, _ = _run(["plan", "--explain", "plan.json"])

    assert 0 == status
    assert "  instance 1 forwards: PATH AWS_PROFILE\n" in out


def test_diff_of_two_saved_plans(plan_data, tmp_path, monkeypatch):
    """plan --diff OLD.json NEW.json compares two saved plans, each checked."""
    data = copy.deepcopy(plan_data)
    data["instances"][1]["argv"] = ["python3", "other.py"]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "old.json").write_text(json.dumps(plan_data))
    (tmp_path / "new.json").write_text(json.dumps(data))

    status, out, _ = _run(["plan", "--diff", "old.json", "new.json"])

    assert 0 == status
    assert "--- old.json\n+++ new.json\n" in out
    assert "  argv: python3 train.py -> python3 other.py (instance 1)\n" in out
