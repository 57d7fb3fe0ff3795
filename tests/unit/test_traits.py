"""Backend traits as data: the table, the plan's record of them, and no decision by a backend's name."""

import ast
import json
from pathlib import Path

import pytest

from poprun.planner import serde
from poprun.planner.trait import BUILTIN, CONSERVATIVE, NAMES, Traits, builtin_traits, restarting_names, traits_of

ROOT = Path(__file__).parents[2] / "poprun"
# The tables outside the backends that spell the built-ins' names: the traits table, and the settings
# table's column of the backends that read a setting (data, not a decision).
ALLOWED = {ROOT / "planner" / "trait.py", ROOT / "planner" / "setting.py"}


def _names_in(node: ast.AST) -> list[str]:
    """Return the built-in backend names a string constant, or a literal collection of them only, spells."""
    if isinstance(node, ast.Constant) and node.value in NAMES:
        return [node.value]
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        strings = [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        if strings and len(strings) == len(node.elts) and all(s in NAMES for s in strings):
            return strings
    return []


def _name_decisions(text: str, where: str) -> list[str]:
    """Return ``where:line`` of each comparison with a built-in backend's name, and each collection of such names."""
    tree = ast.parse(text)
    found: dict[int, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            spelled = [n for side in (node.left, *node.comparators) for n in _names_in(side)]
        elif isinstance(node, ast.Tuple | ast.List | ast.Set | ast.Dict):
            keys = node.keys if isinstance(node, ast.Dict) else [node]
            spelled = [n for k in keys if k is not None for n in _names_in(k)]
            spelled = spelled if isinstance(node, ast.Dict) or len(spelled) > 1 else []
        else:
            continue
        if spelled:
            found.setdefault(node.lineno, f"{where}:{node.lineno}: {', '.join(spelled)}")
    return [found[line] for line in sorted(found)]


def test_nothing_outside_the_backends_decides_by_a_backend_name():
    """No module outside poprun/backends compares with a built-in backend's name or lists such names: it reads traits."""
    files = [f for f in sorted(ROOT.rglob("*.py")) if "backends" not in f.relative_to(ROOT).parts[:1]
             and f not in ALLOWED]

    assert [] == [where for f in files
                  for where in _name_decisions(f.read_text(encoding="utf-8"), str(f.relative_to(ROOT.parent)))]


def test_the_check_finds_each_way_of_deciding_by_name():
    """The check above sees the spellings it forbids (it would pass vacuously otherwise), and not a mere mention."""
    text = ('a = b == "ssh"\nc = d not in ("local", "offline")\nHERE = ("local", "offline")\n'
            'R = {"local": "why"}\nd = ["ssh", "-G", name]\nreturn "slurm", reason\n')

    assert ["x:1: ssh", "x:2: local, offline", "x:3: local, offline", "x:4: local"] == _name_decisions(text, "x")


@pytest.mark.parametrize("name", NAMES)
def test_each_built_in_has_a_row_and_its_class_agrees(name):
    """Every built-in has traits in the table; traits_of finds them for a backend object by its name."""

    class Fake:
        pass

    fake = Fake()
    fake.name = name  # type: ignore[attr-defined]

    assert BUILTIN[name] == traits_of(fake) == builtin_traits(name)


def test_a_plugin_without_traits_gets_the_conservative_ones_and_one_with_them_its_own():
    """A plugin that declares nothing is taken to run nowhere here, reach no host itself and restart nothing alone."""
    mine = Traits(all_here=True, restarts_instance=True)

    class Declares:
        name = "demo"
        traits = mine

    class Silent:
        name = "demo"

    assert (mine, CONSERVATIVE) == (traits_of(Declares()), traits_of(Silent()))
    assert (False, "none", False, True, False) == (CONSERVATIVE.all_here, CONSERVATIVE.reaches,
                                                   CONSERVATIVE.restarts_instance, CONSERVATIVE.late_cwd,
                                                   CONSERVATIVE.mpi_world)


def test_the_pr450_hint_names_the_built_ins_that_restart_one_instance():
    """The backends that restart one instance come from the table, in its order."""
    assert ("local", "offline", "ssh") == restarting_names()


def _plan_json(*argv: str) -> dict:
    from poprun.planner.context import Context
    from poprun.planner.flags import parse_flags
    from poprun.planner.solve import solve

    ctx = Context(environ={}, cwd="/work", local_names=("localhost", "127.0.0.1", "::1"))
    spec = parse_flags(list(argv), environ={}, prog="poprun plan").spec
    return json.loads(serde.to_json(solve(spec, ctx).plan))


def test_an_older_plan_loads_with_the_tables_traits_and_the_settings_defaults():
    """A plan saved before traits and settings were recorded loads as one planned now with the defaults."""
    data = _plan_json("--host", "pod1,pod2", "--num-instances", "2", "--num-replicas", "2", "true")
    old = json.loads(json.dumps(data))
    del old["backend"]["traits"], old["backend"]["settings"]

    loaded = serde.from_json(json.dumps(old))

    assert data == json.loads(serde.to_json(loaded))
    assert ("ssh", BUILTIN["ssh"]) == (loaded.backend.name, loaded.backend.traits)
    assert "auto" == loaded.backend.setting("POPRUN_SSH_FANOUT")


@pytest.mark.parametrize(("change", "path"), [
    (lambda b: b["traits"].update(reaches="telepathy"), "$.backend.traits.reaches"),
    (lambda b: b["settings"].reverse(), "$.backend.settings"),
    (lambda b: b["settings"][0].update(name="HOME"), "$.backend.settings[0].name"),
    (lambda b: b["settings"][0].update(source="the moon"), "$.backend.settings[0].source"),
    (lambda b: b["settings"][2].update(value="lots"), "$.backend.settings[2].value"),
    (lambda b: b["settings"][3].update(value="sometimes"), "$.backend.settings[3].value"),
])
def test_a_saved_plan_with_broken_traits_or_settings_is_refused(change, path):
    """plancheck checks the backend record's new keys of an untrusted plan: one PR114 naming the path."""
    from poprun.core.diagnostic import DiagnosticError

    data = _plan_json("--host", "pod1,pod2", "--num-instances", "2", "--num-replicas", "2", "true")
    change(data["backend"])

    with pytest.raises(DiagnosticError) as raised:
        serde.from_json(json.dumps(data))

    assert [("PR114", path)] == [(d.code, d.span.key_path) for d in raised.value.diagnostics]


def test_a_saved_plan_with_a_plugins_own_setting_loads():
    """A setting no row of poprun's names (a plugin's) loads as it is: its backend reads it."""
    data = _plan_json("--host", "pod1,pod2", "--num-instances", "2", "--num-replicas", "2", "true")
    data["backend"]["settings"].append({"name": "POPRUN_ZZ_PLUGIN", "value": "x", "source": "default"})

    assert "x" == serde.from_json(json.dumps(data)).backend.setting("POPRUN_ZZ_PLUGIN")


def test_the_plan_records_the_settings_the_planning_shell_set_and_the_backend_reads_only_those():
    """given_settings: what the shell set, by name; defaults are left to the backend, as when unset."""
    from poprun.planner.context import Context
    from poprun.planner.flags import parse_flags
    from poprun.planner.solve import solve

    spec = parse_flags(["--host", "pod1,pod2", "--num-instances", "2", "--num-replicas", "2", "true"], environ={}).spec
    plan = solve(spec, Context(environ={"POPRUN_SSH_FANOUT": "12", "POPRUN_SSH_RELAY": ""})).plan

    assert {"POPRUN_SSH_FANOUT": "12"} == plan.backend.given_settings()


def test_what_is_asked_without_the_plan_gets_the_plans_settings_in_place_of_the_shells():
    """with_settings: the shell's value of a planned setting goes; the plan's set value comes; the rest stays."""
    from poprun.core.record import evolve
    from poprun.planner.plan import BackendChoice, BackendSetting

    choice = evolve(BackendChoice(name="ssh", reason="r"), settings=(
        BackendSetting(name="POPRUN_SSH_CONFIG", value="planned.cfg", source="environment variable POPRUN_SSH_CONFIG"),
        BackendSetting(name="POPRUN_SSH_RELAY", value="auto", source="default")))

    assert {"PATH": "/bin", "POPRUN_SSH_CONFIG": "planned.cfg"} == choice.with_settings(
        {"PATH": "/bin", "POPRUN_SSH_CONFIG": "shell.cfg", "POPRUN_SSH_RELAY": "junk"})


def _solved(argv: list[str], declares=None, environ=None):
    from poprun.planner.context import Context
    from poprun.planner.flags import parse_flags
    from poprun.planner.solve import solve

    spec = parse_flags(argv, environ={}).spec
    ctx = Context(environ=environ or {}, local_names=("localhost", "127.0.0.1", "::1"), backend_declares=declares,
                  ssh_hostname=lambda name, _env: {"pod1": "10.0.0.1"}.get(name))
    return solve(spec, ctx).plan


@pytest.mark.parametrize(("traits", "master_addr"), [
    (Traits(all_here=True), "localhost"),  # runs everything here: instance 0 is reached at localhost
    (Traits(reaches="ssh"), "10.0.0.1"),  # started through ssh: the address ssh_config maps pod1 to
    (None, "pod1"),  # declares nothing: conservative, the name as written
])
def test_a_plugins_declared_traits_decide_what_a_built_ins_name_decided(traits, master_addr):
    """MASTER_ADDR follows a plugin's traits as it follows the built-ins': no decision by the name."""
    argv = ["--backend", "farm", "--host", "pod1,pod2", "--num-instances", "2", "--num-replicas", "2", "true"]
    plan = _solved(argv, declares=lambda _name: (traits, ()))

    assert (traits or CONSERVATIVE, master_addr) == (plan.backend.traits, plan.instances[0].env.get("MASTER_ADDR"))


def test_a_plan_without_a_registry_gives_a_plugin_the_conservative_traits():
    """Planning with no way to ask the registry (a Context of its own) records the conservative traits (and apply's settings only)."""
    argv = ["--backend", "farm", "--host", "pod1,pod2", "--num-instances", "2", "--num-replicas", "2", "true"]

    assert (CONSERVATIVE, ("POPRUN_STRAGGLER_FACTOR", "POPRUN_STRAGGLER_WINDOW")) == (
        _solved(argv).backend.traits, tuple(s.name for s in _solved(argv).backend.settings))
