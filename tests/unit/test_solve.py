"""The solver: division rules with alternatives, defaults, derived values and plan-time rules."""

import json

import pytest

from poprun.core.diagnostic import DiagnosticError
from poprun.planner.context import Context
from poprun.planner.flags import parse_flags
from poprun.planner.solve import Solution, solve

CTX = Context(environ={"PATH": "/usr/bin"}, cwd="/work", local_names=("localhost", "me"))


def plan_of(*argv: str, ctx: Context = CTX, require_program: bool = True) -> Solution:
    return solve(parse_flags([*argv, "python3", "train.py"]).spec, ctx, require_program=require_program)


def failure(*argv: str, ctx: Context = CTX):
    with pytest.raises(DiagnosticError) as info:
        plan_of(*argv, ctx=ctx)
    return [d for d in info.value.diagnostics if d.is_error][0]


def env(solution: Solution, index: int = 0) -> dict[str, str]:
    return solution.plan.instances[index].env.as_dict()


def test_replicas_that_do_not_divide_get_the_nearest_alternatives():
    """10 replicas over 4 instances is PR300 with the nearest feasible numbers."""
    diag = failure("--num-replicas=10", "--num-instances=4")

    assert ("PR300", "replicas do not divide across instances") == (diag.code, diag.summary)
    assert "10 replicas cannot be split evenly across 4 instances" == diag.detail
    assert "use 8 or 12 replicas, or 2 or 5 instances" == diag.hint


def test_instances_that_do_not_divide_across_hosts():
    """3 instances on 2 hosts is PR301."""
    diag = failure("--num-replicas=6", "--num-instances=3", "--host=a,b")

    assert ("PR301", "3 instances cannot be split evenly across 2 hosts") == (diag.code, diag.detail)
    assert "use 2 or 6 instances, or 1 or 3 hosts" == diag.hint


def test_instances_that_do_not_divide_across_ilds():
    """3 instances in 2 ILDs is PR302."""
    assert "PR302" == failure("--num-replicas=6", "--num-instances=3", "--num-ilds=2").code


def test_ild_over_capacity_on_an_offline_target():
    """128 IPUs in one ILD of a pod128 (64 IPUs per ILD) is PR303, suggesting 2 ILDs."""
    diag = failure("--num-replicas=16", "--ipus-per-replica=8", "--num-instances=2", "--num-ilds=1",
                   "--offline-mode=yes", "--offline-target=pod128")

    assert ("PR303", "128 IPUs in 1 ILD need 128 IPUs per ILD, but an ILD of the target has 64") == (
        diag.code, diag.detail)
    assert "use 8 replicas, or 4 IPUs per replica, or 2 ILDs" == diag.hint


def test_more_ipus_than_the_target():
    """32 IPUs on a pod16 is PR305."""
    diag = failure("--num-replicas=32", "--offline-mode=yes", "--offline-target=pod16")

    assert ("PR305", "32 replicas x 1 IPU = 32 IPUs, but the offline target has 16") == (diag.code, diag.detail)


def test_one_instance_one_replica_is_a_warning():
    """The seed's unsupported combination is the warning PR304, not an error."""
    solution = plan_of("--num-instances=1", "--num-replicas=1")

    assert ["PR304"] == [w.code for w in solution.warnings]
    assert ["PR304"] == [n.code for n in solution.plan.warnings]


def test_instances_default_to_one_per_host():
    """Hosts without instances give one instance per host (derived, and said so)."""
    solution = plan_of("--num-replicas=4", "--host=pod[1-4]")
    decision = next(d for d in solution.plan.explanation if d.key == "num_instances")

    assert 4 == solution.plan.topology.num_instances
    assert ("derived", "not given: one instance per host") == (decision.source, decision.reason)


def test_instances_are_contiguous_blocks_per_host():
    """Instances 0-1 on the first host, 2-3 on the second; local indices restart per host."""
    plan = plan_of("--num-replicas=8", "--num-instances=4", "--host=pod1,pod2").plan

    assert [("pod1", 0), ("pod1", 1), ("pod2", 0), ("pod2", 1)] == [(i.host, i.local_index) for i in plan.instances]
    assert [0, 2, 4, 6] == [i.replica_offset for i in plan.instances]


def test_ilds_are_derived_from_the_ipus():
    """128 IPUs without --num-ilds need two ILDs of 64."""
    plan = plan_of("--num-replicas=32", "--ipus-per-replica=4", "--num-instances=4").plan

    assert 2 == plan.topology.num_ilds
    assert [0, 0, 1, 1] == [i.ild for i in plan.instances]


def test_environment_matches_real_poprun():
    """Each instance gets the POPDIST and IPUOF variables real poprun set, and MPI's rank and size."""
    solution = plan_of("--num-replicas=64", "--num-instances=16", "--host=h1,h2,h3,h4", "--vipu-partition=p64",
                       "--vipu-server-host=10.1.3.101", "--executable-cache-path=cache/rn50-pod64")
    fifth = env(solution, 5)

    assert {"POPDIST_NUM_TOTAL_REPLICAS": "64", "POPDIST_NUM_IPUS_PER_REPLICA": "1", "POPDIST_NUM_LOCAL_REPLICAS": "4",
            "POPDIST_UNIFORM_REPLICAS_PER_INSTANCE": "1", "POPDIST_REPLICA_INDEX_OFFSET": "20",
            "POPDIST_LOCAL_INSTANCE_INDEX": "1", "POPDIST_EXECUTABLE_CACHE_PATH": "cache/rn50-pod64",
            "IPUOF_VIPU_API_HOST": "10.1.3.101", "IPUOF_VIPU_API_PORT": "8090", "IPUOF_VIPU_API_PARTITION_ID": "p64",
            "IPUOF_VIPU_API_TIMEOUT": "120", "IPUOF_VIPU_API_GCD_ID": "5", "IPUOF_LOG_LEVEL": "WARN",
            "OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "16"}.items() <= fifth.items()
    assert ("IPUOF_CONFIG_PATH",) == solution.plan.instances[5].env.unset
    assert ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH") == solution.plan.instances[5].env.forward


def test_torchrun_variables_are_set():
    """RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, GROUP_RANK... let torchrun-style programs run unchanged."""
    fields = env(plan_of("--num-replicas=4", "--num-instances=4", "--host=a,b"), 3)

    assert {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "a",
            "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "2", "ROLE_RANK": "3", "ROLE_WORLD_SIZE": "4",
            "ROLE_NAME": "default", "TORCHELASTIC_MAX_RESTARTS": "0"}.items() <= fields.items()
    assert "MASTER_PORT" not in fields


def test_user_variables_override_in_order():
    """``-x IPUOF_VIPU_API_TIMEOUT=800`` overrides poprun's value; a later ``-x`` wins."""
    fields = env(plan_of("--mpi-local-args=-x IPUOF_VIPU_API_TIMEOUT=800 -x A=1 -x A=2", "--num-replicas=2"))

    assert ("800", "2") == (fields["IPUOF_VIPU_API_TIMEOUT"], fields["A"])


def test_forwarded_variables_are_recorded_by_name_not_value():
    """``-x SECRET_TOKEN`` is forwarded by name: the plan holds no value from the planning shell."""
    ctx = Context(environ={"SECRET_TOKEN": "hunter2"}, cwd="/w")
    solution = plan_of("--mpi-local-args=-x SECRET_TOKEN", "--num-replicas=2", ctx=ctx)

    assert "SECRET_TOKEN" in solution.plan.instances[0].env.forward
    assert "hunter2" not in json.dumps(env(solution))


def test_per_instance_variables_reach_only_that_instance():
    """``--instance-mpi-local-args=1:-x A=b`` sets A on instance 1 only."""
    solution = plan_of("--num-replicas=2", "--num-instances=2", "--instance-mpi-local-args=1:-x A=b")

    assert (None, "b") == (env(solution, 0).get("A"), env(solution, 1).get("A"))


def test_per_instance_arguments_for_a_missing_instance_are_pr205():
    """An index past the last instance is PR205."""
    assert "PR205" == failure("--num-replicas=2", "--num-instances=2", "--instance-mpi-local-args=2:-x A=b").code


def test_only_output_from_a_missing_instance_is_pr205():
    """``--only-output-from-instance 4`` with 2 instances is PR205."""
    assert "PR205" == failure("--num-replicas=2", "--num-instances=2", "--only-output-from-instance=4").code


@pytest.mark.parametrize(("argv", "mode", "per_host"), [
    (("--num-replicas=4",), "disabled", False),
    (("--num-replicas=4", "--num-instances=2"), "temporary", False),
    (("--num-replicas=4", "--num-instances=2", "--host=a,b"), "temporary", True),
    (("--num-replicas=4", "--num-instances=2", "--executable-cache-path="), "disabled", False),
    (("--num-replicas=4", "--executable-cache-path=/tmp/c"), "user", False),
])
def test_executable_cache_policy_per_launch_mode(argv, mode, per_host):
    """Seed sections 2.3-2.4: off for one instance, temporary for several, "" disables, a path is kept."""
    cache = plan_of(*argv).plan.cache

    assert (mode, per_host) == (cache.mode, cache.per_host)


def test_poptorch_cache_dir_with_a_cache_path_is_pr202():
    """POPTORCH_CACHE_DIR together with --executable-cache-path is an error (seed 2.3)."""
    ctx = Context(environ={"POPTORCH_CACHE_DIR": "/c"}, cwd="/w")

    assert "PR202" == failure("--num-replicas=2", "--executable-cache-path=/x", ctx=ctx).code


@pytest.mark.parametrize(("argv", "environ"), [
    ((), {"POPLAR_ENGINE_OPTIONS": '{"autoReport.directory":"/tmp/p"}'}),
    (('--mpi-local-args=-x POPLAR_ENGINE_OPTIONS={"autoReport.directory":"/tmp/p"}',), {}),
    (('--instance-mpi-local-args=0:-x POPLAR_ENGINE_OPTIONS={"autoReport.directory":"/tmp/p/0"}',), {}),
])
def test_autoreport_dir_conflicts_with_engine_options(argv, environ):
    """Seed 2.7.3: autoReport.directory in POPLAR_ENGINE_OPTIONS, from anywhere, is PR203 with PopRun's message."""
    diag = failure("--num-replicas=4", "--num-instances=4", "--autoreport-dir=/tmp/t", *argv,
                   ctx=Context(environ=environ, cwd="/w"))

    assert "PR203" == diag.code
    assert ("autoreport-dir command line argument cannot be specified when POPLAR_ENGINE_OPTIONS contains "
            "autoReport.directory setting") == diag.detail


def test_autoreport_dir_is_given_to_every_instance():
    """``--autoreport-dir`` sets POPDIST_AUTOREPORT_DIRECTORY; POPLAR_ENGINE_OPTIONS is forwarded."""
    ctx = Context(environ={"POPLAR_ENGINE_OPTIONS": '{"allowOutOfMemory":"true"}'}, cwd="/w")
    solution = plan_of("--num-replicas=4", "--num-instances=4", "--autoreport-dir=/tmp/t", ctx=ctx)

    assert "/tmp/t" == env(solution, 3)["POPDIST_AUTOREPORT_DIRECTORY"]
    assert "POPLAR_ENGINE_OPTIONS" in solution.plan.instances[3].env.forward


@pytest.mark.parametrize(("argv", "environ", "config", "expected"), [
    (("--vipu-server-host=flag",), {"IPUOF_VIPU_API_HOST": "env"}, {"api-host": "conf"}, ("flag", "--vipu-server-host")),
    ((), {"IPUOF_VIPU_API_HOST": "env"}, {"api-host": "conf"}, ("env", "environment variable IPUOF_VIPU_API_HOST")),
    ((), {}, {"api-host": "conf"}, ("conf", "/etc/vipu/vipu-cli.hcl")),
    ((), {}, {}, ("localhost", "default")),
])
def test_vipu_server_address_precedence(argv, environ, config, expected):
    """Seed 2.8.1: the flag, then IPUOF_VIPU_API_HOST, then the local vipu configuration, then localhost."""
    ctx = Context(environ=environ, cwd="/w", vipu_config=config, vipu_config_file="/etc/vipu/vipu-cli.hcl")
    solution = plan_of("--num-replicas=2", *argv, ctx=ctx)
    decision = next(d for d in solution.plan.explanation if d.key == "vipu_server_host")

    assert expected == (solution.plan.partition.server_host, decision.source)


def test_partition_name_from_the_environment():
    """IPUOF_VIPU_API_PARTITION_ID names the partition when --vipu-partition is not given."""
    ctx = Context(environ={"IPUOF_VIPU_API_PARTITION_ID": "p64", "IPUOF_VIPU_API_PORT": "34521"}, cwd="/w")
    partition = plan_of("--num-replicas=2", ctx=ctx).plan.partition

    assert ("p64", 34521) == (partition.name, partition.server_port)


def test_partition_describes_the_seed_launch():
    """Seed 2.8.3: 32 replicas, 2 instances, 2 ILDs need a 32-IPU, 2-GCD, 2-ILD partition."""
    partition = plan_of("--vipu-partition=my_partition", "--vipu-server-host=vipu.my_domain",
                        "--vipu-server-port=34521", "--num-replicas=32", "--num-instances=2", "--num-ilds=2",
                        "--update-partition=yes", "--remove-partition=no").plan.partition

    assert ("my_partition", 32, 2, 2, True, False) == (partition.name, partition.num_ipus, partition.num_gcds,
                                                       partition.num_ilds, partition.update, partition.remove)


def test_offline_mode_has_no_partition_and_the_offline_backend():
    """``--offline-mode=1`` plans no partition, no IPUOF_VIPU variables, and the offline backend."""
    solution = plan_of("--num-instances=2", "--num-replicas=2", "--offline-mode=1")

    assert (None, "offline") == (solution.plan.partition, solution.plan.backend.name)
    assert not any(k.startswith("IPUOF_VIPU") for k in env(solution))


def test_offline_target_sets_the_target_options():
    """Seed 2.6: ``--offline-target=pod16`` sets POPLAR_TARGET_OPTIONS as poprun wrote them."""
    solution = plan_of("--num-instances=4", "--num-replicas=8", "--ipus-per-replica=2", "--offline-mode=yes",
                       "--offline-target=pod16")

    assert ('{"ipuLinkDomainSize":"16","ipuLinkConfiguration":"slidingWindow","ipuLinkTopology":"mesh",'
            '"gatewayMode":"true","instanceSize":"4"}') == env(solution)["POPLAR_TARGET_OPTIONS"]


def test_unknown_offline_target_is_pr206():
    """An unknown target suggests the nearest."""
    diag = failure("--offline-mode=1", "--offline-target=pod61")

    assert ("PR206", "did you mean 'pod64'?") == (diag.code, diag.hint)


def test_offline_target_without_offline_mode_is_a_warning():
    """``--offline-target`` alone is PR207, a warning."""
    assert ["PR207"] == [w.code for w in plan_of("--num-replicas=2", "--offline-target=pod16").warnings]


def test_no_program_is_pr209_unless_only_planning():
    """A launch needs a program; ``poprun plan`` only warns."""
    spec = parse_flags(["--num-replicas=2"]).spec
    with pytest.raises(DiagnosticError) as info:
        solve(spec, CTX)

    assert "PR209" == info.value.diagnostics[0].code
    assert ["PR209"] == [w.code for w in solve(spec, CTX, require_program=False).warnings]


def test_numa_awareness_switches_on_with_several_instances_per_host():
    """Changelog 2.1: more than one instance per host turns NUMA awareness on."""
    assert plan_of("--num-replicas=2", "--num-instances=2").plan.instances[0].placement.numa_aware
    assert not plan_of("--num-replicas=2", "--num-instances=2", "--host=a,b").plan.instances[0].placement.numa_aware


@pytest.mark.parametrize(("hosts", "backend"), [("localhost", "local"), ("me,localhost", "local"), ("a,b", "ssh")])
def test_backend_follows_the_hosts(hosts, backend):
    """Local hosts use the local backend, remote hosts ssh; the reason is recorded."""
    plan = plan_of("--num-replicas=2", "--num-instances=2", f"--host={hosts}").plan

    assert backend == plan.backend.name
    assert plan.backend.reason


def test_output_settings_come_from_mpi_global_args():
    """``--tag-output`` and ``--output-filename DIR`` in --mpi-global-args shape the output."""
    output = plan_of("--num-replicas=2", "--mpi-global-args=--tag-output --output-filename out").plan.output

    assert (True, "out") == (output.tag, output.output_filename)


def test_every_value_has_a_source_and_a_reason():
    """The explanation names a source and a reason for each decision."""
    plan = plan_of("--num-replicas=2").plan

    assert all(d.source and d.reason for d in plan.explanation)
    assert {"num_replicas", "num_instances", "num_ilds", "hosts", "backend", "executable_cache"} <= {
        d.key for d in plan.explanation}


def test_host_file_gives_the_hosts(tmp_path):
    """A host file lists one host or range per line; comments and blank lines are skipped."""
    (tmp_path / "hosts.txt").write_text("# the pod\npod[1-2]\n\npod3  # spare\npod1\n", encoding="utf-8")
    plan = plan_of("--host-file=hosts.txt", "--num-replicas=3", ctx=Context(cwd=str(tmp_path))).plan

    assert ("pod1", "pod2", "pod3") == plan.topology.hosts
    assert 3 == plan.topology.num_instances


@pytest.mark.parametrize(("text", "code", "line"), [("pod1\npod[1-\n", "PR103", 2), ("# nothing\n", "PR215", None)])
def test_host_file_problems(tmp_path, text, code, line):
    """A bad line in a host file points at that line; an empty host file is PR215."""
    (tmp_path / "hosts.txt").write_text(text, encoding="utf-8")
    diag = failure("--host-file=hosts.txt", ctx=Context(cwd=str(tmp_path)))

    assert (code, line) == (diag.code, diag.span.line if code == "PR103" else None)


def test_missing_host_file_is_pr113(tmp_path):
    """A host file that cannot be read is PR113."""
    assert "PR113" == failure("--host-file=nope.txt", ctx=Context(cwd=str(tmp_path))).code
