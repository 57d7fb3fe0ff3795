"""CPU threads: each instance's OMP_NUM_THREADS is its share of the CPUs it may use, decided and explained per host."""

from __future__ import annotations

import pytest

from poprun.planner.context import Context
from poprun.planner.flags import parse_flags
from poprun.planner.machine import load
from poprun.planner.solve import solve


def plan_env(*argv: str, environ: dict[str, str] | None = None, topology: str = "workstation-1numa"):
    """Return each instance's (OMP_NUM_THREADS, MKL_DYNAMIC, forwards OMP_NUM_THREADS) and the threads decisions."""
    ctx = Context(environ={"PATH": "/usr/bin"} | (environ or {}), cwd="/work", local_names=("localhost",),
                  probe=lambda: load(topology))
    plan = solve(parse_flags([*argv, "python3", "train.py"]).spec, ctx).plan
    found = [(i.env.get("OMP_NUM_THREADS"), i.env.get("MKL_DYNAMIC"), "OMP_NUM_THREADS" in i.env.forward)
             for i in plan.instances]
    return found, [(d.key, d.value) for d in plan.explanation if d.key.startswith(("threads", "OMP_NUM"))]


@pytest.mark.parametrize(("argv", "topology", "expected"), [
    # alone on this machine's 8 CPUs: all of them, as torchrun gives
    (("--num-instances=1", "--num-replicas=2"), "workstation-1numa", ["8"]),
    # two instances bound to the same NUMA node (spreadnuma on one node): half each
    (("--num-instances=2", "--num-replicas=2"), "workstation-1numa", ["4", "4"]),
    # spreadnuma over two NUMA nodes of 40 CPUs: each its own node
    (("--num-instances=2", "--num-replicas=2"), "xeon-2s-2numa", ["40", "40"]),
    # four instances over two nodes: two share each node
    (("--num-instances=4", "--num-replicas=4"), "xeon-2s-2numa", ["20", "20", "20", "20"]),
    # NUMA awareness off: the host's CPUs shared by its instances
    (("--num-instances=3", "--num-replicas=3", "--numa-aware=no"), "xeon-2s-2numa", ["26", "26", "26"]),
    # bound to one core (two hyperthreads): two
    (("--num-instances=2", "--num-replicas=2", "--process-placement=close"), "xeon-2s-2numa", ["2", "2"]),
])
def test_each_instance_gets_its_share_of_the_cpus_it_may_use(argv, topology, expected):
    """The thread count follows the placement's CPU sets, else the host's CPUs, shared evenly."""
    found, _ = plan_env(*argv, topology=topology)

    assert [(n, None, False) for n in expected] == found


def test_an_instance_alone_on_a_host_whose_cpus_are_unknown_gets_mkl_dynamic_off():
    """Remote hosts not read when planning: MKL_DYNAMIC=FALSE (torch then uses every CPU), and it says why."""
    found, decisions = plan_env("--host=h1,h2", "--num-instances=2", "--num-replicas=2")

    assert [(None, "FALSE", False)] * 2 == found
    assert [("threads h[1-2]", "every CPU")] == decisions  # hosts decided alike: one line


def test_several_instances_on_a_host_whose_cpus_are_unknown_get_one_thread_as_under_torchrun():
    """Two per remote host, NUMA awareness off: OMP_NUM_THREADS=1, torchrun's choice."""
    found, _ = plan_env("--host=h1,h2", "--num-instances=4", "--num-replicas=4", "--numa-aware=no")

    assert [("1", None, False)] * 4 == found


def test_the_users_thread_count_wins():
    """-x OMP_NUM_THREADS for instance 1 is kept; the launching shell's is forwarded to every other instance."""
    given, _ = plan_env("--num-instances=2", "--num-replicas=2", "--instance-mpi-local-args=1:-x OMP_NUM_THREADS=3")
    shell, decisions = plan_env("--num-instances=2", "--num-replicas=2", environ={"OMP_NUM_THREADS": "6"})

    assert [("4", None, False), ("3", None, False)] == given
    assert [(None, None, True)] * 2 == shell
    assert [("OMP_NUM_THREADS", "forwarded")] == decisions
