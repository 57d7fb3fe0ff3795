"""
The apply step with a membership policy, under hostile turns of events (docs/membership.md).

Hosts lost two at once, one after another across attempts (spares used up, then shrinking), a
spare that is down when it joins, instance 0's host lost, an edited saved plan: each attempt's
hosts, environment, ``replan`` event and record must say exactly what happened. The scripted
backend of :mod:`test_apply_membership` stands in for ssh.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from poprun.backends.base import RESTARTS_INSTANCES, ApplyResult
from poprun.core import events
from poprun.core.record import evolve
from poprun.planner.plan import LaunchPlan
from tests.unit.test_apply_membership import Scripted, fail_preflight, hosts_of, lose, planned, run, succeed

pytestmark = pytest.mark.timeout(60)


class Restarting(Scripted):
    """The scripted ssh backend, declaring (as ssh does) that it restarts one instance alone."""

    capabilities = frozenset({RESTARTS_INSTANCES})


def test_two_hosts_lost_at_once_one_spare_replaces_the_first_and_the_plan_shrinks_by_the_other(tmp_path: Path) -> None:
    """h2 and h3 lost in attempt 0, one spare, --min-hosts 3: h5 takes h2's place, h3's goes; WORLD_SIZE 3."""
    def lose_two(plan: LaunchPlan) -> ApplyResult:
        ended = lose("h2")(plan)
        failures = tuple(evolve(f, lost=f.host in ("h2", "h3"), stopped=f.host not in ("h2", "h3"))
                         for f in ended.failures)
        return evolve(ended, failures=failures)

    plan = planned("--host", "h1,h2,h3,h4", "--spare-host", "h5", "--min-hosts", "3", "--max-restarts", "1",
                   "--restart-backoff", "0")
    backend = Scripted(lose_two, succeed)
    result, sink, _ = run(plan, backend, tmp_path)

    assert result.error is None, result.error
    assert ["h1", "h5", "h4"] == hosts_of(backend.plans[1])
    assert {"3"} == {i.env.get("WORLD_SIZE") for i in backend.plans[1].instances}
    (replan,) = sink.of(events.Replan)
    assert (("h2", "h3"), ("h5",), True) == (replan.removed, replan.added, replan.shrunk)  # type: ignore[attr-defined]
    assert replan.reason.startswith("h5 replaces h2; h3 left out: 4 -> 3 hosts")  # type: ignore[attr-defined]


def test_hosts_lost_one_after_another_use_up_the_spares_then_shrink_then_end_with_pr310(tmp_path: Path) -> None:
    """h2 lost (h5 joins), then h5 lost (no spare: 3 hosts), then h4 lost (below --min-hosts 3): PR310, nothing more starts."""
    plan = planned("--host", "h1,h2,h3,h4", "--spare-host", "h5", "--min-hosts", "3", "--max-restarts", "5",
                   "--restart-backoff", "0", "--crash-loop", "9")  # each loss is quick here: not a crash loop
    backend = Scripted(lose("h2"), lose("h5"), lose("h4"), succeed)
    result, sink, _ = run(plan, backend, tmp_path)

    assert [["h1", "h2", "h3", "h4"], ["h1", "h5", "h3", "h4"], ["h1", "h3", "h4"]] == [hosts_of(p) for p in backend.plans]
    assert result.error is not None and 125 == result.error.status
    assert ["PR310"] == [d.code for d in result.error.diagnostics], result.error
    assert [(("h2",), ("h5",)), (("h5",), ())] == [(e.removed, e.added) for e in sink.of(events.Replan)]  # type: ignore[attr-defined]
    assert [("h1", "h2", "h3", "h4"), ("h1", "h5", "h3", "h4"), ("h1", "h3", "h4")] == [a.hosts for a in result.attempts]
    assert "not restarted" in result.attempts[-1].next and "PR310" in result.attempts[-1].next


def test_losing_instance_0s_host_moves_master_addr_to_the_new_first_host(tmp_path: Path) -> None:
    """h1 (instance 0's) lost, spare h3: every instance of attempt 1 has MASTER_ADDR h3, RANK 0 is on h3."""
    plan = planned("--host", "h1,h2", "--spare-host", "h3", "--max-restarts", "1", "--restart-backoff", "0")
    backend = Scripted(lose("h1"), succeed)
    result, _, _ = run(plan, backend, tmp_path)

    assert result.error is None, result.error
    second = backend.plans[1]
    assert [("h3", "0"), ("h2", "1")] == [(i.host, i.env.get("RANK")) for i in second.instances]
    assert {"h3"} == {i.env.get("MASTER_ADDR") for i in second.instances}


def test_a_spare_down_when_it_joins_the_attempt_says_every_host_it_lost(tmp_path: Path) -> None:
    """
    h3 lost, then spare h4's preflight fails as it joins: attempt 1 runs on h1, h2 (--min-hosts 2).

    Attempt 1's record and report must still name h3 (the host attempt 0 lost), not only h4 (a
    spare that never ran anything): the reader compares attempt 1 with attempt 0.
    """
    plan = planned("--host", "h1,h2,h3", "--spare-host", "h4", "--min-hosts", "2", "--max-restarts", "1",
                   "--restart-backoff", "0")
    backend = Scripted(lose("h3"), fail_preflight("h4"), succeed)
    result, sink, record = run(plan, backend, tmp_path)

    assert result.error is None, result.error
    assert [["h1", "h2", "h3"], ["h1", "h2", "h4"], ["h1", "h2"]] == [hosts_of(p) for p in backend.plans]
    assert ("h1", "h2") == result.attempts[1].hosts
    assert "h3" in result.attempts[1].replan and "h4" in result.attempts[1].replan, result.attempts[1].replan
    reasons = [e.reason for e in sink.of(events.Replan)]  # type: ignore[attr-defined]
    assert any("h3" in r for r in reasons), reasons
    kept = json.loads(Path(record.path, "attempts", "1", "plan.json").read_text())
    assert ["h1", "h2"] == kept["topology"]["hosts"]


@pytest.mark.parametrize(("section", "added"), [
    ("[membership]\n", 'health_check = "touch /tmp/poprun-pwned"\n'),
    ("[run]\n", "mpi_global_args_placeholder\n"),
    ("[recovery]\n", 'pre_restart = "touch /tmp/poprun-pwned"\n'),
    ("[recovery]\n", "max_restarts = 100\n"),
])
def test_a_kept_spec_edited_to_change_the_plans_settings_is_refused(tmp_path: Path, section: str, added: str) -> None:
    """
    A saved plan whose membership.spec adds a health check, mpirun options or a pre-restart command the plan lacks.

    The re-planned attempt would run with settings no reviewer of the plan saw: PR312, and
    nothing more starts (the edited spec's settings never reach a launch).
    """
    plan = planned("--host", "h1,h2", "--spare-host", "h3", "--max-restarts", "1", "--restart-backoff", "0")
    spec = plan.membership.spec
    if added == "mpi_global_args_placeholder\n":
        section, added = "[run]\n", '[mpi]\nglobal_args = "--mca plm_rsh_agent evil"\n\n'
        edited = spec.replace(section, added + section)
    else:
        assert section in spec
        key = added.split(" = ")[0] + " = "
        lines = [ln for ln in spec.splitlines(keepends=True) if not ln.startswith(key)]
        edited = "".join(lines).replace(section, section + added)
    assert edited != spec
    tampered = evolve(plan, membership=evolve(plan.membership, spec=edited))
    backend = Scripted(lose("h2"), succeed)
    result, sink, _ = run(tampered, backend, tmp_path)

    assert (1, []) == (len(backend.plans), sink.of(events.Replan))
    assert result.error is not None and ["PR312"] == [d.code for d in result.error.diagnostics], result.error


@pytest.mark.parametrize("spec", ["[[[ not toml", '[topology]\nhosts = "h1\x00"\n'])
def test_a_kept_spec_that_is_not_toml_ends_the_run_with_one_coded_diagnostic(tmp_path: Path, spec: str) -> None:
    """A saved plan whose membership.spec is not TOML (or holds a NUL): a coded diagnostic, status 125, no traceback."""
    plan = planned("--host", "h1,h2", "--spare-host", "h3", "--max-restarts", "1", "--restart-backoff", "0")
    backend = Scripted(lose("h2"), succeed)
    result, sink, _ = run(evolve(plan, membership=evolve(plan.membership, spec=spec)), backend, tmp_path)

    assert (1, []) == (len(backend.plans), sink.of(events.Replan))
    assert result.error is not None and 125 == result.error.status
    assert ["PR100"] == [d.code for d in result.error.diagnostics], result.error


def test_restart_scope_instance_with_spares_is_explained_and_a_host_lost_while_running_ends_the_run(tmp_path: Path) -> None:
    """
    --restart-scope instance restarts an instance where it ran: a host lost mid-run ends the run, the spare unused.

    The plan says so before anything runs (``membership.case.running``), rather than promising a spare.
    """
    plan = planned("--host", "h1,h2", "--spare-host", "h3", "--max-restarts", "2", "--restart-backoff", "0",
                   "--restart-scope", "instance")
    (said,) = [d for d in plan.explanation if d.key == "membership.case.running"]
    assert "a host lost while the run runs ends it (PR411)" in said.reason
    backend = Restarting(lose("h2"), succeed)
    result, sink, _ = run(plan, backend, tmp_path)

    assert (1, []) == (len(backend.plans), sink.of(events.Replan))
    assert result.attempts[-1].next == "not restarted: its host stopped answering"


def test_restart_scope_instance_still_replaces_a_host_that_fails_its_preflight(tmp_path: Path) -> None:
    """What ``membership.case.running`` keeps: a host that fails the preflight before the start is replaced."""
    plan = planned("--host", "h1,h2", "--spare-host", "h3", "--max-restarts", "2", "--restart-backoff", "0",
                   "--restart-scope", "instance")
    backend = Restarting(fail_preflight("h2"), succeed)
    result, _, _ = run(plan, backend, tmp_path)

    assert ([["h1", "h2"], ["h1", "h3"]], None) == ([hosts_of(p) for p in backend.plans], result.error)


def test_without_instance_scope_the_plan_promises_no_such_case() -> None:
    plan = planned("--host", "h1,h2", "--spare-host", "h3", "--max-restarts", "2")
    assert not [d for d in plan.explanation if d.key == "membership.case.running"]


def test_an_attempt_whose_spare_fails_its_preflight_is_told_again_with_the_same_number(tmp_path: Path) -> None:
    """The events of docs/runs.md: attempt 1 re-planned, its preflight fails on the spare, re-planned and begun again."""
    plan = planned("--host", "h1,h2,h3", "--spare-host", "h4", "--min-hosts", "2", "--max-restarts", "1",
                   "--restart-backoff", "0")
    _, sink, _ = run(plan, Scripted(lose("h3"), fail_preflight("h4"), succeed), tmp_path)

    told = [(type(e).__name__, e.attempt) for e in sink.events  # type: ignore[attr-defined]
            if isinstance(e, events.AttemptEnded | events.Replan | events.AttemptStarted)]
    assert [("AttemptStarted", 0), ("AttemptEnded", 0), ("Replan", 1), ("AttemptStarted", 1), ("Replan", 1),
            ("AttemptStarted", 1), ("AttemptEnded", 1)] == told


def test_a_lost_host_that_is_no_host_of_the_plan_ends_the_run_with_pr411_not_a_traceback(tmp_path: Path) -> None:
    """
    mpirun names a lost host by an address no host of the plan matches: nothing to leave out, so PR411 ends the run.

    Before, the re-plan raised ValueError ("needs a host of the plan to leave out") out of apply().
    """
    from poprun.core.diagnostic import HostLostError, error
    from poprun.core.span import SourceSpan

    lost = HostLostError([error("PR411", "host 10.9.9.9 stopped answering", detail="gone",
                                span=SourceSpan.environment("host 10.9.9.9"), hint="check it")], hosts=["10.9.9.9"])
    plan = planned("--host", "h1,h2", "--spare-host", "h3", "--max-restarts", "1", "--restart-backoff", "0")
    backend = Scripted(lambda _: lost, succeed)
    result, sink, _ = run(plan, backend, tmp_path)

    assert (1, []) == (len(backend.plans), sink.of(events.Replan))
    assert result.error is not None and (125, ["PR411"]) == (result.error.status,
                                                              [d.code for d in result.error.diagnostics])


def test_a_lost_host_of_a_plan_bound_to_many_cpus_is_replaced_not_refused_as_edited(tmp_path: Path) -> None:
    """
    Four instances on two 80-CPU hosts (spreadnuma: 20 threads each), h2 lost: attempt 1 runs on h1 and the spare.

    The kept-spec check (PR312) solved the spec again on the plan's own hosts, probing the lost h2
    too: its CPUs unknown, every instance's OMP_NUM_THREADS came out 1, not 20, and a plan
    poprun itself made was refused as edited. The lost host is never probed again either.
    """
    from poprun.planner.context import Context
    from poprun.planner.flags import parse_flags
    from poprun.planner.machine import load
    from poprun.planner.solve import solve

    topology = load("xeon-2s-2numa")
    probed: list[tuple[str, ...]] = []

    class Probing(Scripted):
        def probe_topologies(self, hosts: tuple[str, ...], *, environ: object) -> dict[str, object]:  # noqa: ARG002
            probed.append(tuple(hosts))
            return {h: "no route to host" if h == "h2" else topology for h in hosts}

    command = parse_flags(["--host", "h1,h2", "--spare-host", "h3", "--num-instances", "4", "--num-replicas", "4",
                           "--max-restarts", "1", "--restart-backoff", "0", "--backend", "ssh", "--offline-mode=1",
                           "sh", "-c", "true"], environ={})
    plan = solve(command.spec, Context(environ={}, cwd="/work", remote_probe=lambda hosts: dict.fromkeys(hosts, topology))).plan
    assert {"20"} == {i.env.get("OMP_NUM_THREADS") for i in plan.instances}
    backend = Probing(lose("h2"), succeed)
    result, _, _ = run(plan, backend, tmp_path)

    assert result.error is None, result.error
    assert ["h1", "h1", "h3", "h3"] == hosts_of(backend.plans[1])
    assert {"20"} == {i.env.get("OMP_NUM_THREADS") for i in backend.plans[1].instances}
    assert not [hosts for hosts in probed if "h2" in hosts], probed


@pytest.mark.parametrize("as_root", [False, True])
def test_a_replanned_attempt_keeps_the_plans_allow_run_as_root_whoever_applies_it(tmp_path: Path, as_root: bool) -> None:
    """
    A plan made by one user and applied by another (root): the re-planned attempt keeps mpirun's --allow-run-as-root.

    Before, the re-plan read it from the applying process, and ``plan --diff`` between the
    attempts showed ``mpi.allow_run_as_root: no -> yes``, a change no host loss explains.
    """
    from poprun.planner.context import Context
    from poprun.planner.flags import parse_flags
    from poprun.planner.solve import solve

    command = parse_flags(["--host", "h1,h2", "--spare-host", "h3", "--num-replicas", "2", "--max-restarts", "1",
                           "--restart-backoff", "0", "--backend", "ssh", "--offline-mode=1", "sh", "-c", "true"],
                          environ={})
    plan = solve(command.spec, Context(environ={}, cwd="/work", is_root=as_root)).plan
    backend = Scripted(lose("h2"), succeed)
    result, _, _ = run(plan, backend, tmp_path)

    assert result.error is None, result.error
    assert [as_root, as_root] == [p.mpi.allow_run_as_root for p in backend.plans]
