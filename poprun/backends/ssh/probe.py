"""
Other hosts' CPU topologies, read through ssh for placement (``SshBackend.probe_topologies``).

Layer: ``poprun.backends``; imports the ssh backend's client and ``poprun.planner.machine`` (what a
topology is, and the script that prints one). The probe goes through an
:class:`~poprun.backends.ssh.client.SshClient`, as a launch does (the same options, its
fan-out window, its repeated probes): its connections are then the launch's, which follows
in the same poprun, so that a host pays one key exchange, not two, and a host that could not
be reached is not waited for twice.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import shlex
import subprocess
import time
from collections.abc import Mapping

from poprun.backends.ssh.client import SshClient
from poprun.planner.machine import DUMP_SCRIPT, HostTopology, from_dump

MAX_ANSWER = 8 << 20  # bytes of a host's answer at most (8,192 CPUs and 4,096 PCI devices write under 1 MiB)
PROBE_S = 4.0  # how long the probe waits for a host that says nothing (while none of the others does either)


def probe_topologies(hosts: tuple[str, ...], *, environ: Mapping[str, str], client: SshClient,
                     timeout_s: float = PROBE_S) -> dict[str, HostTopology | str]:
    """
    Return each host's topology, read through ``client`` (:data:`~poprun.planner.machine.DUMP_SCRIPT`), or a one-line reason it was not.

    The connections are opened in the client's window, each within ``timeout_s`` of its own
    start; the scripts then run on all of them at once, and the probe stops waiting once none
    of them has said anything for ``timeout_s``.
    """
    failed = client.connect([(host, 0) for host in hosts], timeout_s=timeout_s)
    found: dict[str, HostTopology | str] = {host: _last_line(err, f"ssh exited with {status}")
                                            for host, (status, err) in failed.items()}
    procs = {host: subprocess.Popen(client.argv(host, "sh -c " + shlex.quote(DUMP_SCRIPT) + " sh /"),  # noqa: S603 - our own
                                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    env=dict(environ)) for host in hosts if host not in failed}
    outputs = _read_all(procs, timeout_s)
    for host, proc in procs.items():
        out, err = outputs[host]
        if len(out) > MAX_ANSWER or len(err) > MAX_ANSWER:
            found[host] = f"its answer was over {MAX_ANSWER >> 20} MiB (a topology is far less): not read"
            continue
        if proc.poll() is None:
            proc.kill()
            proc.wait()
            found[host] = f"no answer within {timeout_s:g} s"
            continue
        try:
            found[host] = from_dump(host, out.decode(errors="replace"))
        except ValueError:
            found[host] = _last_line(err.decode(errors="replace"), f"ssh exited with {proc.returncode}")
    return {host: found[host] for host in hosts}


def _last_line(text: str, otherwise: str) -> str:
    return text.strip().splitlines()[-1] if text.strip() else otherwise


def _read_all(procs: Mapping[str, subprocess.Popen[bytes]],
              idle_s: float) -> dict[str, tuple[bytes, bytes]]:
    """
    Read every session's stdout and stderr to their ends, until none has said anything for ``idle_s``.

    A session that writes more than :data:`MAX_ANSWER` bytes to either is killed and read no
    further (a hostile or broken host's endless answer would fill poprun's memory).
    """
    got = {host: (bytearray(), bytearray()) for host in procs}
    with selectors.DefaultSelector() as selector:
        for host, proc in procs.items():
            for number, pipe in enumerate((proc.stdout, proc.stderr)):
                assert pipe is not None
                selector.register(pipe, selectors.EVENT_READ, (host, number))
        deadline = time.monotonic() + idle_s
        while selector.get_map() and (left := deadline - time.monotonic()) > 0:
            for key, _ in selector.select(left):
                chunk = os.read(key.fd, 65536)
                host, number = key.data
                got[host][number].extend(chunk)
                deadline = time.monotonic() + idle_s
                if len(got[host][number]) > MAX_ANSWER:
                    procs[host].kill()
                    for other in [k for k in selector.get_map().values() if k.data[0] == host]:
                        selector.unregister(other.fileobj)
                elif not chunk:
                    selector.unregister(key.fileobj)
    for proc in procs.values():
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(max(0.1, deadline - time.monotonic()))
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
    return {host: (bytes(out), bytes(err)) for host, (out, err) in got.items()}
