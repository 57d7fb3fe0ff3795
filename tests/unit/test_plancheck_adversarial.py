"""A saved plan written by an attacker: unknown keys at any depth, duplicated keys, numbers no plan holds are PR114."""

import json

import pytest

from poprun.core.diagnostic import DiagnosticError
from poprun.planner.serde import from_json
from tests.unit.test_plancheck import _run


@pytest.fixture(scope="module")
def plan_text():
    status, out, _ = _run(["plan", "--format", "json", "--host", "localhost,pod2", "--num-instances", "2",
                           "--num-replicas", "4", "--mpi-local-args=-x FOO -x BAR=1", "--backend", "offline",
                           "--max-restarts", "1", "python3", "train.py"])
    assert 0 == status
    return out


def _objects(data, path="$"):
    """Return the JSON path of every object in ``data``, as PR114 names it."""
    found = [path] if isinstance(data, dict) else []
    if isinstance(data, dict):
        for key, value in data.items():
            found += _objects(value, f"{path}.{key}")
    elif isinstance(data, list):
        for index, value in enumerate(data):
            found += _objects(value, f"{path}[{index}]")
    return found


def _at(data, path):
    for step in path.replace("[", ".[").split(".")[1:]:
        data = data[int(step[1:-1])] if step.startswith("[") else data[step]
    return data


def test_an_unknown_top_level_key_is_pr114_at_the_root(plan_text, tmp_path, monkeypatch):
    """``"surprise": 1`` beside the plan's keys is PR114 naming it, not an internal error."""
    data = json.loads(plan_text)
    data["surprise"] = 1
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plan.json").write_text(json.dumps(data))

    results = [_run(argv) for argv in (["plan", "plan.json"], ["apply", "plan.json"],
                                       ["plan", "--diff", "plan.json", "python3", "train.py"])]

    assert [2, 2, 2] == [status for status, _, _ in results]
    for _, _, err in results:
        assert err.startswith("error[PR114]: invalid plan file\n  --> plan.json  ($)\n"), err
        assert "(surprise)" in err
        assert "internal error" not in err


def test_an_unknown_key_in_any_object_is_pr114_naming_that_object(plan_text):
    """Whichever object of the plan gets a key it does not have, the plan is refused naming that object's path."""
    paths = [path for path in _objects(json.loads(plan_text)) if not path.endswith(".env")]  # env maps names
    assert len(paths) > 10

    for path in paths:
        data = json.loads(plan_text)
        _at(data, path)["surprise"] = 1
        with pytest.raises(DiagnosticError) as caught:
            from_json(json.dumps(data), file="plan.json")

        assert ["PR114"] == sorted({d.code for d in caught.value.diagnostics}), path
        assert path in [d.span.key_path for d in caught.value.diagnostics], path


@pytest.mark.parametrize(("old", "new", "where"), [
    ('"num_replicas": 4', '"num_replicas": 4, "num_replicas": 2', "$.topology"),
    ('"host": "pod2"', '"host": "pod2", "host": "localhost"', "$.instances[1]"),
    ('"format_version": 1', '"format_version": 1, "format_version": 1', "$"),
])
def test_a_duplicated_key_is_pr114_naming_its_object(plan_text, old, new, where):
    """A key written twice (a reader of the file sees the first, a JSON parser keeps the last) is refused."""
    assert old in plan_text
    text = plan_text.replace(old, new, 1)

    with pytest.raises(DiagnosticError) as caught:
        from_json(text, file="plan.json")

    [found] = caught.value.diagnostics
    assert ("PR114", where) == (found.code, found.span.key_path)
    assert f"key '{new.split(':')[0].strip(chr(34))}' appears twice" in found.detail


@pytest.mark.parametrize("number", ["1" + "0" * 5000, "1e999", "-1e999"])
def test_a_number_no_plan_holds_is_pr114(plan_text, number):
    """An integer of thousands of digits, or a float that overflows, is refused as a plan, not an internal error."""
    text = plan_text.replace('"num_local_replicas": 2', f'"num_local_replicas": {number}', 1)

    with pytest.raises(DiagnosticError) as caught:
        from_json(text, file="plan.json")

    assert "PR114" == caught.value.diagnostics[0].code


def test_an_unknown_key_reaches_the_cli_as_one_line_and_exit_2(plan_text, tmp_path):
    """Through the real command, an unknown key is PR114 on standard error, exit 2, no traceback."""
    import subprocess
    import sys

    data = json.loads(plan_text)
    data["instances"][0]["placement"]["surprise"] = {"deep": [1]}
    (tmp_path / "plan.json").write_text(json.dumps(data))

    done = subprocess.run([sys.executable, "-m", "poprun.cli.main", "apply", "plan.json"], cwd=tmp_path,
                          capture_output=True, text=True, check=False)

    assert 2 == done.returncode
    assert done.stderr.startswith("error[PR114]: invalid plan file\n  --> plan.json  ($.instances[0].placement)\n")
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(("argv1", "where", "detail"), [
    ({"$bytes": "not base64!"}, "$.instances[0].argv[1]", '"$bytes" is not base64'),
    ({"$bytes": "eA==", "also": 1}, "$.instances[0].argv[1]", "exactly one base64 string"),
    ({"$bytes": 5}, "$.instances[0].argv[1]", "exactly one base64 string"),
    ("caf\udce9.txt", "$.instances[0].argv[1]", "holds the lone surrogate \\udce9"),
    ("\ud800", "$.instances[0].argv[1]", "holds the lone surrogate \\ud800"),
])
def test_bytes_that_are_not_utf8_are_only_read_as_a_bytes_object(plan_text, argv1, where, detail):
    """A broken ``{"$bytes": ...}`` or a lone surrogate escape (``"\\udce9"``) is PR114 at its path."""
    data = json.loads(plan_text)
    data["instances"][0]["argv"][1] = argv1

    with pytest.raises(DiagnosticError) as caught:
        from_json(json.dumps(data), file="plan.json")

    [found] = caught.value.diagnostics
    assert ("PR114", where) == (found.code, found.span.key_path)
    assert detail in found.detail


def test_a_bytes_object_loads_as_those_exact_bytes_and_round_trips(plan_text):
    """``{"$bytes": "Y2Fm6Q=="}`` is the argument b'caf\\xe9'; the plan writes it back the same way."""
    from poprun.planner.serde import to_json

    data = json.loads(plan_text)
    data["instances"][0]["argv"][1] = {"$bytes": "Y2Fm6Q=="}
    data["instances"][1]["argv"][1] = {"$bytes": "Y2Fm6Q=="}

    plan = from_json(json.dumps(data), file="plan.json")

    assert b"caf\xe9" == plan.instances[0].argv[1].encode("utf-8", "surrogateescape")
    assert plan == from_json(to_json(plan), file="again.json")
    assert '"$bytes": "Y2Fm6Q=="' in to_json(plan)
    to_json(plan).encode("utf-8")  # strict: every character is text


def test_a_dsl_string_with_half_a_surrogate_pair_is_pr108(tmp_path):
    """``set A = "\\ud800"`` decodes to no character: PR108 at the escape, not an internal error at launch."""
    (tmp_path / "job.pop").write_text('run python3 x.py\nset A = "\\ud800"\n')

    status, _, err = _run(["plan", str(tmp_path / "job.pop")])

    assert 2 == status
    assert "error[PR108]: invalid escape in quoted string" in err
    assert "\\ud800 alone is half of a surrogate pair, not a character" in err


def test_run_records_write_bytes_that_are_not_utf8_as_json_escapes():
    """events.jsonl and report.json lines are UTF-8 however a string came in; json reads the same string back."""
    from poprun.runs.jsontext import dumps

    value = {"argv": ["caf\udce9.txt", "\ud800"]}

    text = dumps(value)

    assert '{"argv":["caf\\udce9.txt","\\ud800"]}' == text
    assert value == json.loads(text.encode("utf-8").decode("utf-8"))


@pytest.mark.parametrize("depth", [40, 900, 980])
def test_arrays_nested_deeper_than_any_plan_are_pr114(plan_text, depth):
    """Arrays nested hundreds deep inside a value (that json itself still parses) are PR114, not a RecursionError."""
    text = plan_text.replace('"numa_aware": false', '"numa_aware": ' + "[" * depth + "]" * depth, 1)

    with pytest.raises(DiagnosticError) as caught:
        from_json(text, file="plan.json")

    assert "PR114" == caught.value.diagnostics[0].code
    assert "nested" in caught.value.diagnostics[0].detail
