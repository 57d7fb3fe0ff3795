"""
Running a plan: the apply step of the CLI.

Layer: ``poprun.cli``.
"""

from __future__ import annotations

import sys

from poprun.cli import exitcode
from poprun.planner.plan import LaunchPlan


def run_plan(plan: LaunchPlan) -> int:
    """Run ``plan`` with its backend; return poprun's exit status."""
    sys.stderr.write("poprun: running plans is not available yet\n")
    return exitcode.LAUNCH
