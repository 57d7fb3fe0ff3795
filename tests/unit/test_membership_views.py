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
