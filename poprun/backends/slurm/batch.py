"""
The ``sbatch`` script of ``poprun submit`` and ``poprun plan --format sbatch``: an allocation shaped for a plan.

Layer: ``poprun.backends`` (the slurm backend's own); imports the plan model and, for a working
directory no ``#SBATCH`` line can hold, ``poprun.core``'s diagnostics; nothing of the standard
library (``shlex`` is not needed for one quoting rule).
"""

from __future__ import annotations

from poprun.planner.plan import LaunchPlan

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from collections.abc import Sequence


def render_batch_script(plan: LaunchPlan, *, command: Sequence[str], nodelist: Sequence[str] = (),
                        job_name: str = "poprun") -> str:
    """
    Return the ``sbatch`` script that runs ``command`` (a poprun command line) in an allocation shaped for ``plan``.

    The allocation has the plan's hosts as nodes (``--nodelist`` when the user named them) and
    its instances per host as tasks per node, so that poprun, inside it, takes the nodes as its
    hosts and the tasks as its instances (:func:`poprun.planner.slurm.from_environ`), and solves
    the same plan. The script runs in the plan's working directory.
    """
    topology = plan.topology
    cwd = plan.instances[0].cwd if plan.instances else "."
    if not cwd.isprintable():  # a newline would end the #SBATCH line: the rest, directives and commands
        raise _unwritable(cwd)
    lines = ["#!/bin/sh", f"#SBATCH --job-name={job_name}", f"#SBATCH --nodes={len(topology.hosts)}",
             f"#SBATCH --ntasks-per-node={topology.instances_per_host}", f"#SBATCH --chdir={cwd}"]
    if nodelist:
        lines.append(f"#SBATCH --nodelist={','.join(nodelist)}")
    lines += [(f"# Written by poprun {plan.poprun_version} submit: {topology.num_instances} instances, "
               f"{topology.instances_per_host} per node on {len(topology.hosts)} nodes."),
              "# Inside the allocation poprun takes its nodes as the hosts and starts the instances with srun.",
              "exec " + " ".join(_quote(word) for word in command)]
    return "\n".join(lines) + "\n"


def _unwritable(cwd: str) -> Exception:
    from poprun.core.diagnostic import DiagnosticError, error
    from poprun.core.span import SourceSpan

    return DiagnosticError([error(
        "PR119", "the sbatch view cannot hold this working directory",
        detail=f"the working directory {cwd!r} holds a control character; '#SBATCH --chdir=' ends at a newline, "
               "so the rest of the name would be read as directives and commands",
        span=SourceSpan.environment("the working directory"),
        hint="run from a directory whose path has no newline or control character")])


def _quote(word: str) -> str:
    """Return ``word`` quoted for sh, as :func:`shlex.quote` would (without importing shlex at start-up)."""
    if word and all(c.isalnum() or c in "@%+=:,./-_" for c in word):
        return word
    return "'" + word.replace("'", "'\"'\"'") + "'"
