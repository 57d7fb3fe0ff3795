"""One error shape: the exception tree, coded apply-time failures, and exit statuses defined once."""

import ast
import os
import re
from pathlib import Path

import pytest

import poprun.backends
from poprun.backends import base
from poprun.cli import exitcode
from poprun.core import diagnostic, exitstatus
from poprun.core.diagnostic import CODES, DiagnosticError, LaunchError, PreflightError, error, launch_error
from poprun.core.span import SourceSpan
from poprun.planner.plan import Environment, Instance, Placement
from poprun.process.instance import executable, start_instance

ROOT = Path(__file__).parents[2]
POPRUN = ROOT / "poprun"


def _instance(argv: tuple[str, ...], cwd: str) -> Instance:
    return Instance(index=0, host="localhost", local_index=0, ild=0, gcd=0, replica_offset=0, num_local_replicas=1,
                    argv=argv, cwd=cwd, env=Environment(set=(), forward=(), unset=()),
                    placement=Placement(numa_aware=False, strategy="disabled"), mpi_local_args=())


def test_launch_error_is_a_diagnostic_error_carrying_its_status():
    """LaunchError is the core's DiagnosticError with a status; the SDK re-exports the very same class."""
    problem = error("PR426", "program not found", detail="program 'x' not found (on PATH or in /)",
                    span=SourceSpan.environment("PATH"), hint="install it")
    raised = LaunchError("program 'x' not found", status=127, diagnostics=(problem,))

    assert (True, True, True) == (isinstance(raised, DiagnosticError), poprun.backends.LaunchError is LaunchError,
                                  base.LaunchError is LaunchError)
    assert (127, "program 'x' not found", "program 'x' not found", (problem,)) == (
        raised.status, raised.message, str(raised), raised.diagnostics)


def test_a_bare_launch_error_still_works_for_plugins():
    """A plugin's LaunchError(message) keeps its message, status 125 and no diagnostics."""
    raised = LaunchError("the cluster is full")

    assert ("the cluster is full", 125, ()) == (str(raised), raised.status, raised.diagnostics)


def test_launch_error_of_one_diagnostic_tells_its_detail_in_one_line():
    """launch_error: the message is the detail (what a restart or a host command tells), the diagnostic the rest."""
    raised = launch_error("PR434", "a process poprun needs could not start", detail="cannot start ssh: No such file",
                          span=SourceSpan.environment("ssh"), hint="install ssh")

    assert ("cannot start ssh: No such file", 125) == (raised.message, raised.status)
    assert [("PR434", "cannot start ssh: No such file", "ssh", True)] == [
        (d.code, d.detail, d.span.key_path, d.is_error) for d in raised.diagnostics]


def test_preflight_error_is_a_launch_error_of_every_host():
    """PreflightError (the ssh preflight's) lives in core, under LaunchError, one diagnostic per host."""
    problems = [error("PR405", "host name unknown", detail=f"{h} has no address", span=SourceSpan.environment(h),
                      hint="check the name") for h in ("h1", "h2")]
    raised = PreflightError(problems)

    assert isinstance(raised, LaunchError)
    assert ("2 host(s) cannot run the plan: h1 has no address; h2 has no address", 125, tuple(problems)) == (
        raised.message, raised.status, raised.diagnostics)


def test_the_tree_in_the_docstring_names_every_exception_of_poprun():
    """Every public exception class of poprun appears in core.diagnostic's drawing of the tree."""
    drawing = diagnostic.__doc__ or ""
    found = set()
    for path in POPRUN.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_") and any(
                    isinstance(b, ast.Name) and (b.id.endswith(("Error", "Exception")) or b.id in
                                                 ("Exception", "BaseException")) for b in node.bases):
                found.add(node.name)

    assert [] == sorted(name for name in found if not re.search(rf"\b{name}\b", drawing))


def test_every_launch_error_of_the_backends_is_coded():
    """A LaunchError raised by poprun's backends carries a diagnostic (a hand-made plan's bad setting: PR225)."""
    bare = [str(path.relative_to(ROOT)) for path in sorted((POPRUN / "backends").rglob("*.py"))
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "LaunchError"
            and not any(k.arg == "diagnostics" for k in node.keywords)]

    assert [] == bare


def test_codes_of_apply_time_failures_are_registered():
    """The apply-time codes this shape added are in CODES, with their titles."""
    assert {"PR426": "program not found", "PR427": "program not executable", "PR434":
            "a process poprun needs could not start"} == {c: CODES[c] for c in ("PR426", "PR427", "PR434")}


def test_a_missing_program_is_pr426_with_status_127(tmp_path):
    """executable(): a name on no directory of PATH nor in the cwd is PR426, 127."""
    with pytest.raises(LaunchError) as raised:
        executable(_instance(("no-such-program",), str(tmp_path)), {"PATH": "/nonexistent"})

    assert (127, ["PR426"]) == (raised.value.status, [d.code for d in raised.value.diagnostics])


def test_a_file_without_the_execute_bit_is_pr427_with_status_126(tmp_path):
    """executable(): an existing file that cannot run is PR427, 126."""
    (tmp_path / "plain.sh").write_text("echo hi\n")
    with pytest.raises(LaunchError) as raised:
        executable(_instance(("./plain.sh",), str(tmp_path)), {"PATH": "/nonexistent"})

    assert (126, ["PR427"]) == (raised.value.status, [d.code for d in raised.value.diagnostics])


@pytest.mark.parametrize(("first_line", "status", "code"), [("#!/nonexistent/sh", 127, "PR426"),
                                                             ("#!/", 126, "PR427")])
def test_a_program_whose_exec_fails_is_coded_by_its_errno(tmp_path, first_line, status, code):
    """start_instance(): exec failing with ENOENT is PR426 (127), with EACCES PR427 (126)."""
    script = tmp_path / "run.sh"
    script.write_text(f"{first_line}\necho hi\n")
    script.chmod(0o755)
    with pytest.raises(LaunchError) as raised:
        start_instance(_instance(("./run.sh",), str(tmp_path)), dict(os.environ), str(script), 0)

    assert (status, [code], True) == (raised.value.status, [d.code for d in raised.value.diagnostics],
                                      raised.value.message.startswith("cannot run './run.sh': "))


def test_exit_statuses_have_one_definition():
    """design.md section 3's statuses are core.exitstatus's; the CLI's and the SDK's names are the same numbers."""
    table = {name: getattr(exitstatus, name) for name in ("OK", "FAILURE", "NOT_NOW", "USAGE", "TIMED_OUT",
                                                         "CANNOT_LAUNCH", "NOT_EXECUTABLE", "NOT_FOUND", "HANGUP",
                                                         "INTERRUPTED", "BROKEN_PIPE", "TERMINATED")}

    assert {"OK": 0, "FAILURE": 1, "NOT_NOW": 1, "USAGE": 2, "TIMED_OUT": 124, "CANNOT_LAUNCH": 125,
            "NOT_EXECUTABLE": 126, "NOT_FOUND": 127, "HANGUP": 129, "INTERRUPTED": 130, "BROKEN_PIPE": 141,
            "TERMINATED": 143} == table
    assert (0, 1, 2, 125, 126, 127) == (exitcode.OK, exitcode.FAILURE, exitcode.USAGE, exitcode.LAUNCH,
                                        exitcode.NOT_EXECUTABLE, exitcode.NOT_FOUND)
    assert (125, 126, 127) == (base.CANNOT_LAUNCH, base.NOT_EXECUTABLE, base.NOT_FOUND)


def test_no_module_but_core_exitstatus_defines_a_status_constant():
    """No module assigns 1, 2 or 124-143 to an upper-case name of a status; they import core.exitstatus."""
    statuses = {1, 2, *range(124, 144)}
    words = ("LAUNCH", "FOUND", "EXECUTABLE", "TIMED_OUT", "BROKEN", "NOT_NOW", "USAGE", "FAILURE", "INTERRUPTED",
             "SIGNALLED")
    defined = []
    for path in sorted([*POPRUN.rglob("*.py")]):
        if path == POPRUN / "core" / "exitstatus.py":
            continue
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant) and node.value.value in statuses:
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
                defined += [f"{path.relative_to(ROOT)}: {n}" for n in names if any(w in n for w in words)]

    assert [] == defined


def test_a_launch_error_met_outside_apply_exits_with_its_status(monkeypatch, capsys):
    """The CLI's boundary: a LaunchError (a DiagnosticError) exits with its own status, never 2, and says why."""
    from poprun.cli import main

    raised = [LaunchError("POPRUN_HOST_TIMEOUT='abc' is not a number of seconds from 3 to 3600"),
              launch_error("PR426", "program not found", detail="program 'x' not found (on PATH or in /)",
                           span=SourceSpan.environment("PATH"), hint="install it", status=127)]

    def failing(_args, _session):
        raise raised.pop(0)

    monkeypatch.setattr(main, "_dispatch", failing)
    bare = (main.main(["true"]), capsys.readouterr().err)
    coded = (main.main(["x"]), capsys.readouterr().err)

    assert (125, "poprun: POPRUN_HOST_TIMEOUT='abc' is not a number of seconds from 3 to 3600\n") == bare
    assert (127, ("error[PR426]: program not found\n  --> PATH\n   = program 'x' not found (on PATH or in /)\n"
                  "   = hint: install it\n")) == coded
