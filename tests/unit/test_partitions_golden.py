"""
The PR5xx golden cases, checked through this package's API until the CLI applies plans through it.

Each case folder under tests/golden/diagnostics/PR5xx_* holds the command line, its environment
(an in-process emulated service seeded from ``pod.json``, or a closed port) and the expected text
written by hand. Here the plan is solved from that command line and applied to the partition with
``provider_for`` + ``acquire`` (or ``probe`` for ``poprun plan``), as the CLI will do, and the
rendered diagnostics must equal the expected text without its ``exit`` line (and without the
launch's own ``poprun:`` lines: the harness's working directory does not exist).
"""

import json
from pathlib import Path

import pytest

from poprun.core.diagnostic import DiagnosticError
from poprun.core.record import evolve
from poprun.partitions.actions import acquire, plan_actions, probe
from poprun.partitions.choice import provider_for
from poprun.planner.context import Context
from poprun.planner.flags import parse_flags
from poprun.planner.solve import solve
from poprun.render.diagnostics import render_diagnostics

CASES = sorted((Path(__file__).parents[1] / "golden" / "diagnostics").glob("PR5*"))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_partition_golden_case_through_the_api(case, monkeypatch):
    """acquire()/probe() on the case's plan gives exactly the hand-written expected diagnostics."""
    spec = json.loads((case / "case.json").read_text(encoding="utf-8"))
    monkeypatch.chdir(case)
    argv = list(spec["argv"])
    planning = argv[0] == "plan"
    environ = {"PATH": "/nonexistent", **spec["env"]}  # no vipu tool: the emulated provider
    ctx = evolve(Context.from_process(), environ=environ, vipu_config={}, vipu_config_file=None)
    the_plan = solve(parse_flags(argv[1:] if planning else argv, environ=environ).spec, ctx).plan
    assert the_plan.partition is not None
    if planning:
        _, diags = plan_actions(the_plan.partition, probe(the_plan.partition, environ))
    else:
        try:
            with acquire(the_plan.partition, provider_for(the_plan.partition, environ), owner="golden") as lease:
                pass
            diags = tuple(lease.warnings)
        except DiagnosticError as exc:
            diags = exc.diagnostics
    text = (case / "expected.txt").read_text(encoding="utf-8").rsplit("exit ", 1)[0]
    expected = "".join(line for line in text.splitlines(keepends=True) if not line.startswith("poprun: "))

    assert expected == render_diagnostics(diags)
