"""Restarting one instance alone (``--restart-scope instance``) with the local backend: real processes, real stops."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

import pytest

from poprun.backends.base import InstanceEnded, InstanceSink, InstanceStarted, Stream
from poprun.backends.conformance import EventSink, RestartOnce, probe_plan
from poprun.backends.local import LocalBackend
from poprun.core.record import evolve
from tests.e2e.hosts.test_ssh_backend import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

# Instance 0 prints a tick with its pid every 20 ms until instance 1's second run has left a file, then 3 more;
# instance 1 exits 5 on its first run and, started again, prints its run and leaves the file.
TICKER = ("import os, sys, time; i = os.environ['POPDIST_INSTANCE_INDEX']; n = os.environ.get('POPRUN_RESTART_COUNT', '0')\n"
          "if i == '1':\n"
          "    print('run', n, flush=True); open('restarted', 'w').close() if n == '1' else None; "
          "sys.exit(0 if n == '1' else 5)\n"
          "left = 3\n"
          "while left:\n"
          "    print('tick', os.getpid(), flush=True); time.sleep(0.02)\n"
          "    left -= os.path.exists('restarted')\n")
FAILS = "import sys; sys.exit(5) if __import__('os').environ['POPDIST_INSTANCE_INDEX'] == '1' else __import__('time').sleep(60)"


class RecordingSink(EventSink, InstanceSink):
    """Keeps events, output and each instance's lines, and the order in which they came."""

    def __init__(self) -> None:
        super().__init__()
        self.order: list[object] = []
        self.kept: dict[int, bytes] = {}
        self.ended = threading.Event()  # instance 1 ended, restarting
        self.cgroups: list[str] = []  # this process's cgroup as each restarted instance was told started

    def write(self, stream: Stream, data: bytes) -> None:
        super().write(stream, data)
        self.order.extend(("out", line) for line in data.decode().splitlines())

    def event(self, event: object) -> None:
        super().event(event)  # type: ignore[arg-type]
        self.order.append(event)
        if isinstance(event, InstanceEnded) and event.restarting:
            self.ended.set()
        if isinstance(event, InstanceStarted) and event.restart:
            self.cgroups.append(Path("/proc/self/cgroup").read_text())

    def instance_lines(self, index: int, _stream: Stream, data: bytes) -> None:
        self.kept[index] = self.kept.get(index, b"") + data


class Waiting(RestartOnce):
    """Restarts instance 1 after ``delay_s``; ``prepare`` runs ``during`` first (a stop, a wait)."""

    def __init__(self, delay_s: float, during: object = None) -> None:
        super().__init__(delay_s=delay_s)
        self.during = during
        self.prepared = threading.Event()

    def prepare(self, index: int) -> dict[str, str]:
        self.prepared.set()
        if callable(self.during):
            self.during()
        return super().prepare(index)


def alive(pid: int) -> bool:
    """Return whether process ``pid`` exists and is not a zombie."""
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return False


def group_is_empty(group: int) -> bool:
    """Return whether no living process is left in process group ``group`` (zombies an ancestor has yet to reap aside)."""
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_bytes().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if entry.name.isdigit() and int(fields[2]) == group and fields[0] != b"Z":
            return False
    return True


def test_only_the_failed_instance_starts_again_while_the_other_prints_on(tmp_path: Path) -> None:
    """Instance 1 fails and starts again; instance 0's output flows on throughout, from one pid, and is never stopped."""
    # GIVEN output tagged and filed
    plan = probe_plan(TICKER, tmp_path, backend="local")
    plan = evolve(plan, output=evolve(plan.output, tag=True, output_filename=str(tmp_path / "out")))
    sink = RecordingSink()

    # WHEN
    result = LocalBackend().launch(plan, env_source=dict(os.environ), sink=sink, restarter=RestartOnce()).wait()

    # THEN both end well, instance 0 started once, its ticks from one pid before and after instance 1's restart
    assert ((0, 0), ()) == (result.statuses, result.failures)
    starts = [(e.index, e.restart) for e in sink.events if isinstance(e, InstanceStarted)]
    assert [(0, 0), (1, 0), (1, 1)] == starts
    restarted = next(i for i, o in enumerate(sink.order) if isinstance(o, InstanceStarted) and o.restart == 1)
    ticks = [(i, o[1]) for i, o in enumerate(sink.order) if isinstance(o, tuple) and "<stdout>:tick" in o[1]]
    assert ticks[0][0] < restarted < ticks[-1][0]
    assert 1 == len({line.rsplit(" ", 1)[1] for _, line in ticks})
    assert not any(isinstance(e, InstanceEnded) and e.index == 0 and e.stopped for e in sink.events)
    assert ["poprun-" not in sink.cgroups[0]] == [True], sink.cgroups  # poprun left the launch's cgroup again
    # the restarted run's output: tagged with its index, in the sink's lines of instance 1, and in its file after the first run's
    assert ["[1,1]<stdout>:run 0", "[1,1]<stdout>:run 1"] == [line for line in sink.lines() if "run" in line]
    assert b"run 0\nrun 1\n" == sink.kept[1]
    assert "run 0\nrun 1\n" == (tmp_path / "out" / "1" / "rank.1" / "stdout").read_text()


def test_the_restarted_instance_gets_the_variables_and_its_uptime_is_its_own(tmp_path: Path) -> None:
    """The restarter's variables reach the new run on top of the plan's; it is asked with the failed run's end and uptime."""
    code = ("import os, sys, json; i = os.environ['POPDIST_INSTANCE_INDEX']; n = os.environ.get('POPRUN_RESTART_COUNT')\n"
            "print(json.dumps([i, n, os.environ['CONFORMANCE_SET']]), flush=True); sys.exit(5 if (i, n) == ('1', None) else 0)")
    sink, restarter = RecordingSink(), RestartOnce()

    result = LocalBackend().launch(probe_plan(code, tmp_path, backend="local"), env_source=dict(os.environ), sink=sink,
                                   restarter=restarter).wait()

    assert 0 == result.status
    assert [["0", None, "value-0"], ["1", "1", "value-1"], ["1", None, "value-1"]] == sorted(
        (json.loads(line) for line in sink.lines()), key=str)
    ((ended, uptime),) = restarter.asked
    assert (1, 5, False) == (ended.index, ended.exit_code, ended.restarting)
    assert 0 <= uptime


def test_a_stop_during_the_delay_starts_nothing_and_leaves_nothing(tmp_path: Path) -> None:
    """terminate() while instance 1 waits to start again: nothing starts, instance 0 is stopped, the group is empty."""
    sink, restarter = RecordingSink(), Waiting(delay_s=30)
    launch = LocalBackend().launch(probe_plan(FAILS, tmp_path, backend="local"), env_source=dict(os.environ),
                                   sink=sink, restarter=restarter)
    assert sink.ended.wait(20)
    assert not group_is_empty(launch._watchdog.group)  # instance 0 runs on

    launch.terminate(1.0)
    result = launch.wait()

    assert not restarter.prepared.is_set()
    assert [(0, 0), (1, 0)] == [(e.index, e.restart) for e in sink.events if isinstance(e, InstanceStarted)]
    assert (5, [0], 1) == (result.statuses[1], [f.index for f in result.failures if f.stopped], result.root_cause)
    assert group_is_empty(launch._watchdog.group)
    cgroup = launch._watchdog.cgroup
    assert cgroup is None or not Path(cgroup.path).exists()


def test_a_stop_during_prepare_starts_nothing_and_is_not_held_up(tmp_path: Path) -> None:
    """terminate() while prepare() still runs: wait() returns without it, and its answer starts nothing."""
    release = threading.Event()
    sink = RecordingSink()
    restarter = Waiting(delay_s=0, during=lambda: release.wait(30))
    launch = LocalBackend().launch(probe_plan(FAILS, tmp_path, backend="local"), env_source=dict(os.environ),
                                   sink=sink, restarter=restarter)
    assert restarter.prepared.wait(20)

    launch.terminate(1.0)
    result = launch.wait()
    release.set()

    assert (5, [0]) == (result.statuses[1], [f.index for f in result.failures if f.stopped])
    assert wait_for(lambda: restarter.restarted, within_s=5)  # prepare() returned: its answer came too late
    assert [(0, 0), (1, 0)] == [(e.index, e.restart) for e in sink.events if isinstance(e, InstanceStarted)]
    assert group_is_empty(launch._watchdog.group)


@pytest.mark.parametrize("when", ["before", "while"])
def test_a_stop_as_the_instance_starts_again_leaves_nothing_running(tmp_path: Path, when: str) -> None:
    """A stop just before the new process starts starts nothing; one while it starts reaches it: either way nothing is left."""
    sink = RecordingSink()
    launch_box: list[object] = []
    stopper: list[threading.Thread] = []

    def stop_now() -> None:
        launch_box[0].terminate(1.0)  # type: ignore[attr-defined]

    replaced = threading.Event()  # the restart waits for the test's respawn (a fast failure may come first)

    def replaced_then_stop_now() -> None:
        assert replaced.wait(30)
        if when == "before":
            stop_now()

    restarter = Waiting(delay_s=0, during=replaced_then_stop_now)
    launch = LocalBackend().launch(probe_plan(FAILS, tmp_path, backend="local"), env_source=dict(os.environ),
                                   sink=sink, restarter=restarter)
    launch_box.append(launch)
    respawn = launch._respawn
    calls: list[int] = []

    def respawn_with_a_stop(index: int, variables: Mapping[str, str]) -> subprocess.Popen[bytes]:
        calls.append(index)
        stopper.append(threading.Thread(target=stop_now))
        stopper[0].start()  # blocks on the launch's lock until the new process has started
        assert respawn is not None
        return respawn(index, variables)

    launch._respawn = respawn_with_a_stop
    replaced.set()
    result = launch.wait()
    for thread in stopper:
        thread.join()

    started = [(e.index, e.restart) for e in sink.events if isinstance(e, InstanceStarted)]
    expected = ([], [(0, 0), (1, 0)]) if when == "before" else ([1], [(0, 0), (1, 0), (1, 1)])
    assert expected == (calls, started)
    assert 0 != result.statuses[1]
    assert group_is_empty(launch._watchdog.group)


def test_poprun_killed_during_the_delay_leaves_nothing(tmp_path: Path) -> None:
    """SIGKILL of the launching process while instance 1 waits to start again: the watchdog ends instance 0 and its group."""
    script = tmp_path / "launcher.py"
    script.write_text(
        "import os, sys, threading\n"
        "from pathlib import Path\n"
        "from poprun.backends.conformance import EventSink, RestartOnce, probe_plan\n"
        "from poprun.backends.local import LocalBackend\n"
        f"FAILS = {FAILS!r}\n"
        "made = threading.Event()  # a busy machine may tell the restart before launch() returned\n"
        "class Sink(EventSink):\n"
        "    def event(self, event):\n"
        "        if getattr(event, 'restarting', False):\n"
        "            made.wait(30)\n"
        "            print(launch._watchdog.group, launch._procs[0].pid, flush=True)\n"
        "launch = LocalBackend().launch(probe_plan(FAILS, Path.cwd(), backend='local'), env_source=dict(os.environ),\n"
        "                               sink=Sink(), restarter=RestartOnce(delay_s=60))\n"
        "made.set()\n"
        "launch.wait()\n")
    proc = subprocess.Popen([sys.executable, str(script)], cwd=tmp_path, stdout=subprocess.PIPE, text=True,
                            env=os.environ | {"PYTHONPATH": str(Path(__file__).parents[2])})
    assert proc.stdout is not None
    try:
        group, pid = (int(word) for word in proc.stdout.readline().split())
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()

    assert wait_for(lambda: group_is_empty(group), within_s=5)
    assert wait_for(lambda: not alive(pid), within_s=5)


def test_a_restart_that_cannot_start_tears_the_launch_down(tmp_path: Path) -> None:
    """The program is gone when instance 1 is to start again: poprun says so, the launch is torn down, 1 is the root cause."""
    program = tmp_path / "prog.sh"
    program.write_text('#!/bin/sh\n[ "$POPDIST_INSTANCE_INDEX" = 1 ] && { rm -f "$0"; exit 5; }\nexec sleep 60\n')
    program.chmod(0o755)
    plan = probe_plan("", tmp_path, backend="local")
    plan = evolve(plan, instances=tuple(evolve(i, argv=(str(program),)) for i in plan.instances))
    sink = RecordingSink()

    result = LocalBackend().launch(plan, env_source=dict(os.environ), sink=sink, restarter=RestartOnce()).wait()

    assert ((143, 5), 1) == (result.statuses, result.root_cause)
    assert [f"poprun: instance 1 could not start again: cannot run '{program}': No such file or directory"] == \
        sink.lines("stderr")
    assert [(0, 0), (1, 0)] == [(e.index, e.restart) for e in sink.events if isinstance(e, InstanceStarted)]
