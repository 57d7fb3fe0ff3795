"""A check of launch(gate=) with real processes: after a failure, the other instances are torn down only once the gate returns."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from poprun.backends.base import Backend, InstanceEnded
from poprun.backends.conformance import EventSink, probe_plan

# Instance 0 notes a SIGTERM in a file (then ends 143) and says it is ready; instance 1 fails (3) once it is.
STOP_NOTED = ("import os, signal, sys, time; i = os.environ['POPDIST_INSTANCE_INDEX']\n"
              "if i == '0':\n"
              "    signal.signal(signal.SIGTERM, lambda *_: (open('stopped-0', 'w').close(), os._exit(143)))\n"
              "    open('ready-0', 'w').close(); time.sleep(60); sys.exit(0)\n"
              "deadline = time.monotonic() + 30\n"
              "while not os.path.exists('ready-0') and time.monotonic() < deadline: time.sleep(0.02)\n"
              "sys.exit(3)")
HOLD_S = 1.0  # how long the gate holds: a teardown begun before it would have reached instance 0 by then


class Gate:
    """A gate that holds the teardown for :data:`HOLD_S` and notes what it saw: whether instance 0 was stopped yet."""

    def __init__(self, workdir: Path, sink: EventSink) -> None:
        self.workdir, self.sink = workdir, sink
        self.calls: list[tuple[bool, int]] = []  # (instance 0 stopped already, events told before it returned)
        self.thread = ""

    def __call__(self) -> None:
        self.thread = threading.current_thread().name
        time.sleep(HOLD_S)
        self.calls.append(((self.workdir / "stopped-0").exists(), len(self.sink.events)))


def check_teardown_awaits_the_gate(backend: Backend, workdir: Path, *, hosts: tuple[str, ...] = ("localhost",),
                                   env: dict[str, str] | None = None, launcher_stops: bool = False) -> None:
    """
    Check that ``backend`` awaits the gate once after instance 1 fails, and stops instance 0 only after it.

    ``launcher_stops``: the backend's launcher (mpirun) stops the others itself; the gate then
    comes after instance 1's end is told and before instance 0's.
    """
    # GIVEN
    sink = EventSink()
    gate = Gate(workdir, sink)
    environ = dict(os.environ) | (env or {})
    plan = probe_plan(STOP_NOTED, workdir, backend=backend.name, hosts=hosts, environ=environ)  # its settings (ssh_config)
    # WHEN
    launch = backend.launch(plan, env_source=environ, sink=sink, gate=gate)
    result = launch.wait()
    # THEN
    ends = [(i, e.index) for i, e in enumerate(sink.events) if isinstance(e, InstanceEnded)]
    assert (3, 1) == (result.status, result.root_cause)
    assert [1, 0] == [index for _, index in ends]
    if launcher_stops:
        assert [ends[0][0] + 1] == [told for _, told in gate.calls]
        return
    assert [(False, ends[0][0] + 1)] == gate.calls  # once, right after instance 1's end was told, before any stop
    assert (workdir / "stopped-0").exists()  # stopped by the teardown, after the gate
    assert gate.thread != threading.main_thread().name
