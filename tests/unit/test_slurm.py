"""Planning inside a Slurm allocation: hosts, instances and backend from Slurm's variables; PR217; the batch script."""

import pytest

from poprun.backends.slurm.batch import render_batch_script
from poprun.core.diagnostic import DiagnosticError
from poprun.planner.context import Context
from poprun.planner.flags import parse_flags
from poprun.planner.slurm import Allocation, expand_counts, from_environ
from poprun.planner.solve import Solution, solve

ALLOCATION = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "n[1-3]", "SLURM_TASKS_PER_NODE": "2(x3)",
              "SLURM_JOB_CPUS_PER_NODE": "2(x3)", "SLURM_NTASKS": "6"}
INSIDE = Context(environ={"PATH": "/usr/bin", **ALLOCATION}, cwd="/work")


def plan_of(*argv: str, ctx: Context = INSIDE) -> Solution:
    return solve(parse_flags([*argv, "python3", "train.py"]).spec, ctx)


def decision(solution: Solution, key: str) -> tuple[str | int | bool, str, str]:
    found = next(d for d in solution.plan.explanation if d.key == key)
    return found.value, found.source, found.reason


@pytest.mark.parametrize(("text", "counts"), [("2(x3)", (2, 2, 2)), ("2(x2),1", (2, 2, 1)), ("4", (4,)),
                                              ("", ()), ("2(x", ())])
def test_expand_counts_reads_slurms_repeat_syntax(text, counts):
    """Slurm's '2(x3),1' is one count per node; unreadable text is no counts."""
    assert counts == expand_counts(text)


def test_allocation_is_read_from_slurms_variables():
    """The job, its nodes in hostlist syntax expanded, tasks and CPUs per node, and the task count."""
    assert Allocation(job_id="42", nodelist="n[1-3]", nodes=("n1", "n2", "n3"), tasks_per_node=(2, 2, 2),
                      cpus_per_node=(2, 2, 2), num_tasks=6) == from_environ(ALLOCATION)


def test_no_allocation_without_job_id_or_with_a_broken_nodelist():
    """Outside an allocation, or with a node list that does not parse, there is none."""
    assert (None, None) == (from_environ({}), from_environ({"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "n[1-"}))


def test_hosts_instances_and_backend_default_to_the_allocation_and_explain_says_so():
    """Inside an allocation: its nodes, one instance per task, the slurm backend, each with its reason."""
    solution = plan_of("--num-replicas=6")

    assert (("n1", "n2", "n3"), 6, 2) == (solution.plan.topology.hosts, solution.plan.topology.num_instances,
                                          solution.plan.topology.instances_per_host)
    assert ("n1,n2,n3", "environment variable SLURM_JOB_NODELIST",
            "not given: the nodes of Slurm job 42 (n[1-3]: 2 tasks and 2 CPUs per node)") == decision(solution, "hosts")
    assert (6, "environment variable SLURM_NTASKS",
            "not given: one instance per task of Slurm job 42 (n[1-3]: 2 tasks and 2 CPUs per node)") == decision(
        solution, "num_instances")
    assert ("slurm", "inside Slurm job 42: the instances start as one srun step") == (
        solution.plan.backend.name, solution.plan.backend.reason)


def test_allocation_without_a_task_count_gives_one_instance_per_node():
    """salloc -N3 without -n: no SLURM_NTASKS, so one instance per node, as for --host."""
    ctx = Context(environ={k: v for k, v in INSIDE.environ.items() if k != "SLURM_NTASKS"}, cwd="/work")

    assert 3 == plan_of("--num-replicas=6", ctx=ctx).plan.topology.num_instances


def test_backend_given_still_wins_inside_an_allocation():
    """--backend mpirun inside an allocation is mpirun (OpenMPI then launches through Slurm)."""
    assert "mpirun" == plan_of("--num-replicas=6", "--backend=mpirun").plan.backend.name


def test_hosts_of_the_allocation_may_be_named():
    """--host naming some of the allocation's nodes is fine; instances default to one per host."""
    assert (("n2", "n3"), 2) == (plan_of("--num-replicas=2", "--host=n2,n3").plan.topology.hosts,
                                 plan_of("--num-replicas=2", "--host=n2,n3").plan.topology.num_instances)


def test_host_outside_the_allocation_is_pr217():
    """--host naming a host the allocation lacks is PR217, placed at --host, with the allocation in the detail."""
    with pytest.raises(DiagnosticError) as info:
        plan_of("--num-replicas=2", "--host=n1,pod9")
    diag = info.value.diagnostics[0]

    assert ("PR217", "--host") == (diag.code, diag.span.key_path)
    assert "pod9 is not among the nodes of Slurm job 42 (n[1-3]: 2 tasks and 2 CPUs per node)" == diag.detail


def test_ssh_backend_given_may_reach_hosts_outside_the_allocation():
    """With --backend ssh the user reaches other machines on purpose: no PR217."""
    assert ("pod9",) == plan_of("--num-replicas=2", "--host=pod9", "--backend=ssh").plan.topology.hosts


def test_outside_an_allocation_nothing_changes():
    """Without SLURM_JOB_ID the hosts default to this host and the backend to local."""
    solution = plan_of("--num-replicas=2", ctx=Context(environ={"PATH": "/usr/bin"}, cwd="/work"))

    assert (("localhost",), "local") == (solution.plan.topology.hosts, solution.plan.backend.name)


def test_batch_script_asks_for_the_plans_shape_and_runs_poprun_in_its_directory():
    """Nodes = hosts, tasks per node = instances per host, the command quoted for sh."""
    plan = plan_of("--num-replicas=6", "--num-instances=6", "--host=a,b,c",
                   ctx=Context(environ={"PATH": "/usr/bin"}, cwd="/work")).plan

    assert ("#!/bin/sh\n#SBATCH --job-name=poprun\n#SBATCH --nodes=3\n#SBATCH --ntasks-per-node=2\n"
            "#SBATCH --chdir=/work\n#SBATCH --nodelist=a,b,c\n"
            f"# Written by poprun {plan.poprun_version} submit: 6 instances, 2 per node on 3 nodes.\n"
            "# Inside the allocation poprun takes its nodes as the hosts and starts the instances with srun.\n"
            "exec poprun --host a,b,c python3 -c 'print(\"it'\"'\"'s\")'\n") == render_batch_script(
        plan, command=("poprun", "--host", "a,b,c", "python3", "-c", "print(\"it's\")"), nodelist=("a", "b", "c"))
