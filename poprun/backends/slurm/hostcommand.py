"""
A short command on a node of the allocation (``SlurmBackend.run_on_host``): a one-task step of its own.

Layer: ``poprun.backends``; imports :mod:`poprun.backends._process` and :mod:`poprun.backends.base`.

``srun --overlap --nodes=1 --ntasks=1 --nodelist=HOST`` runs ``sh -s`` on the node, beside
the launch's step (``--overlap``: it takes no CPU from the instances, and does not wait for
them), with the script on its standard input; bounded here (srun's group is killed) and
there (:func:`~poprun.backends._process.hostscript.bounded_shell`). On this machine, when it is
the node, the script runs here.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from poprun.backends._process.files import which
from poprun.backends._process.hostscript import TIMED_OUT, bounded_shell, run_here, run_script
from poprun.backends.base import LaunchError
from poprun.core.localhost import is_this_machine

_DROPPED = ("SLURM_HOSTFILE", "POPRUN_SLURM_LAUNCH", "SLURM_DISTRIBUTION")  # the launch's own step settings

__all__ = ["host_command", "run_on_host"]


def host_command(srun: str, host: str, timeout_s: float) -> list[str]:
    """Return the argv of the step that runs a script (on its standard input) on node ``host``."""
    return [srun, "--overlap", "--nodes=1", "--ntasks=1", f"--nodelist={host}", "--job-name=poprun-command",
            "--quiet", "--kill-on-bad-exit=1", "--input=0", "/bin/sh", "-c", bounded_shell(timeout_s)]


def run_on_host(host: str, script: str, *, environ: Mapping[str, str], timeout_s: float) -> tuple[int, bytes]:
    """
    Run ``script`` on node ``host`` of the allocation (here when it is this machine); return its status and output.

    Raises:
        LaunchError: outside an allocation, without srun, or when srun could not run it on ``host``
            (its own words, in one line).
    """
    if is_this_machine(host):
        return run_here(script, environ=environ, timeout_s=timeout_s)
    if not environ.get("SLURM_JOB_ID"):
        raise LaunchError(f"cannot run a command on {host}: SLURM_JOB_ID is not set (not inside an allocation)")
    srun = which("srun", environ.get("PATH", os.defpath))
    if srun is None:
        raise LaunchError(f"cannot run a command on {host}: srun not found on PATH")
    env = {k: v for k, v in environ.items() if k not in _DROPPED}
    if "/" in host or host.startswith("-") or not host.strip():
        raise LaunchError(f"{host!r} is not a node name")
    try:
        status, out, err = run_script(host_command(srun, host, timeout_s), script, env=env, timeout_s=timeout_s,
                                      keep_stderr=True)
    except OSError as exc:
        raise LaunchError(f"cannot start srun: {exc.strerror}") from exc
    words = [line.strip() for line in err.decode(errors="replace").splitlines() if line.strip()]
    if status not in (0, TIMED_OUT) and not out and any(w.startswith(("srun: error:", "srun: fatal:")) for w in words):
        said = next(w for w in words if w.startswith(("srun: error:", "srun: fatal:")))
        raise LaunchError(f"cannot run a command on node {host}: {said}")
    return status, out
