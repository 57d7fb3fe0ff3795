"""Flags, TOML and the DSL express the same Spec, so they give equal plans."""

import shlex

from hypothesis import given
from hypothesis import strategies as st

from poprun.core.record import evolve
from poprun.planner.context import Context
from poprun.planner.dsl.read import parse_dsl
from poprun.planner.dsl.write import to_dsl
from poprun.planner.flags import parse_flags
from poprun.planner.plan import LaunchPlan
from poprun.planner.serde import to_json
from poprun.planner.solve import solve
from poprun.planner.tomlspec import parse_toml, to_toml

CTX = Context(environ={"PATH": "/bin", "PYTHONPATH": "/lib"}, cwd="/w")
words = st.sampled_from(["a", "b c", "it's", 'say "hi"', "naïve", "--epochs", "x=1", "$(rm)", "`id`"])


@st.composite
def command_lines(draw: st.DrawFn) -> list[str]:
    """Feasible PopRun command lines using many options, with a program."""
    hosts = draw(st.integers(1, 4))
    instances = hosts * draw(st.integers(1, 3))
    argv = [f"--num-replicas={instances * draw(st.integers(1, 3))}", f"--num-instances={instances}",
            f"--host=pod[1-{hosts}]", f"--ipus-per-replica={draw(st.sampled_from([1, 2, 4]))}"]
    optional = [
        "--vipu-partition=p64", "--vipu-server-host=vipu.example", "--vipu-server-port=34521",
        "--update-partition=yes", "--remove-partition=no", "--reset-partition=no", "--sync-type=ST_POD_NATIVE_DEFAULT",
        "--vipu-allocation=c64", "--vipu-server-timeout=600", "--executable-cache-path=/tmp/cache",
        "--mpi-global-args=--tag-output --allow-run-as-root", "--mpi-local-args=-x PYTHONPATH -x A=1 --bind-to none",
        "--numa-aware=yes", "--process-placement=close", "--print-topology=yes", "--only-output-from-instance=0",
        "--offline-mode=yes", "--autoreport-dir=/tmp/profiles", "--host-subnet=10.5.0.0/16", "-vv",
        "--instance-mpi-local-args=0:-x B=2", "--allow-run-as-root=1", "--max-restarts=2",
        "--restart-scope=instance", "--restart-backoff=0.25", "--never-retry=none", "--pre-restart=./check 'x' $(id)",
        "--timeout=600.5", "--stall-timeout=30", "--crash-loop=1", "--min-uptime=0",
        "--health-check=test -e /x 'y' $(id)", "--health-check-timeout=2.5",
    ]
    argv += draw(st.lists(st.sampled_from(optional), unique=True, max_size=8))
    return [*argv, "python3", "train.py", *draw(st.lists(words, max_size=3))]


@given(command_lines())
def test_flags_toml_and_dsl_give_equal_plans(argv):
    """A command line, written out as TOML and as the DSL and read back, plans the same bytes."""
    spec = parse_flags(argv).spec
    from_toml = parse_toml(to_toml(spec), file="spec.toml")
    from_dsl = parse_dsl(to_dsl(spec), file="spec.pop")

    assert spec == from_toml
    assert spec == from_dsl
    plans = [to_json(_sourceless(solve(s, CTX).plan)) for s in (spec, from_toml, from_dsl)]
    assert plans[0] == plans[1] == plans[2]


def _sourceless(plan: LaunchPlan) -> LaunchPlan:
    """The plan with the decisions' sources blanked: they name the front end (a flag, file:line)."""
    return evolve(plan, explanation=tuple(evolve(d, source="") for d in plan.explanation))


@given(command_lines())
def test_exported_toml_reimports_to_the_same_command_line(argv):
    """``--export-config`` then ``--import-config`` repeats the command line (seed section 2.9)."""
    spec = parse_flags(argv).spec

    assert spec == parse_toml(to_toml(spec), file="training.conf")
    assert shlex.join(spec.program.value) == shlex.join(parse_toml(to_toml(spec), file="x").program.value)
