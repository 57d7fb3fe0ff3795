"""
The OpenMPI ``mpirun`` command that runs a plan, built the way real poprun built it.

Layer: ``poprun.backends`` (the mpirun backend's own); imports the plan model and
:func:`~poprun.process.instance.bound_argv`. The backend runs this command, and shows
it in ``poprun plan`` (its ``describe``). It decides nothing: hosts, instance indices,
environment, working directory and program all come from the plan.

The shape is that of real poprun's generated command (``reference/real-poprun-behaviour.md``
section 3.2, evidence A and B)::

    mpirun <--mpi-global-args> --bind-to none --tag-output [--allow-run-as-root]
           [--mca oob_tcp_if_include NET --mca btl_tcp_if_include NET] -H h1:N1,h2:N2
           -np 1 --host h1:N1 -wdir CWD -x NAME=VALUE ... -x FORWARDED ... <local args> [env -u NAME --] argv
         : -np 1 --host h1:N1 ...                                  (one app context per instance)
"""

from __future__ import annotations

from poprun.planner.plan import Instance, LaunchPlan
from poprun.process.instance import bound_argv

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from collections.abc import Container, Sequence
    from typing import Protocol

    class Wrapper(Protocol):
        """What runs each instance's program: variables to forward, and the words before the program."""

        forward: tuple[str, ...]

        def words(self, instance: Instance) -> list[str]:
            """Return the words that go before ``instance``'s program."""

BIND_NONE = ("--bind-to", "none")
TAG = "--tag-output"
YIELD = "mpi_yield_when_idle"
"""Set to 1 when a host has more instances than CPUs: what ``--oversubscribe`` does, without its other effects."""
SUBNET_PARAMETERS = ("oob_tcp_if_include", "btl_tcp_if_include")
"""The MCA parameters --host-subnet sets: the control plane, then the data plane (PopRun guide 2.2.3)."""
_MCA_FLAGS = frozenset(("--mca", "-mca", "--gmca", "-gmca"))
_SPELLINGS = {"--tag-output": ("--tag-output", "-tag-output"),
              "--allow-run-as-root": ("--allow-run-as-root", "-allow-run-as-root")}


def mpirun_command(plan: LaunchPlan, *, mpirun: str = "mpirun", environ: Container[str] | None = None,
                   wrap: Wrapper | None = None, in_allocation: bool | None = None) -> tuple[str, ...]:
    """
    Return the argv of the OpenMPI 4 ``mpirun`` command that runs ``plan``, one word per item.

    Every choice follows reference section 3.2 unless said otherwise:

    - ``mpirun``, then ``plan.mpi.global_args`` first, as given (``--mpi-global-args``).
    - ``--bind-to none``, unless the user gave ``--bind-to`` (with ``--process-placement
      disabled`` the user's ``--map-by`` and ``--bind-to`` stand, seed 2.5); an instance with a
      planned binding runs through :func:`~poprun.process.instance.bound_argv` (numactl or taskset: the role of real
      poprun's ``poprun_numa_wrapper``), so mpirun itself binds nothing.
    - ``--tag-output``, always, as real poprun did: the tags say which instance wrote each
      line of what still passes through mpirun (:mod:`poprun.backends.mpirun.mpiout`). The mpirun
      backend relays the instances' output itself (:mod:`poprun.backends.mpirun.mpirelay`), because
      OpenMPI 4.1.4's ``--tag-output`` drops part of bulk output made of very short lines
      (under about 14 bytes: ``mpirun -np 1 --tag-output seq 2000 | wc -l`` prints about
      1,300) and, untagged, interleaves the lines of two instances mid-line. A flag the global
      arguments already hold is not added again (evidence B shows real poprun repeating
      ``--tag-output``).
    - ``--allow-run-as-root`` when ``plan.mpi.allow_run_as_root``. ``--oversubscribe`` never:
      ``-H`` gives each host as many slots as it has instances, so none is oversubscribed in
      OpenMPI's eyes, and its processes busy-poll. When a host has more instances than CPUs
      (``plan.mpi.crowded_hosts``), ``--mca mpi_yield_when_idle 1`` makes them yield, as an
      oversubscribed run does (unless the global arguments set it).
    - With ``plan.mpi.host_subnet``: ``--mca oob_tcp_if_include NET --mca btl_tcp_if_include
      NET``, the control and data planes of the PopRun guide's section 2.2.3 (OpenMPI takes
      CIDR notation for both), before ``-H``. A parameter the global arguments already set is
      not set again: the user's value stands, and mpirun refuses an MCA parameter "listed
      multiple times on the command line". Without it, for a plan over several hosts, the same
      two parameters with the subnets (CIDR) of the interfaces on the route to MASTER_ADDR
      (``plan.network``: :mod:`poprun.planner.network`, read on each host at apply time), those
      that the plan's ``network.sets`` names (none the user set, include or exclude). CIDR,
      never interface names: a subnet holds on every host, names may differ, and the words reach
      the remote orted through a shell.
    - ``-H h1:N1,h2:N2``: the hosts in the order of their first instance, each with its number
      of instances as slots; left out inside a Slurm allocation (``in_allocation``; by default,
      ``SLURM_JOB_ID`` in ``environ``), where OpenMPI takes the hosts and their slots from Slurm:
      there a ``-H`` in another order than the allocation's (the plan's rank order, or hosts
      listed out of order) makes OpenMPI 4.1 refuse the contexts ("All nodes which are
      allocated for this job are already filled"), while each context's ``--host`` alone pins
      it to its host in any order.
    - One ``:``-separated app context per instance, in index order, so that MPI rank = instance
      index. Each starts ``-np 1 --host HOST:N -wdir CWD``. Real poprun placed instances by
      ``-H`` alone; the per-context ``--host`` pins each one to its planned host, and it needs
      the slot count: with a bare ``--host HOST`` OpenMPI 4.1 gives the host one slot and the
      second instance there fails with "All nodes which are allocated for this job are already
      filled". (``-H`` before the first context also belongs to that context, so the first
      instance's host must come first in it: it does.) ``-wdir`` is the instance's ``cwd``.
    - ``-x NAME=VALUE`` for each variable of ``env.set`` (sorted, as in the plan), then
      ``-x NAME`` for each of ``env.forward``: mpirun passes on its own value, read when the
      plan is applied. With ``environ`` (the launching environment), a forwarded name that it
      lacks is left out; mpirun would only warn "could not find environment variable".
      mpirun sets ``OMPI_COMM_WORLD_*`` itself after ``-x``; its values equal the plan's.
    - The instance's ``mpi_local_args`` (``--mpi-local-args`` less its ``-x`` variables), then
      the program. ``-x`` cannot remove a variable, so the variables of ``env.unset`` that
      ``env.set`` does not set are removed by running the program through ``env -u NAME ...
      --``, and only when there are any (as the local backend does: unset, then set).
    - With ``wrap`` (the mpirun backend's output relay, not shown by ``plan --explain``): each
      context also forwards the variables ``wrap.forward`` names, and its program runs through
      the words ``wrap.words(instance)`` return, outside all the rest.
    """
    words = [mpirun, *plan.mpi.global_args]
    given = set(plan.mpi.global_args)
    own_binding = not given.isdisjoint(("--bind-to", "-bind-to"))  # stands (--process-placement disabled)
    flags = [*([] if own_binding else BIND_NONE), TAG, *(["--allow-run-as-root"] if plan.mpi.allow_run_as_root else [])]
    words += [flag for flag in flags if given.isdisjoint(_SPELLINGS.get(flag, ()))]
    given_mca = _mca_names(plan.mpi.global_args)
    if plan.mpi.host_subnet is not None:
        for name in SUBNET_PARAMETERS:
            if name not in given_mca:
                words += ["--mca", name, plan.mpi.host_subnet]
    elif (subnets := plan.network.mca_value()):  # the hosts' subnets on the route to MASTER_ADDR (docs/network.md)
        for name in SUBNET_PARAMETERS:
            if name in plan.network.sets and name not in given_mca:
                words += ["--mca", name, subnets]
    if plan.mpi.crowded_hosts and YIELD not in given_mca:
        words += ["--mca", YIELD, "1"]
    slots = _slots(plan.instances)
    if not (in_allocation if in_allocation is not None else environ is not None and "SLURM_JOB_ID" in environ):
        words += ["-H", ",".join(slots.values())]
    for position, instance in enumerate(plan.instances):
        if position:
            words.append(":")
        words += app_context(instance, slots=slots[instance.host], environ=environ, wrap=wrap)
    return tuple(words)


def _mca_names(args: Sequence[str]) -> set[str]:
    """Return the names of the MCA parameters that ``args`` set (``--mca NAME VALUE``)."""
    return {args[i + 1] for i in range(len(args) - 1) if args[i] in _MCA_FLAGS}


def _slots(instances: Sequence[Instance]) -> dict[str, str]:
    """Return ``{host: "host:N"}`` with N instances on each host, in the order of each host's first instance."""
    counts: dict[str, int] = {}
    for instance in instances:
        counts[instance.host] = counts.get(instance.host, 0) + 1
    return {host: f"{host}:{n}" for host, n in counts.items()}


def app_context(instance: Instance, *, slots: str, environ: Container[str] | None = None,
                wrap: Wrapper | None = None) -> list[str]:
    """Return the words of one instance's app context (see :func:`mpirun_command`); ``slots`` is ``host:N``."""
    env = instance.env
    words = ["-np", "1", "--host", slots, "-wdir", instance.cwd]
    for name in wrap.forward if wrap is not None else ():
        words += ["-x", name]
    for name, value in env.set:
        words += ["-x", f"{name}={value}"]
    for name in env.forward:
        if environ is None or name in environ:
            words += ["-x", name]
    words += instance.mpi_local_args
    if wrap is not None:
        words += wrap.words(instance)
    set_names = {name for name, _ in env.set}
    removed = [name for name in env.unset if name not in set_names]
    if removed:
        words.append("env")
        for name in removed:
            words += ["-u", name]
        words.append("--")
    words += bound_argv(instance)
    return words


def render_mpirun_command(argv: Sequence[str]) -> str:
    """
    Return ``argv`` as one shell line, as real poprun logged it (reference section 4.1).

    ``Running command: /opt/poplar/bin/mpirun '--tag-output' '--bind-to' 'none' ...``: the
    program as it is (quoted only if the shell needs it) and every other word single-quoted,
    a quote inside written ``'"'"'`` as :func:`shlex.quote` does. Pasted into a shell, the
    line runs the same argv, even with spaces, quotes or newlines in values.
    """
    if not argv:
        return ""
    first, *rest = argv
    return " ".join([_quote_if_needed(first), *(_quote(word) for word in rest)])


def _quote(word: str) -> str:
    return "'" + word.replace("'", "'\"'\"'") + "'"


_SAFE = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789@%+=:,./-_")


def _quote_if_needed(word: str) -> str:
    return word if word and _SAFE.issuperset(word) else _quote(word)


def render_explained(plan: LaunchPlan, *, in_allocation: bool = False) -> str:
    """
    Return the ``mpirun command: ...`` line that ``poprun plan`` shows for ``plan``, secrets masked.

    Quoted as real poprun logged its ``Running command:``. Every forwarded variable is shown;
    at apply time, given the launching environment, the command leaves out those it lacks.
    ``in_allocation``: poprun runs inside a Slurm allocation (no ``-H``: see :func:`mpirun_command`).
    """
    from poprun.core.secret import is_secret

    argv = list(mpirun_command(plan, in_allocation=in_allocation))
    for i in range(1, len(argv)):
        name, equals, _ = argv[i].partition("=")
        if argv[i - 1] == "-x" and equals and is_secret(name, plan.mask):
            argv[i] = f"{name}=********"
    return f"mpirun command: {render_mpirun_command(argv)}\n"
