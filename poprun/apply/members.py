"""
The run's hosts from one attempt to the next: the membership policy applied (docs/membership.md).

Layer: ``poprun.apply``; imports ``poprun.planner.replan`` (the apply step's one door to the
solver), ``poprun.planner.context``, ``poprun.core`` and, on use, :mod:`poprun.apply.health`;
never ``poprun.planner.solve``. Made only for a plan with a membership policy.

:class:`Members` holds the plan of the current attempt. Hosts leave it when they are lost
while an attempt runs (their instances' ends say so: PR411), when they fail the backend's
preflight (the launch's :class:`~poprun.core.diagnostic.PreflightError` names them) or their
health check (before the first start and before each restart); spares that fail theirs are
never used. Each time, the planner solves the plan's spec again without them
(:func:`poprun.planner.replan.replan`): a ``replan`` event says what changed and why, and the
run record keeps the new plan as the next attempt's. When no plan is left (PR310, PR311) the
run ends with that diagnostic, and nothing more starts. A failure of the program itself
changes no host: the next attempt runs where the last one did.
"""

from __future__ import annotations

import threading

from poprun.core.diagnostic import DiagnosticError, PreflightError
from poprun.core.events import Replan
from poprun.core.record import evolve

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from poprun.backends.base import Backend
    from poprun.core.diagnostic import Diagnostic
    from poprun.core.events import Event
    from poprun.core.outcome import ApplyResult
    from poprun.planner.context import Context
    from poprun.planner.plan import LaunchPlan
    from poprun.runs.record import RunRecord

__all__ = ["LOST", "Members", "no_plan_left"]

LOST = "stopped answering (PR411)"  # why a host its launch lost is left out of the next attempt


class Members:
    """
    The hosts of the run's attempts: ``plan`` is the current attempt's (see the module docstring).

    ``changes`` lists, for each attempt that runs on other hosts than the one before, its
    number and why (``{attempt: reason}``), for the attempts' records and the report.
    """

    def __init__(self, plan: LaunchPlan, backend: Backend, environ: Mapping[str, str], *,
                 emit: Callable[[Event], None], record: RunRecord | None) -> None:
        self.plan = plan
        self.changes: dict[int, str] = {}
        self.unusable: set[str] = set()  # spares that failed their health check: never used
        self._found: dict[str, Diagnostic] = {}  # host -> what its health check found (PR445, PR446)
        self._backend, self._environ, self._emit, self._record = backend, environ, emit, record
        self._context: Context | None = None
        self._told: Replan | None = None  # the re-plan to tell as its attempt begins

    @property
    def checks(self) -> bool:
        """Whether the plan has a health check to run before each start."""
        return bool(self.plan.membership.health_check)

    # -- which hosts left --------------------------------------------------------------
    @staticmethod
    def lost_in(result: ApplyResult) -> dict[str, str]:
        """Return the hosts an attempt lost (its instances' hosts stopped answering), in the order their ends were seen."""
        lost: dict[str, str] = {}
        for failure in result.failures:
            if failure.lost:
                lost.setdefault(failure.via or failure.host, LOST)
        return lost

    def failed_preflight(self, exc: BaseException) -> dict[str, str]:
        """Return the hosts of the plan that ``exc`` (a launch's :class:`PreflightError`) says cannot run it, with why."""
        if not isinstance(exc, PreflightError) or not exc.hosts:
            return {}
        hosts = set(self.plan.topology.hosts)
        return {host: f"failed its preflight ({d.code}: {d.summary})"
                for host, d in zip(exc.hosts, exc.diagnostics, strict=False) if host in hosts}

    def unavailable(self) -> dict[str, str]:
        """Return the plan's hosts that the backend's scheduler says cannot run instances now (``HostStates``), with why."""
        ask = getattr(self._backend, "unavailable_hosts", None)
        if not callable(ask):
            return {}
        said = ask(self.plan.topology.hosts, environ=self._environ)
        return {h: str(said[h]) for h in self.plan.topology.hosts if h in said}

    def unhealthy(self, *, stop: threading.Event) -> dict[str, str]:
        """
        Run the health check on the plan's hosts and its spares not used yet; return the hosts that failed, with why.

        Spares that fail join :attr:`unusable`. Nothing when the plan has no health check. ``stop``
        (set by a stop signal) ends the checks under way; the hosts not checked then are not lost.
        """
        policy = self.plan.membership
        if not policy.health_check:
            return {}
        from poprun.apply.health import HealthChecks, check_hosts, health_problems

        spares = tuple(h for h in policy.spares if h not in self.unusable)
        checked = check_hosts(self._backend, self.plan, (*self.plan.topology.hosts, *spares), environ=self._environ,
                              emit=self._emit, stop=stop)
        failed = checked.lost()
        left = [h for h in spares if h not in failed]
        for check in checked.checks:
            if check.host in failed:
                one = HealthChecks(checks=(check,), timeout_ms=checked.timeout_ms)
                self._found[check.host] = health_problems(one, spares_left=left)[0]
        self.unusable.update(h for h in failed if h in spares)
        return {h: why for h, why in failed.items() if h in self.plan.topology.hosts}

    def diagnostics_for(self, lost: Mapping[str, str]) -> tuple[Diagnostic, ...]:
        """Return what the health checks found on the hosts of ``lost`` (those that failed one), in its order."""
        return tuple(self._found[h] for h in lost if h in self._found)

    # -- the next plan -----------------------------------------------------------------
    def replan(self, lost: Mapping[str, str], attempt: int) -> LaunchPlan:
        """
        Make the plan of attempt ``attempt`` without the hosts of ``lost`` and return it; :meth:`tell` tells it (``replan``).

        Raises:
            DiagnosticError: PR310 or PR311 (with the solver's own diagnostics): no plan is left.
        """
        from poprun.planner.replan import replan

        replanned = replan(self.plan, lost, self.context(), unusable=self.unusable)
        self.plan = replanned.plan
        topology = replanned.plan.topology
        # the same attempt re-planned again (a spare that joined failed its preflight): it still lost the hosts before
        before = self.changes.get(attempt)
        self.changes[attempt] = f"{before}; then {replanned.why}" if before else replanned.why
        self._told = Replan(attempt=attempt, removed=replanned.removed, added=replanned.added, shrunk=replanned.shrunk,
                            hosts=topology.hosts, instances=topology.num_instances, replicas=topology.num_replicas,
                            reason=replanned.why)
        return replanned.plan

    def tell(self) -> None:
        """Tell the last re-plan (``replan``), once: as its attempt begins, after the attempt before was told ended."""
        told, self._told = self._told, None
        if told is not None:
            self._emit(told)

    def context(self) -> Context:
        """Return the context a re-plan solves in: this process's, the environment the run was given, the plan's settings and user."""
        if self._context is None:
            from poprun.planner.context import Context

            # hosts' topologies are read as the plan's were: a plan whose instances are bound to CPUs was made
            # with them (a launch), one unbound without (``poprun plan``), and a re-plan must bind as it did;
            # and host names are resolved as they were: a MASTER_ADDR that is not instance 0's host name was resolved
            # (a Slurm node's address, ssh_config's HostName: a launch), and a re-plan must resolve it too
            probe = getattr(self._backend, "probe_topologies", None)
            bound = callable(probe) and any(i.placement.cpus for i in self.plan.instances)
            first = self.plan.instances[0] if self.plan.instances else None
            addressed = first is not None and first.env.get("MASTER_ADDR") not in (None, first.host)
            made = Context.from_process(probe_hosts=bound or addressed, remote_probe=probe if bound else None)
            environ = {**self._environ, **self.plan.backend.given_settings()}
            # mpirun's --allow-run-as-root as the plan has it: a saved plan applied by root (or made by it) keeps its own
            self._context = evolve(made, environ=environ, cwd=self.plan.instances[0].cwd if self.plan.instances else "/",
                                   is_root=self.plan.mpi.allow_run_as_root)
        return self._context


def no_plan_left(exc: DiagnosticError) -> str:
    """Return why no plan is left, in one line (a re-plan's PR310 or PR311)."""
    first = exc.diagnostics[0]
    return f"{first.summary} ({first.code}): {first.detail}"
