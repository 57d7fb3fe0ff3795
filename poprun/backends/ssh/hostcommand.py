"""
A short command on a host of the ssh backend (``SshBackend.run_on_host``), over the launch's own connection.

Layer: ``poprun.backends``; imports the ssh backend's client and diagnoses, and
:mod:`poprun.process.hostscript`. The mpirun backend reaches its hosts through this too (the
registry hands it an ssh backend): one way to reach a host, not two.

On this machine the script runs with ``/bin/sh -s``. Elsewhere, through the backend's
:class:`~poprun.backends.ssh.client.SshClient` (batch mode, its connect timeout, ``-F
$POPRUN_SSH_CONFIG``): the host's shared connection is opened first when there is none (so
that a host that cannot be reached gets the preflight's own one-line reason, PR405-PR408), and
the script goes through it on the session's standard input to ``sh -s``, bounded on the host
too (:func:`~poprun.process.hostscript.bounded_shell`). The connection stays open for
the launch that follows (it takes the same client), or is the running launch's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping

from poprun.backends.base import LaunchError
from poprun.backends.ssh.client import SshClient, ssh_options
from poprun.backends.ssh.preflight import _diagnose, _unreachable
from poprun.core.diagnostic import Diagnostic
from poprun.core.localhost import is_this_machine
from poprun.process.hostscript import bounded_shell, run_here, run_script
from poprun.process.instance import helper_failed

SSH_FAILED = 255  # ssh's own status when it could not run the command

__all__ = ["run_on_host", "run_once"]


def run_on_host(client_for: Callable[[Mapping[str, str]], SshClient], host: str, script: str, *,
                environ: Mapping[str, str], timeout_s: float) -> tuple[int, bytes]:
    """
    Run ``script`` on ``host`` (here when it is this machine); return its status and standard output.

    ``client_for(environ)`` gives the ssh client to go through (the backend's shared one).

    Raises:
        LaunchError: when the host cannot be reached; its message is the diagnostic's, in one line.
    """
    if is_this_machine(host):
        return run_here(script, environ=environ, timeout_s=timeout_s)
    client = client_for(environ)
    deadline = time.monotonic() + timeout_s
    if not client.usable(host):
        try:
            failed = client.connect([(host, 0)], timeout_s=timeout_s)
        except OSError as exc:  # no ssh to run
            raise helper_failed(exc, "ssh", f"cannot start ssh: {exc.strerror or exc}") from exc
        if host in failed:
            code, said = failed[host]
            _raise(_diagnose(host, code, "", said, "/") or _unreachable(host, said.strip() or f"ssh exited with {code}"))
    left = max(0.5, deadline - time.monotonic())
    return _run(client.argv(host, bounded_shell(left)), host, script, environ=environ, timeout_s=left)


def run_once(host: str, script: str, *, environ: Mapping[str, str], timeout_s: float,
             settings: tuple[str | None, str, float, float]) -> tuple[int, bytes]:
    """
    Run ``script`` on ``host`` through an ssh connection of its own, closed when it ends (nothing shared, nothing left).

    ``settings``: (ssh_config, ssh, host timeout, connect timeout), as the backend's launches use them.

    Raises:
        LaunchError: when the host cannot be reached; its message is the diagnostic's, in one line.
    """
    if is_this_machine(host):
        return run_here(script, environ=environ, timeout_s=timeout_s)
    config, ssh, host_timeout_s, connect_timeout_s = settings
    argv = [*ssh_options(config=config, ssh=ssh, host_timeout_s=host_timeout_s,
                         connect_timeout_s=min(connect_timeout_s, timeout_s)),
            "-o", "ControlMaster=no", "-o", "ControlPath=none", "-T", "--", host, bounded_shell(timeout_s)]
    return _run(argv, host, script, environ=environ, timeout_s=timeout_s)


def _run(argv: list[str], host: str, script: str, *, environ: Mapping[str, str], timeout_s: float) -> tuple[int, bytes]:
    """Run the ssh command ``argv`` with ``script`` on its input; return the script's status and output, or raise ssh's failure."""
    try:
        status, out, err = run_script(argv, script, env=environ, timeout_s=timeout_s, keep_stderr=True)
    except OSError as exc:
        raise helper_failed(exc, "ssh", f"cannot start ssh: {exc.strerror}") from exc
    if status == SSH_FAILED and err.strip():  # the script's own stderr is dropped on the host: these are ssh's words
        _raise(_diagnose(host, status, "", err.decode(errors="replace"), "/")
               or _unreachable(host, err.decode(errors="replace").strip()))
    return status, out


def _raise(problem: Diagnostic) -> None:
    """Raise the :class:`LaunchError` of ``problem``: its summary and detail in one line."""
    detail = " ".join(problem.detail.split())
    raise LaunchError(f"{problem.code}: {problem.summary}: {detail}", diagnostics=(problem,))
