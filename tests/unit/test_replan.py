"""poprun.planner.replan.replan: the next attempt's plan without the lost hosts, its environment, and its refusals."""

import pytest

from poprun.core.diagnostic import DiagnosticError
from poprun.core.span import SourceSpan
from poprun.planner.context import Context
from poprun.planner.replan import replan
from poprun.planner.solve import solve
from poprun.planner.spec import Sourced, Spec

CTX = Context(environ={"PATH": "/bin"}, cwd="/w")
HERE = SourceSpan(file="<test>", key_path="$")


def _plan(hosts: int = 4, *, spares: tuple[str, ...] = (), min_hosts: int | None = None, **more):
    values = {"hosts": tuple(f"pod{n}" for n in range(1, hosts + 1)), "instances": hosts, "replicas": 2 * hosts,
              "program": ("python3", "train.py"), **more}
    if spares:
        values["spare_hosts"] = spares
    if min_hosts is not None:
        values["min_hosts"] = min_hosts
    return solve(Spec(**{k: Sourced(v, HERE) for k, v in values.items()}), CTX).plan


def _env(plan, index: int) -> dict[str, str]:
    return plan.instances[index].env.as_dict()


def test_a_spare_takes_the_place_of_instance_0s_host_and_master_addr_follows():
    """When instance 0's host is lost, its spare runs instance 0 and every instance's MASTER_ADDR names the spare."""
    plan = _plan(2, spares=("pod9",))

    done = replan(plan, {"pod1": "its link went down"}, CTX)

    assert ("pod9", "pod2") == done.plan.topology.hosts
    assert ["pod9", "pod9"] == [_env(done.plan, i)["MASTER_ADDR"] for i in range(2)]
    assert ("pod1", "pod9", "pod9") == (_env(plan, 0)["MASTER_ADDR"], done.plan.instances[0].host,
                                        done.plan.instances[0].host)
    assert (("pod1",), ("pod9",), False) == (done.removed, done.added, done.shrunk)
    assert "pod9 replaces pod1 (pod1: its link went down)" == done.why


def test_a_shrunk_plan_has_fewer_instances_and_replicas_and_their_environment():
    """Without a spare, the plan loses the host's instances and replicas; WORLD_SIZE and popdist's values follow."""
    plan = _plan(4, min_hosts=3)

    done = replan(plan, {"pod3": "lost"}, CTX)

    assert (("pod1", "pod2", "pod4"), 3, 6) == (done.plan.topology.hosts, done.plan.topology.num_instances,
                                                 done.plan.topology.num_replicas)
    env = _env(done.plan, 2)
    assert ("pod4", "3", "2", "6", "4", "pod1") == (done.plan.instances[2].host, env["WORLD_SIZE"], env["RANK"],
                                                    env["POPDIST_NUM_TOTAL_REPLICAS"],
                                                    env["POPDIST_REPLICA_INDEX_OFFSET"], env["MASTER_ADDR"])
    assert ("pod3 left out: 4 -> 3 hosts, 4 -> 3 instances, 8 -> 6 replicas (pod3: lost)") == done.why


def test_an_unusable_spare_is_passed_over_for_the_next():
    """A spare that failed its health check never takes a place; the next one does, and neither stays a spare."""
    plan = _plan(2, spares=("pod8", "pod9"))

    done = replan(plan, {"pod2": "health check failed"}, CTX, unusable=("pod8",))

    assert (("pod1", "pod9"), ()) == (done.plan.topology.hosts, done.plan.membership.spares)


def test_the_replanned_plan_says_why_in_its_explanation():
    """The new plan's explanation ends with a membership.replan decision: the hosts, and why."""
    done = replan(_plan(2, spares=("pod9",)), {"pod2": "lost"}, CTX)

    last = done.plan.explanation[-1]
    assert ("membership.replan", "pod1,pod9", "pod2: lost") == (last.key, last.value, last.reason)


def test_a_plan_without_spares_or_a_smaller_minimum_is_pr310():
    """With the default policy (the same hosts every attempt), a lost host ends the run: PR310, saying so."""
    plan = _plan(2, health_check="true")

    with pytest.raises(DiagnosticError) as problem:
        replan(plan, {"pod2": "lost"}, CTX)

    [found] = problem.value.diagnostics
    assert ("PR310", ("pod2 left the launch (pod2: lost); 1 of 2 hosts are left, and the plan has no spare host and "
                     "runs on no fewer hosts"), "host pod2 lost") == (found.code, found.detail, found.span.key_path)


def test_fewer_hosts_than_the_minimum_is_pr310_naming_the_minimum():
    """Two hosts lost where the plan runs on no fewer than three of four: PR310."""
    with pytest.raises(DiagnosticError) as problem:
        replan(_plan(4, min_hosts=3), {"pod1": "lost", "pod4": "preflight failed"}, CTX)

    assert problem.value.diagnostics[0].detail.endswith("2 of 4 hosts are left, and the plan runs on no fewer than 3 "
                                                        "(--min-hosts)")


def test_no_plan_on_the_hosts_left_is_pr311_with_the_solvers_reason_after_it():
    """A rule of the spec that fails on fewer hosts (an instance that no longer exists): PR311, then the solver's own."""
    plan = _plan(4, min_hosts=2, only_output_from_instance=3)

    with pytest.raises(DiagnosticError) as problem:
        replan(plan, {"pod2": "lost"}, CTX)

    assert ["PR311", "PR205"] == [d.code for d in problem.value.diagnostics]
    assert "the hosts left: pod1, pod3, pod4" == problem.value.diagnostics[0].span.key_path


def test_a_loss_that_names_no_host_of_the_plan_is_a_programming_error():
    """replan() needs a host of the plan to leave out: a ValueError, never a plan identical to the last."""
    with pytest.raises(ValueError, match="needs a host of the plan"):
        replan(_plan(2, spares=("pod9",)), {"pod9": "lost"}, CTX)


def test_a_replan_keeps_the_plans_working_directory_wherever_it_is_made():
    """A re-plan made from another directory (apply of a saved plan) runs the instances where the plan did."""
    plan = _plan(2, spares=("pod9",))
    elsewhere = Context(environ={"PATH": "/bin"}, cwd="/somewhere/else")

    done = replan(plan, {"pod2": "lost"}, elsewhere)

    assert ["/w", "/w"] == [i.cwd for i in done.plan.instances]
