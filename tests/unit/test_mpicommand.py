"""The mpirun command of a plan: real poprun's shape (reference 3.2), one app context per instance."""

import shlex

from hypothesis import given
from hypothesis import strategies as st

from poprun.backends.mpirun.command import mpirun_command, render_mpirun_command
from poprun.core.record import evolve
from poprun.planner.context import Context
from poprun.planner.flags import parse_flags
from poprun.planner.plan import LaunchPlan
from poprun.planner.solve import solve

CTX = Context(environ={"PATH": "/usr/bin"}, cwd="/work", local_names=("localhost", "me"))
HOSTS = ("10.1.3.101", "10.1.3.102", "10.1.3.103", "10.1.3.104")


def plan_of(*argv: str, program: tuple[str, ...] = ("python3", "train.py"), ctx: Context = CTX) -> LaunchPlan:
    return solve(parse_flags(["--backend=mpirun", *argv, *program]).spec, ctx).plan


def split(command: tuple[str, ...]) -> tuple[list[str], list[list[str]]]:
    """Return the words before the first ``-np`` and the words of each app context."""
    first = command.index("-np")
    contexts: list[list[str]] = [[]]
    for word in command[first:]:
        if word == ":":
            contexts.append([])
        else:
            contexts[-1].append(word)
    return list(command[:first]), contexts


def values(context: list[str]) -> list[str]:
    """Return the words that follow each ``-x`` of an app context."""
    return [context[i + 1] for i, word in enumerate(context[:-1]) if word == "-x"]


def test_single_host_plan():
    """Two instances on this machine: poprun's flags, -H with two slots, then each instance pinned there."""
    plan = plan_of("--num-replicas=2", "--num-instances=2")

    head, contexts = split(mpirun_command(plan))

    assert ["mpirun", "--bind-to", "none", "--tag-output", "-H", "localhost:2"] == head
    assert 2 == len(contexts)
    for instance, context in zip(plan.instances, contexts, strict=True):
        assert ["-np", "1", "--host", "localhost:2", "-wdir", "/work"] == context[:6]
        assert [f"{k}={v}" for k, v in instance.env.set] + ["PATH", "LD_LIBRARY_PATH", "PYTHONPATH"] == values(context)
        assert ["env", "-u", "IPUOF_CONFIG_PATH", "--", "python3", "train.py"] == context[-6:]
    assert "POPDIST_INSTANCE_INDEX=1" in values(contexts[1])


def test_the_pod64_shape_of_reference_3_2():
    """
    16 instances on 4 hosts, as graphcore/examples' rn50_pod64.sh ran them.

    Global args first, then poprun's own, -H with 4 slots a host, and ':'-separated app contexts
    in index order, each on its host, with its replica offset and the user's -x variables.
    """
    # GIVEN
    ctx = Context(environ={"PATH": "/usr/bin", "POPLAR_ENGINE_OPTIONS": "{}"}, cwd="/work")
    plan = plan_of("--num-replicas=64", "--num-instances=16", f"--host={','.join(HOSTS)}",
                   "--vipu-server-host=10.1.3.101", "--vipu-partition=p64",
                   "--mpi-global-args=--mca btl_tcp_if_include eno1",
                   "--mpi-local-args=-x POPLAR_ENGINE_OPTIONS -x IPUOF_VIPU_API_TIMEOUT=800", ctx=ctx)

    # WHEN
    head, contexts = split(mpirun_command(plan))

    # THEN
    assert ["mpirun", "--mca", "btl_tcp_if_include", "eno1", "--bind-to", "none", "--tag-output",
            "-H", "10.1.3.101:4,10.1.3.102:4,10.1.3.103:4,10.1.3.104:4"] == head
    assert 16 == len(contexts)
    for index, context in enumerate(contexts):
        assert ["-np", "1", "--host", f"{HOSTS[index // 4]}:4"] == context[:4]
        assert {f"POPDIST_REPLICA_INDEX_OFFSET={4 * index}", f"POPDIST_LOCAL_INSTANCE_INDEX={index % 4}",
                "IPUOF_VIPU_API_TIMEOUT=800", f"IPUOF_VIPU_API_GCD_ID={index}"} <= set(values(context))
        assert ["PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "POPLAR_ENGINE_OPTIONS"] == values(context)[-4:]
        assert ["python3", "train.py"] == context[-2:]


def test_host_subnet_sets_both_planes_before_the_hosts():
    """--host-subnet becomes oob_ and btl_tcp_if_include, just before -H."""
    head, _ = split(mpirun_command(plan_of("--num-replicas=2", "--host=a,b", "--host-subnet=10.5.0.0/16")))

    assert ["--mca", "oob_tcp_if_include", "10.5.0.0/16", "--mca", "btl_tcp_if_include", "10.5.0.0/16",
            "-H", "a:1,b:1"] == head[-8:]


def test_host_subnet_leaves_a_parameter_the_user_set_alone():
    """mpirun refuses an MCA parameter given twice, so the user's btl_tcp_if_include stands alone."""
    plan = plan_of("--num-replicas=2", "--host=a,b", "--host-subnet=10.5.0.0/16",
                   "--mpi-global-args=--mca btl_tcp_if_include eno1")

    head, _ = split(mpirun_command(plan))

    assert ["mpirun", "--mca", "btl_tcp_if_include", "eno1", "--bind-to", "none", "--tag-output",
            "--mca", "oob_tcp_if_include", "10.5.0.0/16", "-H", "a:1,b:1"] == head


def test_allow_run_as_root_follows_poprun_flags():
    """--allow-run-as-root=yes adds the flag after --tag-output; given in the global args, it is not repeated."""
    own, _ = split(mpirun_command(plan_of("--num-replicas=2", "--allow-run-as-root=yes")))
    given_, _ = split(mpirun_command(plan_of("--num-replicas=2", "--mpi-global-args=--allow-run-as-root")))

    assert ["mpirun", "--bind-to", "none", "--tag-output", "--allow-run-as-root", "-H", "localhost:1"] == own
    assert ["mpirun", "--allow-run-as-root", "--bind-to", "none", "--tag-output", "-H", "localhost:1"] == given_


def test_tag_output_in_the_global_args_is_not_repeated():
    """Evidence B's '--tag-output' from --mpi-global-args appears once."""
    head, _ = split(mpirun_command(plan_of("--num-replicas=2", "--mpi-global-args=--tag-output")))

    assert ["mpirun", "--tag-output", "--bind-to", "none", "-H", "localhost:1"] == head


def test_oversubscribe_is_never_added():
    """-H gives each host a slot per instance; --oversubscribe only comes from the user."""
    plain = mpirun_command(plan_of("--num-replicas=8", "--num-instances=8"))
    asked = mpirun_command(plan_of("--num-replicas=8", "--num-instances=8", "--mpi-global-args=--oversubscribe"))

    assert "--oversubscribe" not in plain
    assert 1 == asked.count("--oversubscribe")


def test_variables_set_by_the_user_are_not_removed():
    """A variable of env.unset that the plan also sets is not removed; with none left, no 'env' wrapper."""
    plan = plan_of("--num-replicas=2", "--mpi-local-args=-x IPUOF_CONFIG_PATH=/etc/ipuof.conf")

    _, (context,) = split(mpirun_command(plan))

    assert "IPUOF_CONFIG_PATH=/etc/ipuof.conf" in values(context)
    assert "env" not in context
    assert ["PYTHONPATH", "python3", "train.py"] == context[-3:]


def test_local_args_come_after_the_variables_and_before_the_program():
    """The words of --mpi-local-args that are not -x variables go just before the program."""
    plan = plan_of("--num-replicas=2", "--mpi-local-args=--report-bindings -x A=1")

    _, (context,) = split(mpirun_command(plan))

    assert ["PYTHONPATH", "--report-bindings", "env", "-u", "IPUOF_CONFIG_PATH", "--"] == context[-8:-2]
    assert "A=1" in values(context)


def test_awkward_values_stay_single_words():
    """Spaces, quotes and newlines in values and program arguments reach mpirun as one argv word each."""
    plan = plan_of("--num-replicas=2", "--mpi-local-args=-x 'MSG=a b' -x \"QUOTE=it's\" -x 'NL=one\ntwo'",
                   program=("python3", "-c", "print('a b')\nprint(2)", "x y"))

    command = mpirun_command(plan)
    _, (context,) = split(command)

    assert {"MSG=a b", "QUOTE=it's", "NL=one\ntwo"} <= set(values(context))
    assert ["python3", "-c", "print('a b')\nprint(2)", "x y"] == context[-4:]
    assert list(command) == shlex.split(render_mpirun_command(command))


def test_forwarded_variables_the_environment_lacks_are_left_out():
    """Given the launching environment, -x NAME is kept only for names it has (mpirun would warn)."""
    plan = plan_of("--num-replicas=2")

    everything = values(split(mpirun_command(plan))[1][0])
    present = values(split(mpirun_command(plan, environ={"PATH": "/bin", "PYTHONPATH": "."}))[1][0])

    assert ["PATH", "LD_LIBRARY_PATH", "PYTHONPATH"] == everything[-3:]
    assert ["PATH", "PYTHONPATH"] == present[-2:]
    assert "LD_LIBRARY_PATH" not in present


def test_the_mpirun_program_can_be_chosen():
    """``mpirun=`` names the program, e.g. the SDK's own."""
    assert "/opt/poplar/bin/mpirun" == mpirun_command(plan_of("--num-replicas=2"), mpirun="/opt/poplar/bin/mpirun")[0]


def test_render_quotes_like_real_poprun():
    """The program as it is, every other word single-quoted (reference 4.1, 'Running command:')."""
    text = render_mpirun_command(["/opt/poplar/bin/mpirun", "--tag-output", "-x", "A=it's", "python3"])

    assert "/opt/poplar/bin/mpirun '--tag-output' '-x' 'A=it'\"'\"'s' 'python3'" == text


def test_render_quotes_a_program_the_shell_would_split():
    """A program path with a space is quoted too; an empty argv renders as nothing."""
    assert "'/opt/my sdk/mpirun' '-np'" == render_mpirun_command(["/opt/my sdk/mpirun", "-np"])
    assert "" == render_mpirun_command([])


@given(st.lists(st.text(st.characters(exclude_characters="\x00")), min_size=1))
def test_render_then_shell_split_is_identity(argv):
    """Any argv rendered and split back as a POSIX shell does comes back word for word."""
    assert argv == shlex.split(render_mpirun_command(argv))


def test_the_users_bind_to_stands_and_bound_instances_run_through_taskset() -> None:
    """--bind-to in the global args: no '--bind-to none' added; a planned binding wraps the program (numactl/taskset)."""
    plan = plan_of("--num-replicas=2", "--process-placement=disabled", "--mpi-global-args=--map-by core --bind-to core")
    head, _ = split(mpirun_command(plan))
    bound = plan_of("--num-replicas=2", "--num-instances=2")
    bound = evolve(bound, instances=tuple(evolve(i, placement=evolve(i.placement, cpus=str(i.index)))
                                          for i in bound.instances))

    assert ["mpirun", "--map-by", "core", "--bind-to", "core", "--tag-output", "-H", "localhost:1"] == head
    assert ["poprun-bind", "1", "0", "python3", "train.py"] == list(mpirun_command(bound)[-5:])


def _two_cpus() -> object:
    from poprun.planner.machine import HostTopology, NumaNode

    return HostTopology(name="laptop", numa_nodes=(NumaNode(0, 0, ((0,), (1,))),), cpuset=(0, 1))


def test_more_instances_than_cpus_here_make_mpi_yield_when_idle():
    """4 instances on a host of 2 CPUs: --mca mpi_yield_when_idle 1, as --oversubscribe would; 2 instances: not."""
    ctx = evolve(CTX, probe=_two_cpus)
    crowded = plan_of("--num-instances", "4", "--num-replicas", "4", "--process-placement", "disabled", ctx=ctx)
    roomy = plan_of("--num-instances", "2", "--num-replicas", "2", "--process-placement", "disabled", ctx=ctx)

    assert (("localhost",), ()) == (crowded.mpi.crowded_hosts, roomy.mpi.crowded_hosts)
    assert "--mca mpi_yield_when_idle 1" in shlex.join(mpirun_command(crowded))
    assert "mpi_yield_when_idle" not in shlex.join(mpirun_command(roomy))
    assert any(d.key == "mpi yield localhost" and "4 instances on 2 CPUs" in d.reason for d in crowded.explanation)


def test_the_users_own_yield_setting_stands():
    """--mpi-global-args '--mca mpi_yield_when_idle 0': the user's value, and no second one."""
    ctx = evolve(CTX, probe=_two_cpus)
    plan = plan_of("--num-instances", "4", "--num-replicas", "4", "--process-placement", "disabled",
                   "--mpi-global-args=--mca mpi_yield_when_idle 0", ctx=ctx)

    assert 1 == shlex.join(mpirun_command(plan)).count("mpi_yield_when_idle")
