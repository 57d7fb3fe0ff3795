"""
A short command on a node of the allocation (``SlurmBackend.run_on_host``): a one-task step of its own.

Layer: ``poprun.backends``; imports :mod:`poprun.process`, :mod:`poprun.backends.base` and
``poprun.core``. It also says, for the backend's launch too, what is missing outside an allocation
(PR436, PR437).

``srun --overlap --nodes=1 --ntasks=1 --nodelist=HOST`` runs ``sh -s`` on the node, beside
the launch's step (``--overlap``: it takes no CPU from the instances, and does not wait for
them), with the script on its standard input; bounded here (srun's group is killed) and
there (:func:`~poprun.process.hostscript.bounded_shell`). On this machine, when it is
the node, the script runs here. ``srun`` starts under ``setpriv --pdeathsig TERM`` (util-linux)
where there is one: should poprun die while it runs, even by SIGKILL, srun gets SIGTERM and
ends its step (without setpriv, it runs on until the script's own bound there).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from poprun.backends.base import CANNOT_LAUNCH, LaunchError
from poprun.core.diagnostic import launch_error
from poprun.core.localhost import is_this_machine
from poprun.core.span import SourceSpan
from poprun.process.files import which
from poprun.process.hostscript import TIMED_OUT, bounded_shell, run_here, run_script
from poprun.process.instance import helper_failed

_DROPPED = ("SLURM_HOSTFILE", "POPRUN_SLURM_LAUNCH", "SLURM_DISTRIBUTION")  # the launch's own step settings

__all__ = ["host_command", "outside_allocation", "run_on_host", "srun_missing"]


def outside_allocation(detail: str) -> LaunchError:
    """Return PR436: SLURM_JOB_ID is not set, so there is no allocation to run in (``detail``: the line told)."""
    return launch_error("PR436", "not inside a Slurm allocation", detail=detail,
                        span=SourceSpan.environment("SLURM_JOB_ID"),
                        hint="run poprun inside an allocation (salloc, or a batch script given to sbatch), or let "
                             "'poprun submit' make one; or use another backend (--backend local or ssh)")


def srun_missing(detail: str, *, status: int = CANNOT_LAUNCH) -> LaunchError:
    """Return PR437: no ``srun`` on PATH (``detail``: the line told)."""
    return launch_error("PR437", "srun not found", detail=detail, span=SourceSpan.environment("PATH"),
                        status=status,
                        hint="install Slurm's client commands (Debian: apt-get install slurm-client) or put their "
                             "directory on PATH")


def _unreachable(host: str, detail: str, hint: str) -> LaunchError:
    """Return PR439: the command could not run on node ``host``."""
    return launch_error("PR439", "command could not run on a host", detail=detail,
                        span=SourceSpan.environment(f"host {host}"), hint=hint)


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
        raise outside_allocation(f"cannot run a command on {host}: SLURM_JOB_ID is not set (not inside an allocation)")
    srun = which("srun", environ.get("PATH", os.defpath))
    if srun is None:
        raise srun_missing(f"cannot run a command on {host}: srun not found on PATH")
    env = {k: v for k, v in environ.items() if k not in _DROPPED}
    if "/" in host or host.startswith("-") or not host.strip():
        raise _unreachable(host, f"{host!r} is not a node name",
                           'name a node of the allocation (scontrol show hostnames "$SLURM_JOB_NODELIST")')
    argv = host_command(srun, host, timeout_s)
    setpriv = which("setpriv", environ.get("PATH", os.defpath))
    if setpriv is not None:  # srun (a session of its own) ends its step should poprun die meanwhile, even by SIGKILL
        argv = [setpriv, "--pdeathsig", "TERM", "--", *argv]
    try:
        status, out, err = run_script(argv, script, env=env, timeout_s=timeout_s, keep_stderr=True)
    except OSError as exc:
        raise helper_failed(exc, "srun", f"cannot start srun: {exc.strerror}") from exc
    words = [line.strip() for line in err.decode(errors="replace").splitlines() if line.strip()]
    if status not in (0, TIMED_OUT) and not out and any(w.startswith(("srun: error:", "srun: fatal:")) for w in words):
        said = next(w for w in words if w.startswith(("srun: error:", "srun: fatal:")))
        raise _unreachable(host, f"cannot run a command on node {host}: {said}",
                           f"srun's own words say why: check that {host} is a node of this allocation and is up "
                           "(sinfo, scontrol show node)")
    return status, out


_UNUSABLE = ("DRAIN", "DOWN", "FAIL", "NOT_RESPONDING", "POWERED_DOWN", "POWERING_DOWN", "REBOOT", "MAINT")
# a node that has any of these states (State=ALLOCATED+DRAIN ...) runs no new step of the allocation


def unavailable_nodes(hosts: tuple[str, ...], *, environ: Mapping[str, str], timeout_s: float = 10) -> dict[str, str]:
    """
    Return the nodes of ``hosts`` that Slurm says cannot run a new step (drained, down, failing), with why.

    Asks the controller (``scontrol --oneliner show node``), once for all. A node it does not
    know is reported too; nothing when scontrol is missing or does not answer (the launch then
    says what is wrong).
    """
    import re
    import subprocess

    names = [h for h in hosts if h and not h.startswith("-") and "/" not in h]
    scontrol = which("scontrol", environ.get("PATH", os.defpath))
    if not names or scontrol is None:
        return {}
    try:
        done = subprocess.run([scontrol, "--oneliner", "show", "node", ",".join(names)], capture_output=True,  # noqa: S603
                              text=True, timeout=timeout_s, check=False, stdin=subprocess.DEVNULL, env=dict(environ),
                              errors="replace")
    except (OSError, subprocess.TimeoutExpired):
        return {}
    found: dict[str, str] = {}
    for line in done.stdout.splitlines():
        name = re.search(r"(?:^|\s)NodeName=(\S+)", line)
        state = re.search(r"(?:^|\s)State=(\S+)", line)
        if name is None or state is None:
            continue
        flags = set(re.split(r"[+*]", state.group(1)))
        bad = sorted(flags.intersection(_UNUSABLE))
        if bad:
            reason = re.search(r"(?:^|\s)Reason=(.*?)(?:\s+\w+=|$)", line)
            why = f" ({reason.group(1).strip()})" if reason and reason.group(1).strip() else ""
            found[name.group(1)] = f"is {state.group(1)} in Slurm{why}"
    return {h: found[h] for h in hosts if h in found}
