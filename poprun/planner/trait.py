"""
Backend traits as data: the facts about a backend that planning and apply need, in one table.

Layer: ``poprun.planner``; imports ``poprun.core`` only (it is read on the launch path: no
``typing``, no other planner module). A trait is a fact about a backend, not a promise
(capabilities, :mod:`poprun.backends.base`, select conformance checks): whether it runs every
instance on this machine, how it reaches other hosts, whether it restarts one instance,
whether it finds a missing working directory only once started, whether its instances form
one MPI world, and whether a later attempt may run on other hosts. The built-ins' traits are rows of :data:`BUILTIN`; a plugin declares a ``traits``
class attribute (:data:`CONSERVATIVE` when it does not). The plan records the traits of its
backend beside the name (``plan.backend.traits``), so that nothing outside ``poprun/backends``
decides by a backend's name: it asks the traits, and the questions whose answer depends on more
than one trait (srun or ssh inside an allocation) are the methods below. This module is the one
place outside the backends that spells the built-ins' names.
"""

from __future__ import annotations

from poprun.core.record import record

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from collections.abc import Iterable

REACHES = ("ssh", "srun", "mpirun", "none")  # how a backend starts instances on other hosts


@record
class Traits:
    """
    What planning and apply need to know of a backend (``plan.backend.traits``).

    The defaults are the most conservative facts (:data:`CONSERVATIVE`): what a plugin that
    declares no ``traits`` is taken to be.
    """

    # Every instance runs on this machine, whatever its host (the local and offline backends).
    all_here: bool = False
    # How instances on other hosts are started: "ssh", "srun" (a Slurm step), "mpirun" (Open MPI's
    # launcher: its rsh agent, ssh, outside a Slurm allocation; srun inside one), or "none".
    reaches: str = "none"
    # One failed instance can be started again alone (--restart-scope instance).
    restarts_instance: bool = False
    # A missing working directory is found only once the instances are started, not before.
    late_cwd: bool = True
    # The instances form one MPI world (mpirun; srun with an MPI plugin), not a world each.
    mpi_world: bool = False
    # A later attempt may run on other hosts than the first (spare hosts, fewer hosts: a re-plan);
    # not the backends that run every instance on this machine, where no host can be replaced.
    replaces_hosts: bool = False

    def started_by_srun(self, *, in_allocation: bool) -> bool:
        """Return whether srun starts the instances (the slurm backend; mpirun inside an allocation)."""
        return self.reaches == "srun" or (self.reaches == "mpirun" and in_allocation)

    def reaches_with_ssh(self) -> bool:
        """Return whether the backend may start instances through ssh (ssh, and mpirun's rsh agent)."""
        return self.reaches in ("ssh", "mpirun")

    def own_ssh_sessions(self) -> bool:
        """Return whether poprun's own ssh sessions start the instances (the ssh backend; not mpirun's rsh agent)."""
        return self.reaches == "ssh"

    def follows_allocation(self) -> bool:
        """Return whether the backend starts instances through a Slurm allocation's srun when in one."""
        return self.reaches in ("srun", "mpirun")

    def srun_step(self) -> bool:
        """Return whether the instances are one srun step that srun's own MPI plugin may join (the slurm backend)."""
        return self.reaches == "srun"

    def mpirun_world(self) -> bool:
        """Return whether Open MPI's mpirun starts the instances (it is told which hosts are crowded)."""
        return self.reaches == "mpirun"


CONSERVATIVE = Traits()

BUILTIN: dict[str, Traits] = {
    "local": Traits(all_here=True, restarts_instance=True, late_cwd=False),
    "offline": Traits(all_here=True, restarts_instance=True, late_cwd=False),
    "ssh": Traits(reaches="ssh", restarts_instance=True, late_cwd=False, replaces_hosts=True),
    "mpirun": Traits(reaches="mpirun", mpi_world=True, replaces_hosts=True),
    "slurm": Traits(reaches="srun", mpi_world=True, replaces_hosts=True),
}
"""The built-in backends' traits, in the order ``--backend`` lists them."""

NAMES = tuple(BUILTIN)


def builtin_traits(name: str) -> Traits:
    """Return built-in backend ``name``'s traits; :data:`CONSERVATIVE` for any other name."""
    return BUILTIN.get(name, CONSERVATIVE)


def traits_of(backend: object) -> Traits:
    """Return a backend object's traits: its ``traits`` attribute, else its built-in row, else the conservative ones."""
    declared = getattr(backend, "traits", None)
    if isinstance(declared, Traits):
        return declared
    return builtin_traits(str(getattr(backend, "name", "")))


def reaching(how: str) -> str:
    """Return the first built-in that reaches other hosts ``how`` (one of :data:`REACHES`: ``ssh`` gives ``ssh``)."""
    return next(name for name, traits in BUILTIN.items() if traits.reaches == how)


def restarting_names(names: Iterable[str] = NAMES) -> tuple[str, ...]:
    """Return the built-ins of ``names`` that restart one instance (for a hint), in table order."""
    return tuple(n for n in names if builtin_traits(n).restarts_instance)


def all_here_reason(name: str) -> str:
    """Return why every instance of backend ``name`` (whose traits say so) runs on this machine, for explain."""
    if name == "offline":
        return "offline mode: every instance runs on this machine"
    return f"the {name} backend runs every instance on this machine"
