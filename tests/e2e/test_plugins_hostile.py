"""
Backend plugins that misbehave, installed for real (a ``*.dist-info`` on ``PYTHONPATH``) and met through the real CLI.

A plugin that exits, interrupts or prints at import, whose constructor, ``launch`` or
``wait`` raises or returns something else than the protocol says, or that takes a built-in's
name: each is a coded diagnostic naming its entry point and distribution (PR401, PR460-PR463),
never an internal error and never poprun's exit; the built-in backends keep working, and the
run's record ends (``report.json``), never ``lost``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

HINT = "fix or uninstall 'gpu-backend', or set POPRUN_NO_PLUGINS=1 to use only the built-in backends"
BACKEND = """
from poprun.backends.testing import RecordingBackend


class Gpu:
    name = "gpu"

    def __init__(self):
        {init}

    def launch(self, plan, *, env_source, sink, cache=None):
        {launch}
        return Launch(RecordingBackend().launch(plan, env_source=env_source, sink=sink, cache=cache))


class Launch:
    def __init__(self, inner):
        self.inner = inner

    def wait(self):
        {wait}
        return self.inner.wait()

    def terminate(self, grace_s):
        self.inner.terminate(grace_s)
"""


def install(folder: Path, *, module: str = "", name: str = "gpu", target: str = "gpu_backend:Gpu") -> Path:
    """Install distribution 'gpu-backend 1.0' in ``folder``, declaring backend ``name`` as ``target``; return folder."""
    info = folder / "gpu_backend-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: gpu-backend\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[poprun.backends]\n{name} = {target}\n")
    (folder / "gpu_backend.py").write_text(module)
    return folder


def backend(*, init: str = "pass", launch: str = "pass", wait: str = "pass") -> str:
    return BACKEND.format(init=init, launch=launch, wait=wait)


def poprun(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k != "POPRUN_NO_PLUGINS"}
    environ |= {"PYTHONPATH": str(cwd / "site"), "POPRUN_RUNS_DIR": str(cwd / "runs"), **(env or {})}
    return subprocess.run([sys.executable, "-m", "poprun.cli.main", *args], cwd=cwd, capture_output=True, text=True,
                          env=environ, timeout=50, check=False)


def reports(runs: Path) -> list[dict[str, object]]:
    """Return the report.json of every run under ``runs`` (a run without one would be lost)."""
    runs_made = sorted(p for p in runs.iterdir() if p.is_dir())
    return [json.loads((run / "report.json").read_text()) for run in runs_made]


@pytest.mark.parametrize(("raises", "shown"), [
    ("import sys; sys.exit(3)", "SystemExit: 3"),
    ("raise KeyboardInterrupt", "KeyboardInterrupt"),
    ("raise GeneratorExit('odd')", "GeneratorExit: odd"),
])
def test_a_plugin_that_exits_at_import_is_a_warning_and_built_ins_still_run(tmp_path: Path, raises: str,
                                                                            shown: str) -> None:
    """sys.exit(), KeyboardInterrupt or GeneratorExit while importing a plugin: PR401, and the launch runs as planned."""
    install(tmp_path / "site", module=raises + "\n")

    done = poprun("--num-instances", "2", "--num-replicas", "2", "echo", "ran", cwd=tmp_path)

    assert (0, "ran\nran\n") == (done.returncode, done.stdout), done.stderr
    assert done.stderr.startswith("warning[PR401]: backend plugin 'gpu' failed to load\n"), done.stderr
    assert f"; loading it raised {shown}\n" in done.stderr


@pytest.mark.parametrize("how", ["print('hello from the plugin')",
                                 "import os; os.write(1, b'hello from the plugin\\n')"])
def test_a_plugin_that_prints_at_import_leaves_the_json_plan_whole(tmp_path: Path, how: str) -> None:
    """A plugin printing to stdout (print or fd 1) while imported: `plan --format json` prints the plan alone."""
    install(tmp_path / "site", module=how + "\n" + backend())

    done = poprun("plan", "--backend", "gpu", "--format", "json", "--num-replicas", "2", "true", cwd=tmp_path)

    assert 0 == done.returncode, done.stderr
    assert "gpu" == json.loads(done.stdout)["backend"]["name"]
    assert "hello from the plugin\n" == done.stderr


def test_a_plugin_that_prints_when_made_leaves_the_text_plan_whole(tmp_path: Path) -> None:
    """A constructor that prints: `poprun plan` shows the plan only, the plugin's words go to stderr."""
    install(tmp_path / "site", module=backend(init="print('made')"))

    done = poprun("plan", "--backend", "gpu", "--num-replicas", "2", "true", cwd=tmp_path)

    assert (0, "made\n") == (done.returncode, done.stderr)
    assert "made" not in done.stdout


@pytest.mark.parametrize(("where", "code", "what"), [
    ("init", "PR460", "making it raised RuntimeError: no GPU here"),
    ("launch", "PR461", "its launch() raised RuntimeError: no GPU here"),
    ("wait", "PR462", "its wait() raised RuntimeError: no GPU here"),
])
def test_a_plugin_that_raises_is_a_diagnostic_naming_it_and_the_run_ends(tmp_path: Path, where: str, code: str,
                                                                         what: str) -> None:
    """Its constructor, launch or wait raises: the code, the entry point, the distribution; 125; the record ends."""
    install(tmp_path / "site", module=backend(**{where: "raise RuntimeError('no GPU here')"}))

    done = poprun("--backend", "gpu", "--num-instances", "2", "--num-replicas", "2", "true", cwd=tmp_path)

    assert (125, "") == (done.returncode, done.stdout)
    assert done.stderr.startswith(f"error[{code}]: backend plugin 'gpu' failed\n"
                                  "  --> entry point poprun.backends:gpu\n"
                                  "   = 'gpu' is declared by distribution 'gpu-backend 1.0' (gpu_backend:Gpu); "
                                  f"{what}\n   = hint: {HINT}\n"), done.stderr
    assert "internal error" not in done.stderr
    assert [125] == [report["status"] for report in reports(tmp_path / "runs")]


@pytest.mark.parametrize(("where", "code", "garbage", "what"), [
    ("launch", "PR461", "return 42", "its launch() returned int, not a Launch (wait and terminate)"),
    ("wait", "PR462", "return {'statuses': [0]}", "its wait() returned dict, not an ApplyResult"),
    ("launch", "PR461", "import sys; sys.exit(0)", "its launch() raised SystemExit: 0"),
    ("wait", "PR462", "import sys; sys.exit(0)", "its wait() raised SystemExit: 0"),
])
def test_a_plugin_that_returns_garbage_or_exits_is_a_diagnostic(tmp_path: Path, where: str, code: str, garbage: str,
                                                                 what: str) -> None:
    """launch or wait returns what the protocol does not say, or calls sys.exit(): its code, 125, never 0."""
    install(tmp_path / "site", module=backend(**{where: garbage}))

    done = poprun("--backend", "gpu", "--num-instances", "2", "--num-replicas", "2", "true", cwd=tmp_path)

    assert 125 == done.returncode, done.stderr
    assert f"error[{code}]: backend plugin 'gpu' failed\n" in done.stderr
    assert f"(gpu_backend:Gpu); {what}\n" in done.stderr
    assert [125] == [report["status"] for report in reports(tmp_path / "runs")]


def test_a_constructor_that_returns_no_backend_is_pr460(tmp_path: Path) -> None:
    """An entry point (a function) that returns None instead of a backend: PR460, 125."""
    install(tmp_path / "site", module="def make():\n    return None\n", target="gpu_backend:make")

    done = poprun("--backend", "gpu", "--num-replicas", "2", "true", cwd=tmp_path)

    assert 125 == done.returncode, done.stderr
    assert "(gpu_backend:make); making it returned None, not a backend (no launch)\n" in done.stderr


def test_a_plugin_named_like_a_built_in_is_a_warning_and_the_built_in_runs(tmp_path: Path) -> None:
    """A plugin declaring 'local' is never imported: PR463 warns once, the local backend runs the launch."""
    install(tmp_path / "site", module="raise RuntimeError('imported')\n", name="local")

    done = poprun("--num-instances", "2", "--num-replicas", "2", "echo", "ran", cwd=tmp_path)

    assert (0, "ran\nran\n") == (done.returncode, done.stdout)
    assert ("warning[PR463]: backend plugin 'local' is ignored: the name is a built-in backend's\n"
            "  --> entry point poprun.backends:local\n"
            "   = 'local' is built in to poprun and also declared by distribution 'gpu-backend 1.0' "
            "(gpu_backend:Gpu); the built-in is used\n"
            "   = hint: ask the authors of 'gpu-backend' to give their backend a name of its own, or uninstall it; "
            "POPRUN_NO_PLUGINS=1 skips plugins\n") == done.stderr


def test_poprun_no_plugins_is_the_way_out(tmp_path: Path) -> None:
    """A plugin that exits at import, with POPRUN_NO_PLUGINS=1: not imported, nothing said, the launch runs."""
    install(tmp_path / "site", module="import sys; sys.exit(3)\n")

    done = poprun("--num-instances", "2", "--num-replicas", "2", "echo", "ran", cwd=tmp_path,
                  env={"POPRUN_NO_PLUGINS": "1"})

    assert (0, "ran\nran\n", "") == (done.returncode, done.stdout, done.stderr)


@pytest.mark.parametrize(("status", "expected"), [("0", 125), ("'x'", 125), ("127", 127)])
def test_a_launch_error_with_a_status_poprun_cannot_exit_with_is_pr461(tmp_path: Path, status: str,
                                                                        expected: int) -> None:
    """LaunchError(status=0) would say a launch that ran nothing succeeded: PR461, 125; 127 is the plugin's to say."""
    install(tmp_path / "site", module=backend(
        launch=f"from poprun.backends import LaunchError; raise LaunchError('no GPU', status={status})"))

    done = poprun("--backend", "gpu", "--num-replicas", "2", "true", cwd=tmp_path)

    assert expected == done.returncode, done.stderr
    assert ("error[PR461]: backend plugin 'gpu' failed\n" in done.stderr) == (expected == 125)


def test_a_result_whose_root_cause_is_no_instance_is_pr462(tmp_path: Path) -> None:
    """wait() returns an ApplyResult blaming instance 7 of 2: PR462, 125, never an internal error."""
    install(tmp_path / "site", module=backend(
        wait="from poprun.core.outcome import ApplyResult; return ApplyResult(statuses=(0, 1), root_cause=7)"))

    done = poprun("--backend", "gpu", "--num-instances", "2", "--num-replicas", "2", "true", cwd=tmp_path)

    assert 125 == done.returncode, done.stderr
    assert "(gpu_backend:Gpu); its wait() returned an ApplyResult whose root_cause 7 is not one of its 2 statuses\n" \
        in done.stderr


def test_capabilities_that_are_no_set_of_names_are_pr460(tmp_path: Path) -> None:
    """A backend class whose capabilities is 5: PR460 when it is made, not an internal error in apply."""
    install(tmp_path / "site", module=backend().replace('name = "gpu"', 'name = "gpu"\n    capabilities = 5'))

    done = poprun("--backend", "gpu", "--num-replicas", "2", "true", cwd=tmp_path)

    assert 125 == done.returncode, done.stderr
    assert "(gpu_backend:Gpu); its capabilities is int, not a set of names\n" in done.stderr


@pytest.mark.parametrize("describe", ["raise RuntimeError('boom')", "print('noise'); return 'prefix: nice\\n'"])
def test_a_plugin_describe_that_raises_or_prints_leaves_the_plan_whole(tmp_path: Path, describe: str) -> None:
    """`poprun plan` asks the plugin to describe itself: raising shows the plan without it; its prints go to stderr."""
    install(tmp_path / "site", module=backend().replace(
        "    def launch(", f"    def describe(self, plan):\n        {describe}\n\n    def launch("))

    done = poprun("plan", "--backend", "gpu", "--num-replicas", "2", "true", cwd=tmp_path)

    assert 0 == done.returncode, done.stderr
    assert "noise" not in done.stdout
    assert "internal error" not in done.stderr
    assert ("prefix: nice" in done.stdout) == ("print" in describe)


def test_a_plugin_formats_that_raises_is_passed_over(tmp_path: Path) -> None:
    """A plugin whose formats() raises: an unknown --format is still PR-coded, not an internal error."""
    install(tmp_path / "site", module=backend().replace(
        "    def launch(", "    def formats(self):\n        raise RuntimeError('boom')\n\n    def launch("))

    done = poprun("plan", "--format", "nosuch", "--num-replicas", "2", "true", cwd=tmp_path)

    assert 2 == done.returncode, done.stderr
    assert "internal error" not in done.stderr


@pytest.mark.parametrize(("method", "signature"), [("prepare", "plan, *, environ"),
                                                   ("run_on_host", "host, script, *, environ, timeout_s")])
def test_a_plugin_method_asked_before_the_launch_that_raises_is_pr461(tmp_path: Path, method: str,
                                                                      signature: str) -> None:
    """prepare() or run_on_host() (read before instance 0's host is launched on) raises: PR461, 125, the record ends."""
    install(tmp_path / "site", module=backend().replace(
        "    def launch(", f"    def {method}(self, {signature}):\n        raise RuntimeError('no cluster')\n\n"
                          "    def launch("))

    done = poprun("--backend", "gpu", "--host", "pod1", "--num-replicas", "2", "true", cwd=tmp_path)

    assert 125 == done.returncode, done.stderr
    assert f"(gpu_backend:Gpu); its {method}() raised RuntimeError: no cluster\n" in done.stderr
    assert [125] == [report["status"] for report in reports(tmp_path / "runs")]


def test_a_run_on_host_that_answers_garbage_is_pr461(tmp_path: Path) -> None:
    """run_on_host() returns None instead of (status, output): PR461, 125, never an internal error."""
    install(tmp_path / "site", module=backend().replace(
        "    def launch(", "    def run_on_host(self, host, script, *, environ, timeout_s):\n        return None\n\n"
                          "    def launch("))

    done = poprun("--backend", "gpu", "--host", "pod1", "--num-replicas", "2", "true", cwd=tmp_path)

    assert 125 == done.returncode, done.stderr
    assert "(gpu_backend:Gpu); its run_on_host() returned None, not (status, output)\n" in done.stderr


def test_ctrl_c_while_a_plugin_hangs_at_import_stops_poprun_and_starts_nothing(tmp_path: Path) -> None:
    """A plugin whose import never ends: Ctrl-C is poprun's stop (130, nothing run), not a plugin that failed to load."""
    install(tmp_path / "site", module="import pathlib, time\npathlib.Path('importing').touch()\ntime.sleep(600)\n")
    environ = {k: v for k, v in os.environ.items() if k != "POPRUN_NO_PLUGINS"}
    environ |= {"PYTHONPATH": str(tmp_path / "site"), "POPRUN_RUNS_DIR": str(tmp_path / "runs")}
    proc = subprocess.Popen([sys.executable, "-m", "poprun.cli.main", "--num-instances", "2", "--num-replicas", "2",
                             "echo", "ran"], cwd=tmp_path, env=environ, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not (tmp_path / "importing").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)

    assert (130, "", "PR401" in err) == (proc.returncode, out, False), err
