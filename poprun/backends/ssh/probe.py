"""
Other hosts' CPU topologies, read through ssh for placement (``SshBackend.probe_topologies``).

Layer: ``poprun.backends``; imports the ssh backend's options and ``poprun.planner.machine`` (what a
topology is, and the script that prints one). ssh runs exactly as for a launch
(:func:`~poprun.backends.ssh.backend.ssh_options`: non-interactive, the same connect timeout,
``-F $POPRUN_SSH_CONFIG`` when set), once per host, all at once.
"""

from __future__ import annotations

import shlex
import subprocess
import time
from collections.abc import Mapping

from poprun.backends.ssh.backend import SSH_CONFIG, ssh_options
from poprun.planner.machine import DUMP_SCRIPT, HostTopology, from_dump

PROBE_S = 4.0  # the longest the whole probe takes


def probe_topologies(hosts: tuple[str, ...], *, environ: Mapping[str, str], timeout_s: float = PROBE_S,
                     ssh: str = "ssh") -> dict[str, HostTopology | str]:
    """
    Return each host's topology, read at once through ssh (:data:`~poprun.planner.machine.DUMP_SCRIPT`), or a one-line reason it was not.

    The whole probe takes at most ``timeout_s``.
    """
    base = [*ssh_options(config=environ.get(SSH_CONFIG) or None, ssh=ssh), "-T"]
    procs = {host: subprocess.Popen([*base, "--", host, "sh -c " + shlex.quote(DUMP_SCRIPT)],  # noqa: S603
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    text=True, errors="replace", env=dict(environ)) for host in hosts}
    deadline = time.monotonic() + timeout_s
    found: dict[str, HostTopology | str] = {}
    for host, proc in procs.items():
        try:
            out, err = proc.communicate(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            found[host] = f"no answer within {timeout_s:g} s"
            continue
        try:
            found[host] = from_dump(host, out)
        except ValueError:
            found[host] = err.strip().splitlines()[-1] if err.strip() else f"ssh exited with {proc.returncode}"
    return found
