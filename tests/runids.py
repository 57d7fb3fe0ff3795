"""Plans as the backend gets them, less what the apply step adds to every run (its id, restart count, chosen port)."""

from poprun.core.record import evolve
from poprun.planner.plan import LaunchPlan

RUN_ID = "POPRUN_RUN_ID"
PER_RUN = (RUN_ID, "TORCHELASTIC_RUN_ID", "POPRUN_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_ERROR_FILE",
           "POPRUN_PROGRESS", "POPRUN_PROGRESS_TOKEN")


def without_run_id(plan: LaunchPlan) -> LaunchPlan:
    """
    Return ``plan`` without the variables the apply step sets for each run, as the plan was before it.

    Those are the run's id (``POPRUN_RUN_ID``, ``TORCHELASTIC_RUN_ID``: every instance the same), each instance's
    torch error file (``TORCHELASTIC_ERROR_FILE``, on this machine), the
    restart count, the progress channel's address and token, and MASTER_PORT when the plan leaves it to the apply step.
    """
    ids = {i.env.get(RUN_ID) for i in plan.instances}
    assert len(ids) == 1 and None not in ids, f"every instance gets one run id: {ids}"
    drop = PER_RUN + (("MASTER_PORT",) if plan.recovery.choose_port else ())
    return evolve(plan, instances=tuple(evolve(i, env=evolve(i.env, set=tuple((k, v) for k, v in i.env.set if k not in drop)))
                                        for i in plan.instances))
