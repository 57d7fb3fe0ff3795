"""
A saved plan is untrusted input: whatever is done to its JSON, poprun refuses it with a diagnostic, or shows what apply runs.

Each example mutates a valid plan (deleted keys, values of another type, hostile strings, huge
numbers, keys no plan has at any depth, duplicated, removed or swapped instances) and loads it through the real CLI
(``poprun plan PLAN.json --explain``, what ``poprun apply`` reads). A refusal is exit 2 with a
coded diagnostic and no traceback; an accepted plan round-trips through JSON, and its explain
text names every instance's host and program, so explain and apply cannot disagree.
"""

import copy
import io
import json
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from poprun.cli.main import main
from poprun.core.diagnostic import DiagnosticError
from poprun.core.rawbytes import shell_join
from poprun.core.record import evolve
from poprun.planner.context import Context
from poprun.planner.serde import from_json, to_json
from poprun.planner.solve import solve
from tests.strategies import specs

CTX = Context(environ={"PATH": "/bin"}, cwd="/w")

HOSTILE = [None, True, False, 0, -1, 1, 2, 1.5, 10**30, -(10**30), "", "\0", "a\0b", "-oProxyCommand=x", "$(id)",
           "`id`", "a b", "a\nb", "a;b", "'\"", "\\", "0-4000000000", "4000000000", "x" * 5000, [], [""], ["-x"],
           {}, {"A": "b"}, {"A-B": "c"}, {"": ""}, "pod1", "localhost", "1", "true", "ÿ", float("nan"),
           float("inf"), 1e308, {"$bytes": "cG9kMg=="}, {"$bytes": "6Q=="}, {"$bytes": "!"}, "\udce9", "\ud800"]
BASE_ARGV = ["plan", "--format", "json", "--host", "localhost,pod2,pod3", "--num-instances", "3", "--num-replicas",
             "6", "--mpi-local-args=-x FORWARDED -x SET=1", "--mask", "SET", "--backend", "offline",
             "python3", "train.py", "--epochs", "3"]


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = main(argv)
    return status, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def base_plan() -> dict:
    status, out, err = _run(BASE_ARGV)
    assert (0, "") == (status, err)
    return json.loads(out)


def _paths(data: object, path: tuple = ()) -> list[tuple]:
    """Return the path of every value in ``data`` (keys of objects, indices of arrays), 12 levels deep at most."""
    found = [path]
    if len(path) >= 12:
        return found
    if isinstance(data, dict):
        for key, value in data.items():
            found += _paths(value, (*path, key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            found += _paths(value, (*path, index))
    return found


def _at(data: object, path: tuple) -> object:
    for step in path:
        data = data[step]  # type: ignore[index]
    return data


@st.composite
def mutated(draw: st.DrawFn, base: dict) -> dict:
    """Return ``base`` with one to three mutations."""
    data = copy.deepcopy(base)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["replace", "replace", "replace", "delete", "add", "duplicate", "remove", "swap"]))
        instances = data.get("instances") if isinstance(data, dict) else None
        if kind in ("duplicate", "remove", "swap") and isinstance(instances, list) and instances:
            i = draw(st.integers(0, len(instances) - 1))
            j = draw(st.integers(0, len(instances) - 1))
            if kind == "duplicate":
                instances.insert(j, copy.deepcopy(instances[i]))
            elif kind == "remove":
                del instances[i]
            else:
                instances[i], instances[j] = instances[j], instances[i]
            continue
        if kind == "add":  # a key the object does not have, in any object (the root too)
            objects = [p for p in _paths(data) if isinstance(_at(data, p), dict)]
            _at(data, draw(st.sampled_from(objects)))[draw(st.sampled_from(["surprise", "Env", "argv "]))] = 1
            continue
        paths = [p for p in _paths(data) if p]
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent = data
        for step in path[:-1]:
            parent = parent[step]
        if kind == "delete":
            del parent[path[-1]]
        else:
            parent[path[-1]] = copy.deepcopy(draw(st.sampled_from(HOSTILE)))  # never the shared object itself
    return data


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_mutated_plan_is_refused_or_explained_as_applied(base_plan, tmp_path, monkeypatch, data):
    """Every mutation gives exit 2 with a diagnostic, or a plan whose explain names every instance's host and program."""
    monkeypatch.chdir(tmp_path)
    mutation = data.draw(mutated(base_plan))
    Path("plan.json").write_text(json.dumps(mutation), encoding="utf-8")

    status, out, err = _run(["plan", "plan.json", "--explain"])

    assert "internal error" not in err
    assert "Traceback" not in err
    if status != 0:
        assert 2 == status
        assert err.startswith("error[PR11"), err
        return
    plan = from_json(Path("plan.json").read_text(encoding="utf-8"), file="plan.json")
    assert plan == from_json(to_json(plan), file="again.json")
    for instance in plan.instances:
        assert instance.host in out
        assert (shell_join(instance.argv) if instance.argv else "(no program)") in out


def test_the_unmutated_plan_is_explained_with_its_program(base_plan, tmp_path, monkeypatch):
    """The base plan loads, and its explain names the program and masks the --mask variable."""
    monkeypatch.chdir(tmp_path)
    Path("plan.json").write_text(json.dumps(base_plan), encoding="utf-8")

    status, out, err = _run(["plan", "plan.json", "--explain"])

    assert (0, "") == (status, err)
    assert "program: python3 train.py --epochs 3\n" in out
    assert "SET=********" in out


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(specs())
def test_every_plan_the_solver_makes_loads_back(spec):
    """The checks of a saved plan refuse nothing the solver makes: every solved spec's JSON loads as the same plan."""
    spec = evolve(spec, replicas=None, instances=None, ilds=None, ipus_per_replica=None, host_file=None,
                  only_output_from_instance=None, instance_args=(), offline_target=None)  # mostly solvable
    try:
        plan = solve(spec, CTX, require_program=False).plan
    except DiagnosticError:
        return

    assert plan == from_json(to_json(plan), file="plan.json")
