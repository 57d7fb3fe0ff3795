"""A poprun backend plugin that runs every instance on this machine through ``nice``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

from poprun.backends import (
    CHECKS_BEFORE_START,
    PROCESSES,
    Launch,
    OutputSink,
    Setting,
    TemporaryCache,
    Traits,
    default_registry,
)
from poprun.core.record import evolve
from poprun.planner.plan import LaunchPlan

LEVEL = "POPRUN_NICE_LEVEL"


class NiceBackend:
    """Runs each instance as ``nice -n LEVEL ARGV...``, as the local backend runs it."""

    name: ClassVar[str] = "nice"
    capabilities: ClassVar[frozenset[str]] = frozenset({PROCESSES, CHECKS_BEFORE_START})
    traits: ClassVar[Traits] = Traits(all_here=True, late_cwd=False)
    settings: ClassVar[tuple[Setting, ...]] = (
        Setting(LEVEL, "count", "0-19", "5", "nice backend", "how much lower the instances' CPU priority is",
                unit="levels"),
    )

    def describe(self, plan: LaunchPlan) -> str:
        """Say in ``poprun plan`` what runs the program."""
        return f"prefix: nice -n {plan.backend.setting(LEVEL, '5')}\n"

    def launch(self, plan: LaunchPlan, *, env_source: Mapping[str, str], sink: OutputSink,
               cache: TemporaryCache | None = None) -> Launch:
        """Start every instance of ``plan`` behind ``nice``; return at once."""
        prefix = ("nice", "-n", plan.backend.setting(LEVEL, "5"))  # the plan's, as poprun checked it
        prefixed = evolve(plan, instances=tuple(evolve(i, argv=(*prefix, *i.argv)) for i in plan.instances))
        local = default_registry().get("local")
        return local.launch(prefixed, env_source=env_source, sink=sink, cache=cache)
