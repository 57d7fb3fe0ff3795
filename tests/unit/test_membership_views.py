"""Views of a plan's membership beside explain: plan --diff shows a changed policy, one line per change."""

import io
import json
from contextlib import redirect_stderr, redirect_stdout

from poprun.cli.main import main

FOUR = ["--host", "pod[1-4]", "--num-instances", "4", "--num-replicas", "8"]


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = main(list(argv))
    return status, out.getvalue(), err.getvalue()


def test_diff_shows_a_changed_membership_policy_and_not_its_kept_spec(tmp_path, monkeypatch):
    """Spares, a minimum and a health check added since a saved plan are the diff's membership section, nothing else."""
    monkeypatch.chdir(tmp_path)
    assert 0 == run("plan", "--format", "json", "-o", "old.json", *FOUR, "python3", "train.py")[0]

    status, out, _ = run("plan", "--diff", "old.json", *FOUR, "--spare-host", "pod[8-9]", "--min-hosts", "3",
                         "--health-check", "true", "python3", "train.py")

    assert 0 == status
    assert ("--- old.json\n+++ the plan of this command line\nmembership:\n  spares: (none) -> pod8 pod9\n"
            '  min_hosts: 0 -> 3\n  health_check: "" -> true\n') == out


def test_diff_shows_a_hostile_health_check_escaped_on_one_line(tmp_path, monkeypatch):
    """A newline or an escape sequence in a health check never reaches the terminal raw through the diff."""
    monkeypatch.chdir(tmp_path)
    assert 0 == run("plan", "--format", "json", "-o", "old.json", *FOUR, "python3", "train.py")[0]

    _, out, _ = run("plan", "--diff", "old.json", *FOUR, "--health-check", "true\n\x1b[31mred", "python3", "train.py")

    assert '  health_check: "" -> true\\n\\x1b[31mred\n' in out
    assert "\x1b" not in out


def test_diff_as_json_names_the_membership_section(tmp_path, monkeypatch):
    """The JSON diff lists each membership change under section membership, with JSON values."""
    monkeypatch.chdir(tmp_path)
    assert 0 == run("plan", "--format", "json", "-o", "old.json", *FOUR, "python3", "train.py")[0]

    _, out, _ = run("plan", "--diff", "old.json", "--format", "json", *FOUR, "--min-hosts", "2", "python3",
                    "train.py")

    assert [{"section": "membership", "key": "min_hosts", "instances": [], "old": 0, "new": 2}] == \
        json.loads(out)["changes"]


def test_a_plan_without_membership_never_imports_the_membership_modules(tmp_path):
    """Planning, explaining and checking a saved plan without membership leave the membership modules unimported."""
    import subprocess
    import sys

    code = ("import io, sys, contextlib\nfrom poprun.cli.main import main\n"
            "argv = ['--host', 'pod[1-2]', '--num-instances', '2', '--num-replicas', '2', 'python3', 'x']\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    main(['plan', '--format', 'json', '-o', 'p.json', *argv])\n"
            "    main(['plan', '--explain', *argv])\n"
            "    main(['plan', 'p.json', '--explain'])\n"
            "print(sorted(m for m in sys.modules if m.startswith(('poprun.planner.membership', "
            "'poprun.planner.replan', 'poprun.planner._membershipcheck'))))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=True,
                          env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "POPRUN_RUNS_DIR": str(tmp_path / "r")})

    assert "[]\n" == done.stdout


def test_explain_shows_a_hostile_health_check_escaped_and_its_secrets_masked():
    """A newline, an escape sequence and a --password=VALUE in the check: one escaped line, the value masked."""
    status, out, _ = run("plan", "--explain", *FOUR, "--health-check", "check\n\x1b[2J --password=hunter2", "python3",
                         "train.py")

    assert 0 == status
    assert "\x1b" not in out
    assert "hunter2" not in out
    assert ("membership: no spare host; never fewer hosts; health check on every host (at most 30 s): "
            "check\\n\\x1b[2J --password=****\n") in out


def test_explain_of_a_replanned_plan_says_on_which_hosts_and_why():
    """The plan of a re-planned attempt explains its membership with a line naming its hosts and the reason."""
    from poprun.core.span import SourceSpan
    from poprun.planner.context import Context
    from poprun.planner.replan import replan
    from poprun.planner.solve import solve
    from poprun.planner.spec import Sourced, Spec
    from poprun.render.explain import render_plan

    here = SourceSpan(file="<test>", key_path="$")
    spec = Spec(hosts=Sourced(("pod1", "pod2"), here), instances=Sourced(2, here), replicas=Sourced(2, here),
                spare_hosts=Sourced(("pod9",), here),
                program=Sourced(("python3", "train.py"), here))
    ctx = Context(environ={"PATH": "/bin"}, cwd="/w")
    done = replan(solve(spec, ctx).plan, {"pod2": "its link went down"}, ctx)

    text = render_plan(done.plan, explain=True)

    assert "re-planned on pod1,pod9: pod2: its link went down\n" in text
    assert "membership: no spare host; never fewer hosts\n" in text
