"""Plans as the backend gets them, less the run's id (``POPRUN_RUN_ID``, new for every run)."""

from poprun.core.record import evolve
from poprun.planner.plan import LaunchPlan

RUN_ID = "POPRUN_RUN_ID"


def without_run_id(plan: LaunchPlan) -> LaunchPlan:
    """Return ``plan`` without ``POPRUN_RUN_ID`` in its instances' environments; every instance had the same one."""
    ids = {i.env.get(RUN_ID) for i in plan.instances}
    assert len(ids) == 1 and None not in ids, f"every instance gets one run id: {ids}"
    return evolve(plan, instances=tuple(evolve(i, env=evolve(i.env, set=tuple((k, v) for k, v in i.env.set if k != RUN_ID)))
                                        for i in plan.instances))
