"""The backend registry: built-ins, plugins from a fake ``*.dist-info`` on sys.path, and its diagnostics."""

import io
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from importlib import import_module
from pathlib import Path

import pytest

from poprun.backends.conformance import probe_plan
from poprun.backends.offline import OfflineBackend
from poprun.backends.registry import BackendRegistry, UnknownBackendError, default_registry
from poprun.backends.testing import RecordingBackend
from poprun.cli.main import main
from poprun.core.diagnostic import DiagnosticError, Severity
from poprun.planner.serde import to_json
from tests.runids import without_run_id

RECORDING = ("from poprun.backends.testing import RecordingBackend\nSHARED = RecordingBackend()\n\n\ndef make():\n"
             "    return SHARED\n")


@pytest.fixture
def plugins(tmp_path, monkeypatch):
    """Return a function that writes a fake distribution (and modules) into tmp_path, on sys.path."""
    monkeypatch.delenv("POPRUN_NO_PLUGINS", raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))

    def make(dist: str, entry_points: dict[str, str], modules: dict[str, str] | None = None) -> None:
        info = tmp_path / f"{dist.replace('-', '_')}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
        lines = "".join(f"{name} = {target}\n" for name, target in entry_points.items())
        (info / "entry_points.txt").write_text(f"[poprun.backends]\n{lines}")
        for module, code in (modules or {}).items():
            (tmp_path / f"{module}.py").write_text(code)

    return make


@pytest.fixture
def module(tmp_path):
    """Return a module name unique to this test, so that sys.modules never serves another test's."""
    return f"{tmp_path.name}_backend"


def unknown(registry: BackendRegistry, name: str) -> UnknownBackendError:
    with pytest.raises(UnknownBackendError) as info:
        registry.get(name)
    return info.value


def test_plugin_is_found_and_used_by_apply(plugins, module, tmp_path, monkeypatch):
    """A backend declared by an installed distribution runs a saved plan that names it."""
    # GIVEN a distribution declaring backend 'gpu' and a plan for it
    plugins("gpu-backend", {"gpu": f"{module}:make"}, {module: RECORDING})
    plan = probe_plan("pass", tmp_path, backend="gpu")
    (tmp_path / "plan.json").write_text(to_json(plan))
    monkeypatch.setenv("CONFORMANCE_FORWARDED", "yes")
    # WHEN the plan is applied
    with redirect_stdout(io.StringIO()), redirect_stderr(io.StringIO()) as err:
        status = main(["apply", str(tmp_path / "plan.json")])
    # THEN the plugin's backend ran exactly that plan
    assert (0, "") == (status, err.getvalue())
    assert (plan,) == tuple(map(without_run_id, import_module(module).SHARED.plans))
    assert ("gpu", "local", "mpirun", "offline", "slurm", "ssh") == default_registry().names()


def test_plugin_named_by_backend_flag_plans_and_runs(plugins, module, tmp_path, monkeypatch):
    """--backend=gpu (an installed plugin): 'poprun plan' accepts it, the classic form runs through it."""
    # GIVEN a distribution declaring backend 'gpu'
    plugins("gpu-backend", {"gpu": f"{module}:make"}, {module: RECORDING})
    monkeypatch.chdir(tmp_path)
    # WHEN it is planned and then run by name
    with redirect_stdout(io.StringIO()) as out, redirect_stderr(io.StringIO()) as err:
        planned = main(["plan", "--backend=gpu", "--format", "json", "--num-instances", "2", "--num-replicas", "2",
                        "true"])
        ran = main(["--backend=gpu", "--num-instances", "2", "--num-replicas", "2", "true"])
    # THEN both succeed and the plugin ran the plan it was given
    assert (0, 0, "") == (planned, ran, err.getvalue())
    assert '"name": "gpu"' in out.getvalue()
    (plan,) = import_module(module).SHARED.plans
    assert ("gpu", 2) == (plan.backend.name, len(plan.instances))


def test_backend_flag_naming_no_installed_backend_is_pr400_at_the_flag(monkeypatch):
    """'poprun plan --backend=gpu-cluster' without such a plugin: PR400 pointing at --backend, exit 2."""
    monkeypatch.setenv("POPRUN_NO_PLUGINS", "1")
    with redirect_stdout(io.StringIO()) as out, redirect_stderr(io.StringIO()) as err:
        status = main(["plan", "--backend=gpu-cluster", "true"])

    assert (2, "") == (status, out.getvalue())
    assert "error[PR400]: unknown backend 'gpu-cluster'\n  --> command line: --backend\n" in err.getvalue()


def test_plugin_class_gives_one_backend_per_registry(plugins, module):
    """An entry point naming a class is its factory: a registry makes one instance, which every get returns."""
    plugins("gpu-backend", {"gpu": f"{module}:Gpu"},
            {module: "from poprun.backends.testing import RecordingBackend\n\nclass Gpu(RecordingBackend):\n"
                     "    name = 'gpu'\n"})
    registry = default_registry()
    first, second = registry.get("gpu"), registry.get("gpu")
    other = default_registry().get("gpu")

    assert (True, True, False) == (isinstance(first, RecordingBackend), first is second, first is other)


def test_plugin_that_fails_to_import_is_a_warning_and_built_ins_still_work(plugins):
    """A missing module is PR401 naming the distribution and the error; local and offline still work."""
    plugins("gpu-cluster-backend", {"gpu-cluster": "no_such_module_anywhere:Backend"})
    registry = default_registry()
    [diag] = registry.warnings

    assert ("PR401", Severity.WARNING, "backend plugin 'gpu-cluster' failed to load") == (
        diag.code, diag.severity, diag.summary)
    assert ("'gpu-cluster' is declared by distribution 'gpu-cluster-backend 1.0' (no_such_module_anywhere:Backend); "
            "loading it raised ModuleNotFoundError: No module named 'no_such_module_anywhere'") == diag.detail
    assert ("reinstall or fix 'gpu-cluster-backend', or set POPRUN_NO_PLUGINS=1 to skip plugins; the other "
            "backends still work") == diag.hint
    assert ("<environment>", "entry point poprun.backends:gpu-cluster") == (diag.span.file, diag.span.key_path)
    assert ("local", "mpirun", "offline", "slurm", "ssh") == registry.names()
    assert isinstance(registry.get("offline"), OfflineBackend)


def test_plugin_that_raises_on_import_is_a_warning(plugins, module):
    """Any exception while importing the plugin is reported with its type and message."""
    plugins("bad-backend", {"bad": f"{module}:Backend"}, {module: "raise RuntimeError('boom')\n"})

    assert "loading it raised RuntimeError: boom" == default_registry().warnings[0].detail.split("; ")[1]


def test_entry_point_that_is_not_callable_is_a_warning(plugins, module):
    """An entry point naming a constant cannot make a backend: PR401."""
    plugins("odd-backend", {"odd": f"{module}:NAME"}, {module: "NAME = 'odd'\n"})
    registry = default_registry()

    assert f"loading it raised TypeError: {module}:NAME is a str, not a class or function" == (
        registry.warnings[0].detail.split("; ")[1])
    assert ("local", "mpirun", "offline", "slurm", "ssh") == registry.names()


def test_asking_for_a_plugin_that_failed_is_unknown_and_says_why(plugins):
    """get() of the broken plugin's name is PR400 pointing back at PR401."""
    plugins("gpu-cluster-backend", {"gpu-cluster": "no_such_module_anywhere:Backend"})
    error = unknown(default_registry(), "gpu-cluster")

    assert ("PR400", ("'gpu-cluster' is declared by distribution 'gpu-cluster-backend 1.0' "
                      "(no_such_module_anywhere:Backend), which failed to load (see PR401)")) == (
        error.diagnostics[0].code, error.diagnostics[0].detail)


def test_plugin_named_like_a_built_in_is_a_warning_and_the_built_in_stays(plugins, module):
    """A plugin called 'local' is PR463 (never imported); 'local' is still the built-in."""
    plugins("fast-local", {"local": f"{module}:Backend"}, {module: "raise RuntimeError('imported')\n"})
    registry = default_registry()
    [diag] = registry.warnings

    assert ("PR463", "backend plugin 'local' is ignored: the name is a built-in backend's") == (diag.code, diag.summary)
    assert (f"'local' is built in to poprun and also declared by distribution 'fast-local 1.0' ({module}:Backend); the "
            "built-in is used") == diag.detail
    assert ("ask the authors of 'fast-local' to give their backend a name of its own, or uninstall it; "
            "POPRUN_NO_PLUGINS=1 skips plugins") == diag.hint
    assert ("local", "mpirun", "offline", "slurm", "ssh") == registry.names()
    assert "LocalBackend" == type(registry.get("local")).__name__


def test_two_plugins_with_one_name_is_an_error_naming_both(plugins):
    """Two distributions declaring 'gpu' make 'gpu' PR402, naming both distributions."""
    plugins("alpha-gpu", {"gpu": "alpha_gpu:Backend"})
    plugins("beta-gpu", {"gpu": "beta_gpu:Backend"})
    diag = unknown(default_registry(), "gpu").diagnostics[0]

    assert ("'gpu' is declared by distribution 'alpha-gpu 1.0' (alpha_gpu:Backend) and also declared by "
            "distribution 'beta-gpu 1.0' (beta_gpu:Backend)") == diag.detail
    assert "uninstall 'alpha-gpu' or 'beta-gpu', or set POPRUN_NO_PLUGINS=1 to use only the built-in backends" == (
        diag.hint)


@pytest.mark.parametrize(("value", "names"), [("1", ("local", "mpirun", "offline", "slurm", "ssh")), ("yes", ("local", "mpirun", "offline", "slurm", "ssh")),
                                              ("0", ("gpu", "local", "mpirun", "offline", "slurm", "ssh"))])
def test_poprun_no_plugins_skips_discovery(plugins, module, monkeypatch, value, names):
    """POPRUN_NO_PLUGINS=1 (or yes) imports no plugin and lists only the built-ins; 0 keeps discovery."""
    plugins("gpu-backend", {"gpu": f"{module}:make"}, {module: RECORDING})
    monkeypatch.setenv("POPRUN_NO_PLUGINS", value)
    registry = default_registry()

    assert (names, ()) == (registry.names(), registry.warnings)


def test_unknown_name_suggests_the_nearest_and_lists_the_names():
    """'locl' is PR400 with a did-you-mean and the known names; it is also a KeyError with one line."""
    error = unknown(default_registry(environ={"POPRUN_NO_PLUGINS": "1"}), "locl")
    diag = error.diagnostics[0]

    assert ("PR400", "unknown backend 'locl'") == (diag.code, diag.summary)
    assert "no backend named 'locl' is built in to poprun or installed as a plugin" == diag.detail
    assert "did you mean 'local'? known backends: 'local', 'mpirun', 'offline', 'slurm', 'ssh'" == diag.hint
    assert isinstance(error, KeyError) and isinstance(error, DiagnosticError)
    assert ("unknown backend 'locl': did you mean 'local'? known backends: 'local', 'mpirun', 'offline', 'slurm', 'ssh'",) == error.args


def test_unknown_name_far_from_every_name_only_lists_them():
    """A name close to none gets the list alone."""
    diag = unknown(BackendRegistry({"local": RecordingBackend}), "kubernetes").diagnostics[0]

    assert "known backends: 'local'" == diag.hint


def test_slurm_is_a_built_in_backend():
    """'slurm' ships (PR404 is retired): the registry makes a SlurmBackend, importing its module only then."""
    registry = default_registry(environ={"POPRUN_NO_PLUGINS": "1"})

    assert "slurm" == registry.get("slurm").name


def test_span_given_by_the_caller_places_the_diagnostic():
    """The caller says where the name came from (the plan file's $.backend.name)."""
    from poprun.core.span import SourceSpan

    span = SourceSpan(file="plan.json", key_path="$.backend.name")
    with pytest.raises(UnknownBackendError) as info:
        BackendRegistry().factory("locl", span=span)

    assert span == info.value.diagnostics[0].span


def test_register_refuses_a_different_factory_for_a_name():
    """Registering the same factory twice is fine; another factory under a taken name is a ValueError."""
    registry = BackendRegistry({"rec": RecordingBackend})
    registry.register("rec", RecordingBackend)

    with pytest.raises(ValueError, match="backend 'rec' is already registered with another factory"):
        registry.register("rec", OfflineBackend)


def test_default_registry_is_built_on_every_call():
    """No global cache: each call returns a new registry."""
    assert default_registry() is not default_registry()


def test_built_in_backends_import_their_module_only_when_used(tmp_path):
    """Building the registry imports neither the local nor the offline backend module."""
    code = ("import sys; from poprun.backends.registry import default_registry; r = default_registry(); "
            "print('poprun.backends.local' in sys.modules); r.get('offline'); print('poprun.backends.local' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path,
                          env={"PYTHONPATH": str(Path(__file__).parents[2]), "POPRUN_NO_PLUGINS": "1"})

    assert "False\nTrue\n" == done.stdout


def test_entry_points_can_be_given_without_a_distribution():
    """Entry points passed in (no distribution known) are loaded the same way, and say so when they fail."""
    from importlib.metadata import EntryPoint

    points = [EntryPoint(name="rec", value="poprun.backends.testing:RecordingBackend", group="poprun.backends"),
              EntryPoint(name="gone", value="no_such_module_anywhere:X", group="poprun.backends")]
    registry = default_registry(environ={}, entry_points=points)
    [diag] = registry.warnings

    assert ("local", "mpirun", "offline", "rec", "slurm", "ssh") == registry.names()
    assert isinstance(registry.get("rec"), RecordingBackend)
    assert ("'gone' is declared by an unknown distribution (no_such_module_anywhere:X); loading it raised "
            "ModuleNotFoundError: No module named 'no_such_module_anywhere'") == diag.detail
    assert diag.hint.startswith("reinstall or fix the plugin, ")
