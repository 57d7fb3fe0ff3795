"""
The Slurm allocation poprun runs in, read from the variables Slurm sets (``salloc``, ``sbatch``).

Layer: ``poprun.planner``; imports ``poprun.core``. Imported only when ``SLURM_JOB_ID`` is
set (by :mod:`poprun.planner.solve` and the slurm backend), so that a launch outside an
allocation never loads it.

Inside an allocation, the hosts default to its nodes (``SLURM_JOB_NODELIST``, in Slurm's
hostlist syntax), and the instances to its tasks when the allocation asked for tasks
(``SLURM_NTASKS``: ``salloc -n`` or ``--ntasks-per-node``), else one per node. Tasks and CPUs per
node (``SLURM_TASKS_PER_NODE``, ``SLURM_JOB_CPUS_PER_NODE``, in Slurm's ``2(x3),1`` form) are
read for the explanation. (The batch script of ``poprun submit`` is the slurm backend's:
:mod:`poprun.backends.slurm.batch`.)
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from poprun.core.hostlist import HostlistError, expand
from poprun.core.record import record

JOB_ID = "SLURM_JOB_ID"
NODELIST = "SLURM_JOB_NODELIST"
NTASKS = "SLURM_NTASKS"
TASKS_PER_NODE = "SLURM_TASKS_PER_NODE"
CPUS_PER_NODE = "SLURM_JOB_CPUS_PER_NODE"
_COUNT = re.compile(r"(\d+)(?:\(x(\d+)\))?")


@record
class Allocation:
    """
    A Slurm allocation: its job id, its nodes in Slurm's order, and tasks and CPUs on each.

    ``tasks_per_node`` and ``cpus_per_node`` have one item per node, or are empty when Slurm
    did not say (or said something unreadable). ``num_tasks`` is None unless the allocation
    asked for a number of tasks.
    """

    job_id: str
    nodelist: str  # as Slurm wrote it: "h[1-3]"
    nodes: tuple[str, ...]
    tasks_per_node: tuple[int, ...] = ()
    cpus_per_node: tuple[int, ...] = ()
    num_tasks: int | None = None

    def describe(self) -> str:
        """Return the allocation in words: ``Slurm job 12 (h[1-3]: 2 tasks and 2 CPUs per node)``."""
        parts = [f"{_per_node(self.tasks_per_node, 'task')}", f"{_per_node(self.cpus_per_node, 'CPU')}"]
        shown = " and ".join(p for p in parts if p)
        return f"Slurm job {self.job_id} ({self.nodelist}{': ' + shown + ' per node' if shown else ''})"


def from_environ(environ: Mapping[str, str]) -> Allocation | None:
    """
    Return the allocation ``environ`` is in, or None outside one (or with an unreadable node list).

    Returns None unless both ``SLURM_JOB_ID`` and ``SLURM_JOB_NODELIST`` are set.
    """
    job_id, nodelist = environ.get(JOB_ID, ""), environ.get(NODELIST, "")
    if not job_id or not nodelist:
        return None
    try:
        nodes = expand(nodelist)
    except HostlistError:
        return None
    tasks = expand_counts(environ.get(TASKS_PER_NODE, ""))
    cpus = expand_counts(environ.get(CPUS_PER_NODE, ""))
    ntasks = environ.get(NTASKS, "")
    return Allocation(job_id=job_id, nodelist=nodelist, nodes=nodes,
                      tasks_per_node=tasks if len(tasks) == len(nodes) else (),
                      cpus_per_node=cpus if len(cpus) == len(nodes) else (),
                      num_tasks=int(ntasks) if ntasks.isdigit() and int(ntasks) > 0 else None)


def expand_counts(text: str) -> tuple[int, ...]:
    """Return Slurm's ``2(x3),1`` as ``(2, 2, 2, 1)``; ``()`` for empty or unreadable text."""
    counts: list[int] = []
    for item in text.split(",") if text else ():
        found = _COUNT.fullmatch(item.strip())
        if found is None:
            return ()
        counts += [int(found[1])] * int(found[2] or 1)
    return tuple(counts)


def _per_node(counts: tuple[int, ...], noun: str) -> str:
    """Return ``2 tasks`` when every node has 2, ``2,2,1 tasks`` otherwise, ``""`` when unknown."""
    if not counts:
        return ""
    same = len(set(counts)) == 1
    number = str(counts[0]) if same else ",".join(map(str, counts))
    return f"{number} {noun}{'' if same and counts[0] == 1 else 's'}"
