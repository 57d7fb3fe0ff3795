"""
The notifier and the metrics file as planned: every front end, the decisions, explain, diff, and a saved plan's checks.

A saved plan is untrusted input: one PR114 per broken rule of ``$.observe``; plans written before
``observe`` existed load with no notifier and no metrics file.
"""

from __future__ import annotations

import copy
import io
import json
import os
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from poprun.cli.main import main
from poprun.core.diagnostic import DiagnosticError
from poprun.planner.dsl.read import parse_dsl
from poprun.planner.dsl.write import to_dsl
from poprun.planner.flags import parse_flags
from poprun.planner.observe import KINDS, parse_kinds
from poprun.planner.plan import NO_OBSERVE
from poprun.planner.serde import from_json, to_json
from poprun.planner.tomlspec import parse_toml, to_toml


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = main(list(argv))
    return status, out.getvalue(), err.getvalue()


def observe(*argv: str) -> dict:
    status, out, err = run("plan", "--format", "json", *argv)
    assert 0 == status, err
    return json.loads(out)["observe"]


def test_the_command_line_declares_a_notifier_and_a_metrics_file(tmp_path, monkeypatch):
    """Flags set each part; a relative metrics path is made absolute from the working directory."""
    monkeypatch.chdir(tmp_path)
    found = observe("--notify", "cat >> notes.jsonl", "--notify-on", "straggler, Run-Ended", "--notify-timeout", "2.5",
                    "--metrics-file", "poprun.prom", "python3", "train.py")

    assert {"notify": "cat >> notes.jsonl", "notify_on": ["run-ended", "straggler"], "notify_timeout_ms": 2500,
            "metrics_file": str(tmp_path / "poprun.prom")} == found


def test_the_fallback_variables_declare_them_out_of_argv(tmp_path, monkeypatch):
    """POPRUN_NOTIFY and POPRUN_METRICS_FILE: what ps would show stays out of poprun's own argv."""
    monkeypatch.setenv("POPRUN_NOTIFY", 'curl -sd @- "$HOOK"')
    monkeypatch.setenv("POPRUN_METRICS_FILE", str(tmp_path / "m.prom"))
    found = observe("python3", "train.py")

    assert ('curl -sd @- "$HOOK"', str(tmp_path / "m.prom")) == (found["notify"], found["metrics_file"])


def test_a_plan_without_them_has_the_default_record():
    """No option of theirs: the plan's observe is the default, and explain has no observe section."""
    status, out, err = run("plan", "--explain", "python3", "train.py")

    assert 0 == status, err
    assert NO_OBSERVE == from_json(run("plan", "--format", "json", "python3", "train.py")[1], file="p.json").observe
    assert "\nobserve:" not in out


def test_toml_dsl_and_flags_give_equal_specs():
    """The same settings written three ways are one spec; each writer writes what its reader reads back."""
    flags = parse_flags(["--notify", "cat >> n.jsonl", "--notify-on", "all", "--notify-timeout", "2.5",
                         "--metrics-file", "/tmp/m.prom", "prog"]).spec
    toml = parse_toml('[observe]\nnotify = "cat >> n.jsonl"\nnotify_on = "all"\nnotify_timeout = 2.5\n'
                      'metrics_file = "/tmp/m.prom"\n[program]\nargv = ["prog"]\n', file="s.toml")
    dsl = parse_dsl('notify "cat >> n.jsonl"\nnotify on all\nnotify timeout 2.5\nmetrics file /tmp/m.prom\nrun prog\n',
                    file="s.pop")

    assert flags == toml == dsl
    assert flags == parse_toml(to_toml(flags), file="s.toml") == parse_dsl(to_dsl(flags), file="s.pop")


@pytest.mark.parametrize(("text", "kinds", "wrong"), [
    ("run-ended", ("run-ended",), None),
    ("all", KINDS, None),
    ("replan, RUN-ENDED ,run-ended", ("run-ended", "replan"), None),
    ("straggler,all", KINDS, None),
    ("run-ended,", (), ""),
    ("stragler", (), "stragler"),
    ("instance-progress", (), "instance-progress"),
])
def test_kinds_are_read_in_their_order_once_each(text, kinds, wrong):
    """Case and spaces aside; all is every kind; an empty item or an unknown word is the word to tell."""
    assert (kinds, wrong) == parse_kinds(text)


def test_explain_says_what_is_notified_when_with_which_deadline_and_where_the_metrics_go(tmp_path):
    """plan --explain: an observe section with the kinds, the deadline and the metrics path, and each decision's source."""
    status, out, err = run("plan", "--explain", "--notify", 'notify-send "$(cat)"', "--notify-on", "limit-reached",
                           "--metrics-file", str(tmp_path / "m.prom"), "python3", "train.py")

    assert 0 == status, err
    section = out.split("\nobserve: ", 2)[2].split("\n\n")[0].splitlines()
    metrics = tmp_path / "m.prom"
    assert section[:4] == [
        f"notify 'notify-send \"$(cat)\"' on limit-reached (each at most 10 s); metrics in {metrics} (once a second)",
        ("  notified: limit-reached events, each as one JSON line (as --events writes it) on the standard input of the "
        "command, run by /bin/sh on this machine in a process group of its own"),
        ("  deadline: 10 s per notification (its group is killed after); at the end poprun waits for those left at most "
        "10 s in all; a failure is a warning, never the run's"),
        (f"  metrics: {metrics}, OpenMetrics text replaced once a second while the run lives and at its end (run state, "
        "attempt, restarts, each instance's step, step time and ETA)")]
    rows = [line.split() for line in section[5:]]
    assert [("notify", "--notify"), ("notify_on", "--notify-on"), ("notify_timeout", "default"),
            ("metrics_file", "--metrics-file")] == [(r[0], next(w for w in r[1:] if w.startswith("--") or w == "default"))
                                                    for r in rows]


def test_explain_and_plan_show_a_metrics_path_with_control_characters_escaped(tmp_path):
    """A path with a newline and a terminal escape is shown escaped, on its one line, as the command is."""
    status, out, err = run("plan", "--explain", "--metrics-file", str(tmp_path / "x\ny\x1b[31m.prom"), "true")

    assert 0 == status, err
    assert "\x1b" not in out
    shown = f"{tmp_path}/x\\ny\\x1b[31m.prom"
    assert f"; metrics in {shown} (once a second)" in out or f"observe: metrics in {shown} (once a second)" in out
    assert f"  metrics: {shown}, OpenMetrics text" in out


def test_diff_shows_a_changed_notifier(tmp_path):
    """plan --diff: the observe section names what changed."""
    saved = tmp_path / "old.json"
    assert 0 == run("plan", "--format", "json", "-o", str(saved), "--notify", "true", "python3", "train.py")[0]

    status, out, _ = run("plan", "--diff", str(saved), "--notify", "false", "--notify-on", "all", "python3", "train.py")

    assert 0 == status
    assert ("observe:\n  notify: true -> false\n  notify_on: run-ended -> run-ended attempt-ended limit-reached "
            "straggler replan\n") in out


# -- a saved plan -------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def plan_data(tmp_path_factory) -> dict:
    folder = tmp_path_factory.mktemp("observe")
    status, out, err = run("plan", "--format", "json", "--notify", "cat >> notes.jsonl", "--notify-on", "all",
                           "--metrics-file", str(folder / "m.prom"), "python3", "train.py")
    assert 0 == status, err
    return json.loads(out)


def _refused(data: dict) -> list[tuple[str, str]]:
    with pytest.raises(DiagnosticError) as problem:
        from_json(json.dumps(data), file="saved.json")
    return [(d.code, d.span.key_path) for d in problem.value.diagnostics]


def test_a_plan_with_observe_round_trips(plan_data):
    """The solver's plan loads back unchanged."""
    plan = from_json(json.dumps(plan_data), file="saved.json")

    assert json.loads(to_json(plan)) == plan_data
    assert KINDS == plan.observe.notify_on


def test_a_plan_written_before_observe_existed_loads_with_none(plan_data):
    """No observe key: no notifier, no metrics file."""
    data = copy.deepcopy(plan_data)
    del data["observe"]

    assert NO_OBSERVE == from_json(json.dumps(data), file="saved.json").observe


@pytest.mark.parametrize(("key", "value"), [
    ("notify", "x" * 4097),
    ("notify_on", ["run-ended", "instance-progress"]),
    ("notify_on", ["replan", "run-ended"]),
    ("notify_on", ["run-ended", "run-ended"]),
    ("notify_on", []),
    ("notify_timeout_ms", 0),
    ("notify_timeout_ms", 3_600_001),
    ("metrics_file", "relative/m.prom"),
    ("metrics_file", "/tmp/../etc/m.prom"),
    ("metrics_file", "/tmp/"),
    ("metrics_file", "/" + "a" * 5000),
])
def test_each_broken_rule_is_one_pr114_naming_its_path(plan_data, key, value):
    """A saved plan's observe that the solver could not have made is refused, naming the key."""
    data = copy.deepcopy(plan_data)
    data["observe"][key] = value

    assert [("PR114", f"$.observe.{key}")] == _refused(data)


def test_a_nul_in_the_command_is_refused(plan_data):
    """A NUL cannot travel in the command's environment variable: refused (by the file check, or the rule)."""
    data = copy.deepcopy(plan_data)
    data["observe"]["notify"] = "true\u0000rm -rf /"

    assert [code for code, _ in _refused(data)] == ["PR114"]


def test_plan_time_problems_are_diagnostics_with_spans(tmp_path):
    """Unknown kind (nearest named), timeout out of range, FIFO refused; missing folder and lone settings warn."""
    fifo = tmp_path / "fifo.prom"
    os.mkfifo(fifo)

    status, _, err = run("plan", "--notify", "x", "--notify-on", "stragglers", "--notify-timeout", "0",
                         "--metrics-file", str(fifo), "python3", "train.py")

    assert 2 == status
    assert ["PR238", "PR239", "PR469"] == [line.split("]")[0].split("[")[1] for line in err.splitlines()
                                           if line.startswith("error[")]
    assert "did you mean 'straggler'?" in err
    assert f"{fifo} is a FIFO, not a regular file" in err


def test_a_symbolic_link_and_a_folder_are_refused_a_missing_folder_warned(tmp_path):
    """A link (even to a regular file) and a folder: PR469; a folder that does not exist: PR240, the plan made."""
    (tmp_path / "real.prom").write_text("")
    (tmp_path / "link.prom").symlink_to(tmp_path / "real.prom")

    assert "is a symbolic link, not a regular file" in run("plan", "--metrics-file", str(tmp_path / "link.prom"),
                                                           "true")[2]
    assert "is a directory, not a regular file" in run("plan", "--metrics-file", str(tmp_path), "true")[2]
    status, _, err = run("plan", "--metrics-file", str(tmp_path / "no" / "m.prom"), "true")
    assert (0, "warning[PR240]") == (status, err.split(":")[0])


def test_settings_without_a_notifier_warn_once(tmp_path):
    """--notify-timeout alone: PR468, the plan made."""
    status, _, err = run("plan", "--notify-timeout", "3", "true")

    assert (0, 1) == (status, err.count("warning[PR468]"))


def test_a_missing_home_folder_in_the_path_is_expanded(tmp_path):
    """~ in the metrics path is the user's home, as a shell would have it."""
    home = Path.home()
    found = observe("--metrics-file", "~/poprun-never-made/m.prom", "true")

    assert str(home / "poprun-never-made" / "m.prom") == found["metrics_file"]
