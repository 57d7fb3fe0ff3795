"""
What actually ran: each instance's process, read back and compared with the plan (a "verified run").

Layer: ``poprun.runs``; imports ``poprun.core`` and ``poprun.planner.plan``. When an instance starts
on this machine, :func:`observe` reads its process (``/proc/PID``): the argv, the variables the
plan decides (those it sets, forwards or unsets) and the CPUs it may run on, and compares them
with the plan at once (no hashing on the launch path). :func:`actual_data` makes the record's
``actual.json`` at the end: per instance the host, pid, CPUs, whether argv, environment and
CPUs are as planned, the names of variables that differ (never their values), and BLAKE2b-256
digests of the argv and of those variables, so that two runs can be compared later.

Instances on other hosts are recorded with the host and pid the backend knows (its ssh
client's or mpirun's), not read back: ``verified`` is false for them.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

from poprun.core.localhost import is_this_machine
from poprun.planner.machine import parse_cpulist
from poprun.planner.plan import Instance

_TRIES = 20  # reads of a process that is still exec'ing, a millisecond apart


def observe(instance: Instance, pid: int, env_source: Mapping[str, str]) -> dict[str, object]:
    """Return what instance ``instance`` (process ``pid``, just started) runs as, compared with the plan."""
    seen: dict[str, object] = {"host": instance.host, "pid": pid, "verified": False}
    if not is_this_machine(instance.host):
        return seen
    try:
        for _ in range(_TRIES):  # a process in the middle of its exec reads empty for a moment
            with open(f"/proc/{pid}/cmdline", "rb") as file:  # pathlib costs start-up
                raw = file.read()
            with open(f"/proc/{pid}/environ", "rb") as file:
                env_raw = file.read()
            if raw and env_raw:
                break
            time.sleep(0.001)
        argv = [a.decode(errors="surrogateescape") for a in raw.split(b"\0")[:-1]]
        pairs = (item.partition(b"=") for item in env_raw.split(b"\0") if item)
        environ = {k.decode(errors="surrogateescape"): v.decode(errors="surrogateescape") for k, _, v in pairs}
        cpus = sorted(os.sched_getaffinity(pid))
    except OSError as exc:  # it ended already (a quick program), or is not ours to read
        seen["unread"] = exc.strerror or str(exc)
        return seen
    planned = list(instance.argv)
    names = sorted({k for k, _ in instance.env.set} | set(instance.env.forward) | set(instance.env.unset))
    expected = dict(instance.env.set) | {k: env_source[k] for k in instance.env.forward if k in env_source}
    differ = [k for k in names if environ.get(k) != expected.get(k)]
    seen.update(verified=True, cpus=cpus,
                argv_as_planned=argv == planned or argv[-len(planned):] == planned,  # behind poprun's binding
                cpus_as_planned=not instance.placement.cpus or tuple(cpus) == parse_cpulist(instance.placement.cpus),
                env_as_planned=not differ, env_differs=differ,
                _argv=argv, _env=[f"{k}={environ[k]}" for k in names if k in environ])
    return seen


def _digest(text: str) -> str:
    """Return the BLAKE2b-256 digest of ``text`` in hex (``_blake2``: hashlib's OpenSSL import costs some 4 ms)."""
    try:
        from _blake2 import blake2b  # the module behind hashlib.blake2b
    except ImportError:  # another Python implementation
        from hashlib import blake2b
    return blake2b(text.encode(errors="surrogateescape"), digest_size=32).hexdigest()


def actual_data(seen: Mapping[int, Mapping[str, object]]) -> dict[str, object]:
    """Return ``actual.json``: each observed instance, its argv and variables as BLAKE2b-256 digests."""
    instances: dict[str, object] = {}
    for index, values in sorted(seen.items()):
        data = {k: v for k, v in values.items() if not k.startswith("_")}
        if "_argv" in values:
            data["argv_blake2b"] = _digest("\0".join(values["_argv"]))  # type: ignore[arg-type]
            data["env_blake2b"] = _digest("\0".join(values["_env"]))  # type: ignore[arg-type]
        instances[str(index)] = data
    return {"v": 1, "instances": instances}
