"""Stale plans: each input a saved plan relies on, checked at apply time, with exact messages; and through the CLI."""

import io
import json
import os
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from poprun.backends import registry as registry_module
from poprun.backends.registry import BackendRegistry
from poprun.backends.testing import RecordingBackend
from poprun.cli.main import main
from poprun.core.diagnostic import DiagnosticError
from poprun.core.record import evolve
from poprun.core.span import SourceSpan
from poprun.planner.context import Context
from poprun.planner.flags import parse_flags
from poprun.planner.plan import LaunchPlan
from poprun.planner.serde import from_json, to_json
from poprun.planner.solve import solve
from poprun.planner.stale import validate_plan_inputs
from tests.runids import without_run_id

ROOT = Path(__file__).parents[2]
REMAKE = "('poprun plan --format json -o FILE ...')"


@pytest.fixture
def app(tmp_path):
    """Return a working directory holding an executable train.py and a bin/ folder with 'trainer'."""
    (tmp_path / "bin").mkdir()
    for path in (tmp_path / "train.py", tmp_path / "bin" / "trainer"):
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
    return tmp_path


def context(app: Path, **environ: str) -> Context:
    return Context(environ={"PATH": f"{app}/bin", **environ}, cwd=str(app), local_names=("localhost", "me"))


def plan_of(app: Path, *argv: str, **environ: str) -> LaunchPlan:
    ctx = context(app, **environ)
    return solve(parse_flags(list(argv), environ=ctx.environ).spec, ctx).plan


def stale(plan: LaunchPlan, app: Path, **environ: str) -> list[tuple[str, str, str, str, str]]:
    """Return (code, summary, detail, key path, hint) of each diagnostic."""
    found = validate_plan_inputs(plan, context(app, **environ), file="plan.json")
    return [(d.code, d.summary, d.detail, d.span.key_path, d.hint) for d in found]


def test_fresh_plan_has_no_diagnostic(app):
    """Nothing changed: no diagnostic, whatever PATH-like variables are missing."""
    plan = plan_of(app, "--num-replicas=2", "--mpi-local-args=-x DATASET", "trainer", DATASET="/data")

    assert [] == stale(plan, app, DATASET="/data")


def test_forwarded_variable_not_set_is_stale(app):
    """A variable forwarded by name to every instance and unset since is PR403 pointing into the plan."""
    plan = plan_of(app, "--num-replicas=2", "--num-instances=2", "--mpi-local-args=-x DATASET", "trainer")

    assert [("PR403", "stale plan: forwarded variable 'DATASET' is not set",
             "the plan forwards DATASET from the launching shell to every instance, and it is not set now",
             "$.instances[0].env_forward[3]",
             f"set DATASET (export DATASET=...) and apply again, or make the plan again without it {REMAKE}")] == (
        stale(plan, app))


def test_forwarded_variable_of_one_instance_names_that_instance(app):
    """``--instance-mpi-local-args=1:-x FOO`` forwards FOO to instance 1 only; the detail says so."""
    plan = plan_of(app, "--num-replicas=3", "--num-instances=3", "--instance-mpi-local-args=1:-x FOO", "trainer")
    [(_, _, detail, key_path, _)] = stale(plan, app)

    assert ("the plan forwards FOO from the launching shell to instance 1, and it is not set now",
            "$.instances[1].env_forward[3]") == (detail, key_path)


def test_path_like_variables_are_never_stale(app):
    """PATH, LD_LIBRARY_PATH and PYTHONPATH are forwarded only when present."""
    plan = plan_of(app, "--num-replicas=2", "/bin/sh")
    ctx = Context(environ={}, cwd=str(app), local_names=("localhost",))

    assert () == validate_plan_inputs(plan, ctx)


def test_poplar_engine_options_set_when_planning_and_gone_is_stale(app):
    """POPLAR_ENGINE_OPTIONS is forwarded because it was set at plan time; gone at apply time, the plan is stale."""
    plan = plan_of(app, "--num-replicas=2", "trainer", POPLAR_ENGINE_OPTIONS='{"autoReport.all":"true"}')

    assert ["stale plan: forwarded variable 'POPLAR_ENGINE_OPTIONS' is not set"] == [s[1] for s in stale(plan, app)]


def test_working_directory_gone_is_stale(app):
    """A cwd that no longer exists is PR403 at $.instances[0].cwd; the program is not looked for there."""
    plan = plan_of(app, "--num-replicas=2", "--num-instances=2", "./train.py")
    gone = str(app / "gone")
    plan = evolve(plan, instances=tuple(evolve(i, cwd=gone) for i in plan.instances))

    assert [("PR403", f"stale plan: working directory '{gone}' is gone",
             f"the plan runs every instance in {gone}, which no longer exists", "$.instances[0].cwd",
             f"create {gone} again, or make the plan again in the directory to run in {REMAKE}")] == stale(plan, app)


def test_working_directory_replaced_by_a_file_is_stale(app):
    """A cwd that is now a file says so."""
    plan = plan_of(app, "--num-replicas=2", "trainer")
    plan = evolve(plan, instances=(evolve(plan.instances[0], cwd=str(app / "train.py")),))

    assert f"the plan runs instance 0 in {app / 'train.py'}, which is no longer a directory" == stale(plan, app)[0][2]


def test_program_missing_from_path_and_cwd_is_stale(app):
    """A bare program name found neither on PATH nor in the cwd is PR403 at argv[0]."""
    plan = plan_of(app, "--num-replicas=2", "trainer")
    (app / "bin" / "trainer").unlink()

    assert [("PR403", "stale plan: program 'trainer' not found",
             f"the plan runs 'trainer' in instance 0, and 'trainer' is not on PATH or in {app}",
             "$.instances[0].argv[0]",
             f"put the program back (or fix PATH), or make the plan again with its new name or path {REMAKE}")] == (
        stale(plan, app))


def test_program_given_as_a_path_and_gone_is_stale(app):
    """A program with a slash is looked for from the cwd; gone, the detail names the full path."""
    plan = plan_of(app, "--num-replicas=2", "./train.py")
    (app / "train.py").unlink()

    assert f"the plan runs './train.py' in instance 0, and {app / 'train.py'} does not exist" == (
        stale(plan, app)[0][2])


def test_program_in_the_cwd_without_dot_slash_is_found(app):
    """``poprun train.py`` runs ./train.py (changelog 2.1), so the plan is fresh."""
    assert [] == stale(plan_of(app, "--num-replicas=2", "train.py"), app)


def test_program_on_the_path_the_plan_sets_is_found(app, tmp_path_factory):
    """A PATH set by the plan (-x PATH=...) is where the program is looked for, not the shell's."""
    other = tmp_path_factory.mktemp("other")
    (other / "tool").write_text("#!/bin/sh\n")
    (other / "tool").chmod(0o755)
    plan = plan_of(app, "--num-replicas=2", f"--mpi-local-args=-x PATH={other}", "tool")

    assert [] == stale(plan, app)


def test_fixed_cache_whose_parent_is_gone_is_stale(app):
    """--executable-cache-path under a directory that is gone is PR403 at $.cache.path."""
    cache = app / "caches" / "exe"
    plan = plan_of(app, "--num-replicas=2", f"--executable-cache-path={cache}", "trainer")

    assert [("PR403", f"stale plan: the executable cache's directory '{app / 'caches'}' is gone",
             f"the plan keeps its executable cache in {cache}, and {app / 'caches'} no longer exists", "$.cache.path",
             f"create {app / 'caches'} again, or make the plan again with another --executable-cache-path {REMAKE}",
             )] == stale(plan, app)


def test_fixed_cache_that_does_not_exist_yet_is_fine(app):
    """Only the parent must exist: the cache itself is made when used."""
    (app / "caches").mkdir()
    plan = plan_of(app, "--num-replicas=2", f"--executable-cache-path={app / 'caches' / 'exe'}", "trainer")

    assert [] == stale(plan, app)


def test_files_of_other_hosts_are_not_checked(app):
    """A plan for pod1/pod2 (not offline) checks variables only: files there are not this machine's."""
    plan = plan_of(app, "--num-replicas=2", "--host=pod1,pod2", "--mpi-local-args=-x DATASET", "missing-program")

    assert ["stale plan: forwarded variable 'DATASET' is not set"] == [s[1] for s in stale(plan, app)]


def test_offline_plans_check_every_instance_here(app):
    """Offline, every instance runs on this machine whatever its host: its program is checked."""
    plan = plan_of(app, "--num-replicas=2", "--host=pod1,pod2", "--offline-mode=yes", "missing-program")

    assert ["stale plan: program 'missing-program' not found"] == [s[1] for s in stale(plan, app)]


def test_every_change_is_reported_together(app):
    """A variable gone and a program gone give two diagnostics, variables first."""
    plan = plan_of(app, "--num-replicas=2", "--mpi-local-args=-x DATASET", "trainer", DATASET="x")
    (app / "bin" / "trainer").unlink()

    assert ["PR403", "PR403"] == [s[0] for s in stale(plan, app)]
    assert SourceSpan.env("DATASET") == validate_plan_inputs(plan, context(app))[0].related[0]


def test_other_format_version_is_pr114_naming_both_versions(app):
    """A plan of format version 2 is refused when read, naming its version, its poprun and ours."""
    data = json.loads(to_json(plan_of(app, "--num-replicas=2", "trainer")))
    data.update(format_version=2, poprun_version="0.3.0")

    with pytest.raises(DiagnosticError) as info:
        from_json(json.dumps(data), file="plan.json")
    diag = info.value.diagnostics[0]
    assert ("PR114", "$.format_version",
            "the plan has format version 2, written by poprun 0.3.0; this poprun reads format version 1") == (
        diag.code, diag.span.key_path, diag.detail)


# Through the CLI: in this process with the RecordingBackend, then with real processes.

def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = main(list(argv))
    return status, out.getvalue(), err.getvalue()


def test_apply_runs_the_saved_plan_exactly(app, monkeypatch):
    """``poprun apply plan.json`` hands the backend the very plan that was saved (a fixed cache adds nothing)."""
    # GIVEN a saved plan and a recording backend in place of the offline one
    monkeypatch.chdir(app)
    monkeypatch.setenv("DATASET", "/data")
    assert 0 == run("plan", "--format", "json", "-o", "plan.json", "--num-replicas=4", "--num-instances=2",
                    "--offline-mode=yes", "--mpi-local-args=-x DATASET", f"--executable-cache-path={app}/cache",
                    "./train.py")[0]
    backend = RecordingBackend()
    monkeypatch.setattr(registry_module, "default_registry", lambda: BackendRegistry({"offline": lambda: backend}))
    # WHEN it is applied
    status, _, err = run("apply", "plan.json")
    # THEN the backend got exactly the saved plan
    assert (0, "") == (status, err)
    assert (from_json((app / "plan.json").read_text()),) == tuple(map(without_run_id, backend.plans))


def test_apply_refuses_options_after_a_saved_plan(app, monkeypatch):
    """A saved plan runs as planned: an option after it is PR101."""
    monkeypatch.chdir(app)
    assert 0 == run("plan", "--format", "json", "-o", "plan.json", "--num-replicas=2", "trainer")[0]
    status, _, err = run("apply", "plan.json", "--num-replicas=8")

    assert (2, "error[PR101]: '--num-replicas=8' after a saved plan") == (status, err.splitlines()[0])


@pytest.mark.e2e
@pytest.mark.timeout(60)
def test_plan_then_apply_runs_then_refuses_when_stale(tmp_path):
    """plan -o plan.json, apply runs the hello world; unset the forwarded variable: exit 2 PR403; other version: PR114."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("POPRUN_", "POPLAR_", "IPUOF_", "DATASET"))}
    env.update(HOME=str(tmp_path), PYTHONPATH=str(ROOT))

    def poprun(*argv: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "poprun.cli.main", *argv], cwd=tmp_path, capture_output=True,
                              text=True, timeout=30, check=False, env=env | extra)

    # GIVEN a plan of the seed's hello world that forwards DATASET
    made = poprun("plan", "--format", "json", "-o", "plan.json", "--num-instances", "2", "--num-replicas", "2",
                  "--offline-mode=1", "--mpi-local-args=-x DATASET", "echo", "Hello world!", DATASET="/data")
    assert (0, "") == (made.returncode, made.stderr)
    # WHEN it is applied with DATASET set, THEN it runs
    ran = poprun("apply", "plan.json", DATASET="/data")
    assert (0, "Hello world!\n" * 2, "") == (ran.returncode, ran.stdout, ran.stderr)
    # WHEN DATASET is gone, THEN the plan is stale and nothing runs
    refused = poprun("apply", "plan.json")
    expected = ("error[PR403]: stale plan: forwarded variable 'DATASET' is not set\n"
                "  --> plan.json  ($.instances[0].env_forward[3])\n"
                "   = the plan forwards DATASET from the launching shell to every instance, and it is not set now\n"
                "   = hint: set DATASET (export DATASET=...) and apply again, or make the plan again without it "
                f"{REMAKE}\n")
    assert (2, "", expected) == (refused.returncode, refused.stdout, refused.stderr)
    # WHEN the plan says another format version, THEN PR114 names it
    data = json.loads((tmp_path / "plan.json").read_text())
    (tmp_path / "plan.json").write_text(json.dumps(data | {"format_version": 2}))
    other = poprun("apply", "plan.json", DATASET="/data")
    assert (2, "   = the plan has format version 2, written by poprun 0.1.0; this poprun reads format version 1") == (
        other.returncode, other.stderr.splitlines()[2])


def test_binding_to_cpus_this_machine_lacks_is_stale(app):
    """A saved plan binding an instance on this machine to CPUs it does not have is refused, naming the path."""
    from poprun.planner.machine import load

    plan = plan_of(app, "--num-instances=2", "--num-replicas=2", "./train.py")
    placement = evolve(plan.instances[1].placement, numa_aware=True, cpus="0-63", numa_nodes="0")
    plan = evolve(plan, instances=(plan.instances[0], evolve(plan.instances[1], placement=placement)))
    ctx = evolve(context(app), probe=lambda: load("workstation-1numa"))

    found = validate_plan_inputs(plan, ctx, file="plan.json")

    assert [("PR403", "$.instances[1].placement.cpus")] == [(d.code, d.span.key_path) for d in found]
    assert "lets it use CPUs 0-7" in found[0].detail
