"""
The plugin example of docs/backends.md (``examples/nice_backend``), installed for real with pip and met through its entry point.

It declares its traits and one setting (``POPRUN_NICE_LEVEL``): the conformance suite runs it as
the registry gives it, and the real CLI plans its setting (PR225 for a bad value), records its
traits and settings in the plan, and runs it with the plan's value.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib.metadata import distributions
from pathlib import Path

import pytest

from poprun.backends import capabilities, conformance
from poprun.backends.registry import default_registry
from poprun.planner.trait import Traits

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

EXAMPLE = Path(__file__).parents[2] / "examples" / "nice_backend"


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Return a folder where ``pip install`` put the example distribution (built from a copy: the example stays clean)."""
    root = tmp_path_factory.mktemp("nice")
    shutil.copytree(EXAMPLE, root / "source")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                           "--no-index", "--target", str(root / "site"), str(root / "source")],
                          capture_output=True, text=True, timeout=120, check=False)
    assert 0 == done.returncode, done.stderr
    return root / "site"


@pytest.fixture
def registry(site: Path, monkeypatch: pytest.MonkeyPatch):
    """Return a registry with the installed example's entry points (and its module importable)."""
    monkeypatch.syspath_prepend(str(site))
    found = [e for d in distributions(path=[str(site)]) for e in d.entry_points if e.group == "poprun.backends"]
    assert ["nice"] == [e.name for e in found]
    return default_registry(entry_points=found, environ={})


@conformance.parametrize()
def test_the_example_plugin_passes_the_conformance_suite_through_its_entry_point(check, registry, tmp_path):
    """Every conformance check its capabilities select passes on the backend the registry makes from the entry point."""
    factory = lambda: registry.get("nice")  # noqa: E731 - a factory, as the suite takes one
    if not check.applies_to(factory()):
        pytest.skip(f"the example does not declare {', '.join(sorted(check.needs - capabilities(factory())))}")

    check.run(factory, tmp_path, conformance.LOCAL)


def test_the_registry_reads_the_examples_traits_and_setting_without_making_it(registry):
    """What the example declares reaches planning: its traits and its one setting row."""
    traits, settings = registry.declared("nice")

    assert Traits(all_here=True, late_cwd=False) == traits
    assert ["POPRUN_NICE_LEVEL"] == [s.name for s in settings]


def poprun(*args: str, site: Path, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if k not in ("POPRUN_NO_PLUGINS", "POPRUN_NICE_LEVEL")}
    environ |= {"PYTHONPATH": str(site), "POPRUN_RUNS_DIR": str(cwd / "runs"), **env}
    return subprocess.run([sys.executable, "-m", "poprun.cli.main", *args], cwd=cwd, capture_output=True, text=True,
                          env=environ, timeout=60, check=False)


def test_the_plan_records_the_plugins_traits_and_setting_and_the_launch_uses_it(site, tmp_path):
    """POPRUN_NICE_LEVEL=7 is planned with its source; the instances run 7 nicer than poprun."""
    args = ("--backend", "nice", "--num-instances", "2", "--num-replicas", "2")
    planned = poprun("plan", *args, "--format", "json", "true", site=site, cwd=tmp_path, env={"POPRUN_NICE_LEVEL": "7"})
    ran = poprun(*args, sys.executable, "-c", "import os; print(os.nice(0))", site=site, cwd=tmp_path,
                 env={"POPRUN_NICE_LEVEL": "7"})

    backend = json.loads(planned.stdout)["backend"]
    nice = [s for s in backend["settings"] if s["name"] == "POPRUN_NICE_LEVEL"]  # beside apply's (the straggler rule's)
    assert ([{"name": "POPRUN_NICE_LEVEL", "value": "7", "source": "environment variable POPRUN_NICE_LEVEL"}],
            True, "none") == (nice, backend["traits"]["all_here"], backend["traits"]["reaches"])
    assert {"POPRUN_STRAGGLER_FACTOR", "POPRUN_STRAGGLER_WINDOW"} <= {s["name"] for s in backend["settings"]}
    assert 0 == ran.returncode, ran.stderr
    assert [str(os.nice(0) + 7)] * 2 == ran.stdout.split()


def test_a_bad_value_of_the_plugins_setting_is_pr225_before_anything_starts(site, tmp_path):
    """POPRUN_NICE_LEVEL=70: PR225 with the variable's span, exit 2, nothing run."""
    done = poprun("--backend", "nice", "--num-instances", "2", "--num-replicas", "2", "touch", "ran", site=site,
                  cwd=tmp_path, env={"POPRUN_NICE_LEVEL": "70"})

    assert 2 == done.returncode
    assert done.stderr.startswith("error[PR225]: invalid setting\n  --> environment variable POPRUN_NICE_LEVEL\n"), \
        done.stderr
    assert not (tmp_path / "ran").exists()


def test_the_example_is_the_plugin_docs_backends_md_shows():
    """examples/nice_backend/nice_backend.py is exactly the first python block of docs/backends.md."""
    import re

    page = (EXAMPLE.parents[1] / "docs" / "backends.md").read_text(encoding="utf-8")
    expected = re.findall(r"```python\n(.*?)```", page, flags=re.DOTALL)[0]

    assert expected == (EXAMPLE / "nice_backend.py").read_text(encoding="utf-8")


def test_a_saved_plan_runs_with_its_recorded_setting_not_the_shells(site, tmp_path):
    """Planned with POPRUN_NICE_LEVEL=7, applied from a shell that sets 2 (or junk): the instances run 7 nicer."""
    args = ("--backend", "nice", "--num-instances", "2", "--num-replicas", "2")
    program = (sys.executable, "-c", "import os; print(os.nice(0))")
    saved = poprun("plan", *args, "--format", "json", "-o", "plan.json", *program, site=site, cwd=tmp_path,
                   env={"POPRUN_NICE_LEVEL": "7"})
    assert 0 == saved.returncode, saved.stderr

    runs = [poprun("apply", "plan.json", site=site, cwd=tmp_path, env={"POPRUN_NICE_LEVEL": level})
            for level in ("2", "junk")]

    assert [(0, [str(os.nice(0) + 7)] * 2)] * 2 == [(r.returncode, r.stdout.split()) for r in runs], \
        [r.stderr for r in runs]
