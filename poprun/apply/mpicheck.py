"""
The warning for an instance that loads MPI with no MPI launcher around it (PR425).

Layer: ``poprun.apply``; imports ``poprun.core`` and ``poprun.planner.plan``.

The local and offline backends tell :class:`~poprun.core.events.MpiWithoutLauncher` when an
instance of theirs has an MPI library loaded (:mod:`poprun.process.mpiwatch`): the
program calls MPI, yet the planner did not see it (it reaches MPI through ``importlib``, a wrapper
script or a module of its own), so each instance is an MPI world of one. It is a warning, told
once per run, on stderr as it is found, in the events and in the report, unless the user chose
the backend (``--backend local`` keeps the instances apart on purpose) or the plan already
warned PR313 (MPI seen, no ``mpirun`` to start it).
"""

from __future__ import annotations

from poprun.core.diagnostic import Diagnostic, warning
from poprun.core.events import MpiWithoutLauncher
from poprun.core.span import SourceSpan
from poprun.planner.plan import LaunchPlan


def mpi_warning(plan: LaunchPlan, event: MpiWithoutLauncher) -> Diagnostic | None:
    """Return PR425 for ``event`` in a run of ``plan``, or None when there is nothing to tell (see the module docstring)."""
    if plan.backend.reason == "as given" or any(note.code == "PR313" for note in plan.warnings):
        return None
    if not 0 <= event.index < len(plan.instances):
        return None
    host = plan.instances[event.index].host
    count = len(plan.instances)
    return warning(
        "PR425", "an instance loads MPI, but no MPI launcher started it",
        detail=f"instance {event.index} on {host} has {event.library} loaded, and the {plan.backend.name} backend "
               f"starts no MPI launcher: each of the {count} instances is an MPI world of 1, not one world of {count}",
        span=SourceSpan.derived("backend"),
        hint="run it with --backend mpirun (poprun did not see MPI in the program: it reaches MPI through importlib, "
             "a wrapper script or a module of its own), or --backend local to keep the instances apart on purpose")
