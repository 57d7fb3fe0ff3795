"""Laws of solving: replicas placed once, even division, local indices, determinism, the popdist contract."""

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

import popdist
from poprun.core.diagnostic import DiagnosticError
from poprun.planner.context import Context
from poprun.planner.flags import parse_flags
from poprun.planner.serde import from_json, to_json
from poprun.planner.solve import solve

CTX = Context(environ={"PATH": "/bin"}, cwd="/w")


@st.composite
def feasible_argv(draw: st.DrawFn) -> list[str]:
    """Command lines whose numbers divide evenly (hosts, instances per host, ILDs, replicas per instance)."""
    hosts = draw(st.integers(1, 6))
    per_host = draw(st.integers(1, 4))
    instances = hosts * per_host
    ilds = draw(st.sampled_from([d for d in range(1, instances + 1) if instances % d == 0]))
    per_instance = draw(st.integers(1, 4))
    ipus = draw(st.sampled_from([1, 2, 4]))
    argv = [f"--num-replicas={instances * per_instance}", f"--ipus-per-replica={ipus}",
            f"--num-instances={instances}", f"--host=pod[1-{hosts}]"]
    if instances * per_instance * ipus <= 64 * ilds:
        argv.append(f"--num-ilds={ilds}")
    return [*argv, "python3", "train.py"]


@given(feasible_argv())
def test_every_replica_belongs_to_exactly_one_instance(argv):
    """Replica offsets and counts partition [0, replicas)."""
    plan = solve(parse_flags(argv).spec, CTX).plan
    owned = [r for i in plan.instances for r in range(i.replica_offset, i.replica_offset + i.num_local_replicas)]

    assert list(range(plan.topology.num_replicas)) == sorted(owned)


@given(feasible_argv())
def test_instances_per_host_and_per_ild_are_equal(argv):
    """Every host and every ILD holds the same number of instances."""
    plan = solve(parse_flags(argv).spec, CTX).plan

    assert 1 == len(set(Counter(i.host for i in plan.instances).values()))
    assert 1 == len(set(Counter(i.ild for i in plan.instances).values()))
    assert len(plan.topology.hosts) == len({i.host for i in plan.instances})


@given(feasible_argv())
def test_local_indices_count_from_zero_on_every_host(argv):
    """Local instance indices are 0..k-1 on every host, and instance indices 0..n-1."""
    plan = solve(parse_flags(argv).spec, CTX).plan
    by_host: dict[str, list[int]] = {}
    for instance in plan.instances:
        by_host.setdefault(instance.host, []).append(instance.local_index)

    assert list(range(plan.topology.num_instances)) == [i.index for i in plan.instances]
    assert all(indices == list(range(len(indices))) for indices in by_host.values())


@given(feasible_argv())
def test_popdist_reads_back_what_the_plan_says(argv):
    """Each instance's environment, read by popdist, agrees with the plan's instance."""
    plan = solve(parse_flags(argv).spec, CTX).plan
    for instance in plan.instances:
        config = popdist.from_environ(instance.env.as_dict())

        assert (True, plan.topology.num_replicas, plan.topology.ipus_per_replica) == (
            config.is_set, config.num_total_replicas, config.num_ipus_per_replica)
        assert (instance.num_local_replicas, instance.replica_offset, instance.local_index) == (
            config.num_local_replicas, config.replica_index_offset, config.local_instance_index)
        assert (instance.index, plan.topology.num_instances) == (config.instance_index, config.num_instances)


@given(feasible_argv())
def test_solving_is_deterministic_and_json_round_trips(argv):
    """The same input gives an equal plan and the same JSON bytes, and the JSON reads back equal."""
    first = solve(parse_flags(argv).spec, CTX).plan
    second = solve(parse_flags(argv).spec, CTX).plan

    assert first == second
    assert to_json(first) == to_json(second)
    assert first == from_json(to_json(first))


@given(st.integers(1, 64), st.integers(1, 16), st.integers(1, 8))
def test_infeasible_numbers_give_feasible_alternatives(replicas, instances, hosts):
    """Any numbers either plan or fail with hints whose suggestions plan."""
    argv = [f"--num-replicas={replicas}", f"--num-instances={instances}", f"--host=h[1-{hosts}]", "prog"]
    try:
        solve(parse_flags(argv).spec, CTX)
    except DiagnosticError as exc:
        diag = exc.diagnostics[0]

        assert diag.code in ("PR300", "PR301", "PR302", "PR303")
        assert diag.hint.startswith("use ") or diag.hint.startswith("change")


@given(st.lists(st.text(max_size=12), max_size=6))
def test_arbitrary_words_give_a_plan_or_a_diagnostic(argv):
    """Any argv yields a plan or a DiagnosticError, never another exception."""
    try:
        solve(parse_flags(argv).spec, CTX, require_program=False)
    except DiagnosticError as exc:
        assert exc.diagnostics


@given(st.lists(st.sampled_from(["--num-replicas", "--num-instances", "--host", "-H", "--num-ilds", "=", "4", "0",
                                 "a,", "b", "pod[1-2", "--mpi-local-args", "-x", "'", "--vv", "-v", "--num",
                                 "--offline-mode", "yes", "--instance-mpi-local-args", "0:-x A=b", "--"]),
                max_size=8))
def test_option_soup_gives_a_plan_or_a_diagnostic(argv):
    """Option-like words in any order yield a plan or a DiagnosticError."""
    try:
        solve(parse_flags(argv).spec, CTX, require_program=False)
    except DiagnosticError as exc:
        assert exc.diagnostics
