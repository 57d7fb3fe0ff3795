"""
Running a short script on a host of the launch, through its backend when it can.

Layer: ``poprun.apply``; imports ``poprun.backends.base`` and ``poprun.core``. The port plan
(:mod:`poprun.apply.ports`) and the stacks of hung instances (:mod:`poprun.apply.stacks`) read
what they need from a host with a POSIX sh script: through the backend's optional
:meth:`~poprun.backends.base.HostCommands.run_on_host`, else with ``/bin/sh -s`` here when the
host is this machine, else not at all (a plugin that offers no host commands).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping

from poprun.backends.base import LaunchError
from poprun.core.localhost import is_this_machine

MAX_OUTPUT = 1 << 20  # what a backend's run_on_host returns at most; the same here

__all__ = ["run_script"]


def run_script(backend: object, host: str, script: str, *, environ: Mapping[str, str],
               timeout_s: float) -> tuple[int, bytes] | str:
    """
    Return the status and standard output of ``script`` run on ``host``, or a one-line reason it could not run.

    Never raises for a host that cannot be reached: the reason says so.
    """
    run_on_host = getattr(backend, "run_on_host", None)
    if callable(run_on_host):
        try:
            status, out = run_on_host(host, script, environ=environ, timeout_s=timeout_s)
        except LaunchError as exc:
            return exc.message
        return int(status), bytes(out)[:MAX_OUTPUT]
    if not is_this_machine(host):
        name = getattr(backend, "name", type(backend).__name__)
        return f"the {name} backend cannot run commands on {host} (it offers no run_on_host)"
    try:
        proc = subprocess.Popen(["/bin/sh", "-s"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, env=dict(environ), start_new_session=True)
    except OSError as exc:
        return f"cannot run /bin/sh here: {exc.strerror}"
    try:
        out, _ = proc.communicate(("{\n" + script + "\n} </dev/null\n").encode(), timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)  # the script's whole session: nothing holds its output open
        proc.communicate()
        return f"no answer from /bin/sh here within {timeout_s:g} s"
    return proc.returncode, out[:MAX_OUTPUT]
