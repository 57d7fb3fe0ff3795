"""The recovery policy: its options on every front end, its defaults, what explain and diff show, the port plan."""

from __future__ import annotations

import pytest

from poprun.core.diagnostic import DiagnosticError
from poprun.planner import plan as p
from poprun.planner import value as conv
from poprun.planner.context import Context
from poprun.planner.dsl.read import parse_dsl
from poprun.planner.flags import parse_flags
from poprun.planner.solve import Solution, solve
from poprun.planner.tomlspec import parse_toml
from poprun.render.diff import diff_plans, render_diff, render_diff_json
from poprun.render.explain import render_plan

CTX = Context(environ={"PATH": "/usr/bin"}, cwd="/work", local_names=("localhost",))
FLAGS = ["--max-restarts=3", "--restart-scope=instance", "--restart-backoff=0.5", "--restart-backoff-max=60",
         "--min-uptime=2.25", "--crash-loop=4", "--never-retry=1,2", "--pre-restart=./check.sh --all",
         "--timeout=600", "--stall-timeout=120", "--signal=SIGUSR1@60"]
TOML = """\
[recovery]
max_restarts = 3
scope = "instance"
backoff = 0.5
backoff_max = 60
min_uptime = 2.25
crash_loop = 4
never_retry = [2, 1]
pre_restart = "./check.sh --all"
timeout = 600
stall_timeout = 120.0
signal = "USR1@60"

[program]
argv = ["python3", "train.py"]
"""
DSL = """\
max restarts 3
restart scope instance
restart backoff 0.5
restart backoff max 60
min uptime 2.25
crash loop 4
never retry 2, 1
pre restart "./check.sh --all"
timeout 600
stall timeout 120
signal 10@60
run python3 train.py
"""
EXPECTED = p.Recovery(max_restarts=3, scope="instance", backoff_ms=500, backoff_max_ms=60000, min_uptime_ms=2250,
                      crash_loop=4, never_retry=(1, 2), pre_restart="./check.sh --all", timeout_ms=600000,
                      stall_timeout_ms=120000, signal=10, signal_before_ms=60000, choose_port=True)


def plan_of(*argv: str, ctx: Context = CTX) -> Solution:
    return solve(parse_flags([*argv, "python3", "train.py"]).spec, ctx)


def decisions(solution: Solution) -> dict[str, tuple[object, str]]:
    return {d.key: (d.value, d.source) for d in solution.plan.explanation}


def test_flags_toml_and_dsl_give_the_same_policy() -> None:
    """Every recovery option, written as flags, as TOML and in the DSL, gives one policy, in milliseconds."""
    from_flags = solve(parse_flags([*FLAGS, "python3", "train.py"]).spec, CTX).plan.recovery
    from_toml = solve(parse_toml(TOML, file="job.toml"), CTX).plan.recovery
    from_dsl = solve(parse_dsl(DSL, file="job.pop"), CTX).plan.recovery

    assert [EXPECTED] * 3 == [from_flags, from_toml, from_dsl]


def test_defaults_are_the_behaviour_before_recovery() -> None:
    """Without recovery options: no restart, no limit; only the port is now chosen at apply time."""
    solution = plan_of()

    assert p.Recovery(choose_port=True) == solution.plan.recovery
    assert "recovery:" not in render_plan(solution.plan).split("instances:")[0]


def test_explain_says_where_each_part_came_from() -> None:
    """A flag, a POPRUN_ variable, a TOML key and the default are each named as the source of their part."""
    ctx = Context(environ={"PATH": "/usr/bin", "POPRUN_CRASH_LOOP": "5"}, cwd="/work", local_names=("localhost",))
    spec = parse_flags(["--timeout=90", "python3", "train.py"], environ=ctx.environ).spec
    flags = decisions(solve(spec, ctx))
    toml = decisions(solve(parse_toml(TOML, file="job.toml"), CTX))

    assert ("90 s", "--timeout") == flags["recovery.timeout"]
    assert (5, "environment variable POPRUN_CRASH_LOOP") == flags["recovery.crash_loop"]
    assert ("30 s", "default") == flags["recovery.backoff_max"]
    assert ("0.5 s", "job.toml:4:11") == toml["recovery.backoff"]


def test_explain_has_a_recovery_section_with_the_policy() -> None:
    """``--explain`` shows the policy in a line, then each part in its own table."""
    text = render_plan(plan_of(*FLAGS).plan, explain=True)
    section = text.split("recovery: ", 2)[2]

    assert section.startswith("up to 3 restarts of the failed instance only in the whole run, waiting 0.5 s "
                              "(doubling, at most 60 s); 4 failures within 2.25 s of start in a row end the run; "
                              "never retried: 1,2; before each: ./check.sh --all; time limit 600 s, SIGUSR1 60 s "
                              "before it; stall limit 120 s\n")
    assert "  pre_restart        ./check.sh --all" in section


def test_a_first_wait_longer_than_the_default_longest_raises_the_longest() -> None:
    """--restart-backoff 50 alone is not an error: the longest wait becomes 50 s, and explain says why."""
    solution = plan_of("--max-restarts=1", "--restart-backoff=50")

    assert (50000, 50000) == (solution.plan.recovery.backoff_ms, solution.plan.recovery.backoff_max_ms)
    assert ("50 s", "derived") == decisions(solution)["recovery.backoff_max"]


@pytest.mark.parametrize(("argv", "code"), [
    (["--signal=USR1@10"], "PR219"),
    (["--timeout=10", "--signal=USR1@10"], "PR220"),
    (["--max-restarts=1", "--restart-backoff=5", "--restart-backoff-max=4.999"], "PR221"),
    (["--max-restarts=100001"], "PR216"),
    (["--max-restarts=1", "--crash-loop=100001"], "PR216"),
    (["--max-restarts=1", "--pre-restart=" + "x" * 4097], "PR216"),
])
def test_conflicts_are_errors(argv: list[str], code: str) -> None:
    """Each conflict between recovery options is an error with its code."""
    with pytest.raises(DiagnosticError) as caught:
        plan_of(*argv)

    assert [code] == [d.code for d in caught.value.diagnostics]


@pytest.mark.parametrize(("argv", "code"), [
    (["--restart-scope=instance"], "PR223"),
    (["--never-retry=none", "--crash-loop=1"], "PR223"),
    (["--timeout=10", "--stall-timeout=10"], "PR224"),
])
def test_settings_without_effect_are_warnings(argv: list[str], code: str) -> None:
    """Restart settings without restarts, and a stall limit the time limit always beats, are warned about."""
    assert [code] == [d.code for d in plan_of(*argv).warnings]


@pytest.mark.parametrize(("argv", "environ", "port"), [
    (["--mpi-local-args=-x MASTER_PORT=1234"], {}, "1234"),
    (["--instance-mpi-local-args=0:-x MASTER_PORT=1234"], {}, "1234"),
    (["--mpi-local-args=-x MASTER_PORT"], {"MASTER_PORT": "4321"}, None),
    ([], {"MASTER_PORT": "4321"}, "4321"),
])
def test_a_master_port_the_user_sets_is_kept(argv: list[str], environ: dict[str, str], port: str | None) -> None:
    """-x MASTER_PORT (set or forwarded, all instances or one) or the launching shell's: kept, not chosen."""
    ctx = Context(environ={"PATH": "/usr/bin", **environ}, cwd="/work", local_names=("localhost",))
    plan = plan_of("--num-instances=2", "--num-replicas=2", *argv, ctx=ctx).plan

    assert (False, port) == (plan.recovery.choose_port, plan.instances[0].env.get("MASTER_PORT"))
    assert ("MASTER_PORT" in plan.instances[0].env.forward) == (port is None)


def test_a_master_port_set_in_toml_is_kept() -> None:
    """[env] set MASTER_PORT is the user's too."""
    spec = parse_toml('[env]\nset = { MASTER_PORT = "2000" }\n[program]\nargv = ["a"]\n', file="job.toml")
    plan = solve(spec, CTX).plan

    assert (False, "2000") == (plan.recovery.choose_port, plan.instances[0].env.get("MASTER_PORT"))


def test_an_unset_master_port_is_chosen_at_apply_time() -> None:
    """No MASTER_PORT anywhere: none in the plan, and explain says it is chosen on instance 0's host."""
    plan = plan_of("--host=pod1,pod2", "--num-replicas=2", "--backend=ssh").plan

    assert (True, None) == (plan.recovery.choose_port, plan.instances[0].env.get("MASTER_PORT"))
    assert ("  MASTER_PORT: chosen at apply time (a free port on pod1, and the next one for popdist's hub)\n"
            in render_plan(plan, explain=True))


@pytest.mark.parametrize(("argv", "environ", "expected"), [
    (["--timeout=60"], {}, "1"),
    (["--stall-timeout=60"], {}, "1"),
    ([], {}, None),
    (["--timeout=60", "--mpi-local-args=-x PYTHONFAULTHANDLER=0"], {}, "0"),
    (["--timeout=60"], {"PYTHONFAULTHANDLER": ""}, None),
])
def test_a_time_limit_turns_the_fault_handler_on_unless_the_user_set_it(
        argv: list[str], environ: dict[str, str], expected: str | None) -> None:
    """PYTHONFAULTHANDLER=1 under --timeout or --stall-timeout, unless set by -x or in the launching shell."""
    ctx = Context(environ={"PATH": "/usr/bin", **environ}, cwd="/work", local_names=("localhost",))

    assert expected == plan_of(*argv, ctx=ctx).plan.instances[0].env.get("PYTHONFAULTHANDLER")


def test_diff_shows_recovery_changes_as_text_and_json() -> None:
    """A changed policy is a section of the diff, in the plan's keys."""
    diff = diff_plans(plan_of("--max-restarts=1").plan, plan_of("--max-restarts=3", "--restart-scope=instance").plan)
    text = render_diff(diff, old_name="a", new_name="b")

    assert "recovery:\n  max_restarts: 1 -> 3\n  scope: all -> instance\n" in text
    assert '"key": "scope",\n      "new": "instance"' in render_diff_json(diff, old_name="a", new_name="b")


@pytest.mark.parametrize(("text", "millis"), [
    ("0", 0), ("30", 30000), ("0.5", 500), (".25", 250), ("1.2340", 1234), ("+2", 2000), (" 7 ", 7000),
    ("8640000", 8_640_000_000),
])
def test_seconds_are_read_to_the_millisecond(text: str, millis: int) -> None:
    """Seconds with up to three decimals become whole milliseconds, and are written back the same."""
    assert millis == conv.to_millis(text)
    assert millis == conv.to_millis(conv.seconds_text(millis))


@pytest.mark.parametrize(("text", "code"), [
    ("-1", "PR105"), ("1.0001", "PR105"), ("1e3", "PR105"), ("", "PR105"), ("nan", "PR105"), ("8640000.001", "PR216"),
    ("9" * 40, "PR216"),
])
def test_bad_seconds_are_refused(text: str, code: str) -> None:
    """Negative, too precise, not a number, or beyond 100 days."""
    with pytest.raises(conv.InvalidValueError) as caught:
        conv.to_millis(text)

    assert code == caught.value.code


@pytest.mark.parametrize(("text", "value"), [
    ("USR1@60", (10, 60000)), ("sigusr2@0.5", (12, 500)), ("15@1", (15, 1000)), ("TERM@ 2", (15, 2000)),
])
def test_signals_are_read_by_name_or_number(text: str, value: tuple[int, int]) -> None:
    """USR1, SIGUSR1 and 10 name one signal; the seconds may have decimals."""
    assert value == conv.to_signal(text)
    assert value == conv.to_signal(conv.signal_text(value))


@pytest.mark.parametrize("text", ["USR1", "@60", "KILL@5", "SIGSTOP@5", "19@5", "0@5", "65@5", "USR3@5", "USR1@0",
                                  "USR1@x", "$(id)@5"])
def test_bad_signals_are_refused(text: str) -> None:
    """No @, no signal, one that cannot be caught, an unknown name, or no time before the limit."""
    with pytest.raises(conv.InvalidValueError):
        conv.to_signal(text)


def test_exit_statuses_are_sorted_once_each_and_none_is_empty() -> None:
    """--never-retry 127,2,2 is (2, 127); none is (); 256 is PR222."""
    assert ((2, 127), ()) == (conv.to_statuses("127, 2,2"), conv.to_statuses("NONE"))
    with pytest.raises(conv.InvalidValueError) as caught:
        conv.to_statuses("2,256")

    assert "PR222" == caught.value.code


def test_a_command_with_a_newline_is_shown_on_one_line() -> None:
    """A --pre-restart command's control characters are escaped in explain (the plan keeps the command)."""
    solution = plan_of("--max-restarts=1", "--pre-restart=check\nrm -rf /tmp/x")
    text = render_plan(solution.plan, explain=True)

    assert "check\nrm -rf /tmp/x" == solution.plan.recovery.pre_restart
    assert "before each: check\\nrm -rf /tmp/x" in text
    assert ("check\\nrm -rf /tmp/x", "--pre-restart") == decisions(solution)["recovery.pre_restart"]
