"""
Laws of re-planning (poprun.planner.replan.replan) on solvable specs: what a next attempt may run on, and its shape.
"""

from __future__ import annotations

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from poprun.core.diagnostic import DiagnosticError
from poprun.core.span import SourceSpan
from poprun.planner.context import Context
from poprun.planner.plan import LaunchPlan
from poprun.planner.replan import replan
from poprun.planner.solve import solve
from poprun.planner.spec import Sourced, Spec

CTX = Context(environ={"PATH": "/bin"}, cwd="/w")
HERE = SourceSpan(file="<law>", key_path="$")


@st.composite
def plans(draw: st.DrawFn) -> LaunchPlan:
    """A solved plan on 1-5 hosts with 0-3 spares and maybe a smaller minimum (ssh or mpirun: both change hosts)."""
    hosts = draw(st.integers(1, 5))
    per_host, per_instance = draw(st.integers(1, 2)), draw(st.integers(1, 3))
    spares = draw(st.integers(0, 3))
    minimum = draw(st.none() | st.integers(1, hosts))
    assume(spares or (minimum is not None and minimum < hosts))
    spec = Spec(hosts=Sourced(tuple(f"pod{n}" for n in range(1, hosts + 1)), HERE),
                instances=Sourced(hosts * per_host, HERE), replicas=Sourced(hosts * per_host * per_instance, HERE),
                spare_hosts=Sourced(tuple(f"spare{n}" for n in range(1, spares + 1)), HERE) if spares else None,
                min_hosts=Sourced(minimum, HERE) if minimum is not None else None,
                backend=Sourced(draw(st.sampled_from(["ssh", "mpirun"])), HERE),
                program=Sourced(("python3", "train.py"), HERE))
    return solve(spec, CTX, explain_cases=False).plan


def _losses(draw: st.DrawFn, plan: LaunchPlan) -> tuple[dict[str, str], list[str]]:
    hosts = plan.topology.hosts
    lost = draw(st.lists(st.sampled_from(hosts), min_size=1, max_size=len(hosts), unique=True))
    unusable = draw(st.lists(st.sampled_from(plan.membership.spares), unique=True)) if plan.membership.spares else []
    return dict.fromkeys(lost, "lost"), unusable


def _check(before: LaunchPlan, after: LaunchPlan, lost: dict[str, str], unusable: list[str],
           declared: set[str]) -> None:
    old, new = before.topology, after.topology
    assert set(new.hosts) <= declared  # never a host beyond the declared hosts and spares
    assert not set(new.hosts) & (set(lost) | set(unusable))  # never a lost or unusable host
    assert len(new.hosts) <= len(old.hosts)  # never grows
    assert len(new.hosts) >= before.membership.smallest(len(old.hosts))
    assert new.replicas_per_instance == old.replicas_per_instance
    assert new.instances_per_host == old.instances_per_host
    assert new.num_replicas == new.replicas_per_instance * new.num_instances
    assert new.num_instances == len(after.instances) == new.instances_per_host * len(new.hosts)
    assert after.instances[0].host == new.hosts[0]
    assert [h for h in old.hosts if h not in lost] == [h for h in new.hosts if h in old.hosts]  # the rest keep order
    assert not set(new.hosts) & set(after.membership.spares)  # a spare that took a place is used up
    assert set(after.membership.spares) <= set(before.membership.spares) - set(lost)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_a_replan_keeps_the_shape_and_never_reuses_a_lost_host(data: st.DataObject) -> None:
    """Spares first, then fewer hosts: each instance keeps its replicas, each host its instances; or PR310/PR311."""
    plan = data.draw(plans())
    lost, unusable = data.draw(st.composite(lambda draw: _losses(draw, plan))())
    declared = set(plan.topology.hosts) | set(plan.membership.spares)
    free = [s for s in plan.membership.spares if s not in unusable]
    left = len(plan.topology.hosts) - len(lost) + min(len(free), len(lost))
    try:
        done = replan(plan, lost, CTX, unusable=unusable)
    except DiagnosticError as exc:
        assert left < plan.membership.smallest(len(plan.topology.hosts))
        assert "PR310" == exc.diagnostics[0].code
        return
    assert len(done.plan.topology.hosts) == left
    assert done.removed == tuple(h for h in plan.topology.hosts if h in lost)
    assert done.added == tuple(free[:len(lost)])
    assert done.shrunk == (left < len(plan.topology.hosts))
    _check(plan, done.plan, lost, unusable, declared)


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_a_replan_of_a_replan_keeps_working(data: st.DataObject) -> None:
    """A re-planned plan re-plans again with the same laws, never bringing back a host lost before."""
    plan = data.draw(plans())
    declared = set(plan.topology.hosts) | set(plan.membership.spares)
    gone: set[str] = set()
    for _ in range(3):
        lost, unusable = data.draw(st.composite(lambda draw, p=plan: _losses(draw, p))())
        try:
            after = replan(plan, lost, CTX, unusable=unusable).plan
        except DiagnosticError as exc:
            assert exc.diagnostics[0].code in ("PR310", "PR311")
            return
        gone |= set(lost) | set(unusable)
        _check(plan, after, lost, unusable, declared)
        assert not set(after.topology.hosts) & gone
        assert after.membership.smallest(len(after.topology.hosts)) <= len(after.topology.hosts)
        plan = after
