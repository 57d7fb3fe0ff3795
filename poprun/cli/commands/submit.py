"""
``poprun submit``: run a launch as a Slurm batch job.

Layer: ``poprun.cli``.
"""

from __future__ import annotations

import sys

from poprun.cli import exitcode
from poprun.cli.commands.common import outside_slurm, read_command, reject_plan_options, show_help, solve_spec
from poprun.cli.session import Session
from poprun.cli.views import backend_format
from poprun.core.diagnostic import DiagnosticError, error
from poprun.core.record import evolve
from poprun.core.span import SourceSpan
from poprun.planner.context import Context
from poprun.planner.spec import Sourced


def submit(args: list[str], session: Session) -> int:
    """
    ``poprun submit [--dry-run] [--wait] [--nodes N] [SPEC] [options] PROGRAM [ARGS...]``: run it as a Slurm batch job.

    Writes a batch script whose allocation fits the plan (its hosts as nodes, or ``--nodes N``;
    its instances per host as tasks per node) and that runs the same poprun command inside it,
    and submits it with ``sbatch`` (``--dry-run`` prints the script instead; ``--wait`` waits for
    the job and exits with its status). Submit's own options come first.
    """
    dry_run, wait, nodes, rest = _submit_options(list(args))
    ctx = outside_slurm(Context.from_process())
    command, spec = read_command(session, list(rest), ctx, prog="poprun submit", allow_spec_file=True)
    reject_plan_options(command, "'poprun submit'")
    if command.help:
        return show_help()
    named = spec.hosts.value if spec.hosts is not None else ()
    if nodes is not None and spec.hosts is None and spec.host_file is None:
        spec = evolve(spec, hosts=Sourced(tuple(f"node{i}" for i in range(1, nodes.value + 1)), nodes.origin))
    plan = solve_spec(session, spec, ctx, require_program=True).plan
    from poprun.backends.registry import OnDemand

    with OnDemand() as registry:  # the command's backend registry, closed once the script is written
        script = backend_format("sbatch", plan, command=(sys.executable, "-m", "poprun.cli.main", *rest), hosts=named,
                                registry=registry)
    if dry_run:
        sys.stdout.write(script)
        return exitcode.OK
    return _sbatch(script, wait=wait)


def _submit_options(args: list[str]) -> tuple[bool, bool, Sourced[int] | None, list[str]]:
    """
    Return ``--dry-run``, ``--wait`` and ``--nodes N`` from the front of ``args`` (the command table's rows), and the rest.

    Diagnostics:
        PR104 (``--nodes`` without its value), PR112 (a value for ``--dry-run`` or ``--wait``),
        PR200 (``--nodes`` not a positive number).
    """
    from poprun.cli.commands import read_arguments

    given = read_arguments("submit", args, leading=True)
    nodes: Sourced[int] | None = None
    for name, value in given.options:
        if name != "nodes":
            continue
        if not value.isdigit() or int(value) < 1:
            raise DiagnosticError([error("PR200", "value must be a positive integer",
                                         detail=f"--nodes takes a number of nodes, not '{value}'",
                                         span=SourceSpan.flag("--nodes"), hint="write e.g. --nodes 4")])
        nodes = Sourced(int(value), SourceSpan.flag("--nodes"))
    help_ = ["--help"] if given.help else []  # the launch's help, as when it stood after submit's options
    return given.has("dry_run"), given.has("wait"), nodes, [*help_, *given.rest]


def _sbatch(script: str, *, wait: bool) -> int:
    """Submit ``script`` with ``sbatch`` (on its standard input); return 0, or the job's status with ``wait``."""
    import shutil
    import subprocess

    sbatch = shutil.which("sbatch")
    if sbatch is None:
        sys.stderr.write("poprun: sbatch not found on PATH: 'poprun submit' needs Slurm's client commands\n")
        return exitcode.NOT_FOUND
    proc = subprocess.Popen([sbatch, "--parsable", *(["--wait"] if wait else [])], stdin=subprocess.PIPE,  # noqa: S603
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdin is not None
    assert proc.stdout is not None
    proc.stdin.write(script)
    proc.stdin.close()
    job = proc.stdout.readline().strip().split(";")[0]
    if job:
        sys.stdout.write(f"poprun: submitted batch job {job} (its output: slurm-{job}.out)\n")
        sys.stdout.flush()
    status = proc.wait()
    if not job:
        return exitcode.LAUNCH
    return status
