"""
Signals to poprun, through the real CLI, checked in the process table (``/proc``).

SIGHUP (and ``nohup``), Ctrl-Z, a signal while the partition is being acquired, and a daemon
that an instance starts in a session of its own when poprun is SIGKILLed. Every launch runs in
a ``marked`` environment, so that each of its processes can be found by its marker.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from poprun.process.cgroup import Cgroup
from tests.conftest import Marked
from tests.e2e.test_lifecycle import READY, RUN_WITH_GRANDCHILD, await_ready, finish, start

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]

PY = sys.executable
_SIGHUP_BIT = 1 << (signal.SIGHUP - 1)  # in the SigIgn mask of /proc/PID/status


def state(pid: int) -> str:
    """Return the state letter of process ``pid`` (``T`` stopped, ``S`` sleeping ...), or "" when gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0].decode()
    except (OSError, IndexError):
        return ""


def await_state(pids: list[int], wanted: str, *, within_s: float) -> list[str]:
    """Return the states of ``pids`` once all are ``wanted`` (or what they are after ``within_s``)."""
    deadline = time.monotonic() + within_s
    while (states := [state(p) for p in pids]) != [wanted] * len(pids) and time.monotonic() < deadline:
        time.sleep(0.01)
    return states


def test_sighup_stops_every_instance_and_exits_129(tmp_path: Path, marked: Marked) -> None:
    """SIGHUP (the terminal went away): every instance and grandchild is gone, poprun says so and exits 129."""
    proc = start(marked, tmp_path, RUN_WITH_GRANDCHILD, instances=2)
    await_ready(proc, 2)

    proc.send_signal(signal.SIGHUP)
    status, _, err, _ = finish(proc)

    assert (129, "poprun: stopped by SIGHUP\n", {}) == (status, err, marked.survivors(within_s=10))  # a loaded machine


def test_sighup_ignored_at_start_stays_ignored_by_poprun_and_its_instances(tmp_path: Path, marked: Marked) -> None:
    """Under ``nohup`` a SIGHUP neither stops poprun nor reaches the instances, which inherit it ignored."""
    # GIVEN
    script = f"{READY}; sleep 0.5; grep SigIgn /proc/self/status"
    proc = subprocess.Popen(["nohup", PY, "-m", "poprun.cli.main", "--num-instances", "2", "--num-replicas", "2",
                             "sh", "-c", script], cwd=tmp_path, env=marked.env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    await_ready(proc, 2)

    # WHEN
    proc.send_signal(signal.SIGHUP)
    status, out, _, _ = finish(proc)

    # THEN
    masks = [int(line.split()[1], 16) for line in out.splitlines() if line.startswith("SigIgn:")]
    assert (0, [True, True]) == (status, [bool(m & _SIGHUP_BIT) for m in masks])


def test_ctrl_z_stops_the_instances_with_poprun_and_fg_continues_them(tmp_path: Path, marked: Marked) -> None:
    """SIGTSTP to poprun stops its instances too; SIGCONT continues them all, and the run ends well."""
    # GIVEN: poprun in a process group of its own, as a shell with job control starts it
    script = f"{READY}; exec {PY} -c 'import time; [time.sleep(0.05) for _ in range(40)]'"  # no child to vfork
    proc = subprocess.Popen([PY, "-m", "poprun.cli.main", "--num-instances", "2", "--num-replicas", "2",
                             "sh", "-c", script], cwd=tmp_path, env=marked.env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, process_group=0)
    instances = [pid for pid, _ in await_ready(proc, 2).values()]
    time.sleep(0.3)  # the instances may print before the backend has handed poprun the launch to stop

    # WHEN
    proc.send_signal(signal.SIGTSTP)
    stopped = await_state([proc.pid, *instances], "T", within_s=5)
    proc.send_signal(signal.SIGCONT)
    running = [s != "T" for s in (await_state(instances, "S", within_s=5))]
    status, _, err, _ = finish(proc)

    # THEN
    assert (["T", "T", "T"], [True, True]) == (stopped, running)
    assert (0, "", {}) == (status, err, marked.alive())


def test_sigterm_while_the_partition_is_acquired_exits_143_without_a_traceback(tmp_path: Path,
                                                                              marked: Marked) -> None:
    """A V-IPU server that never answers holds poprun in the partition step; SIGTERM there ends it with 143."""
    # GIVEN: a server that accepts connections and never answers
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        proc = subprocess.Popen([PY, "-m", "poprun.cli.main", "--vipu-server-host", "127.0.0.1",
                                 "--vipu-server-port", str(port), "--vipu-server-timeout", "60",
                                 "--vipu-partition", "p", "--num-replicas", "1", "true"],
                                cwd=tmp_path, env=marked.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        listener.settimeout(20)
        held, _ = listener.accept()  # poprun is in the partition step, waiting for an answer

        # WHEN
        proc.send_signal(signal.SIGTERM)
        status, _, err, _ = finish(proc)
        held.close()

    # THEN
    assert (143, "poprun: stopped by SIGTERM", {}) == (status, err.splitlines()[-1], marked.alive())
    assert "Traceback" not in err


def test_daemon_in_a_session_of_its_own_dies_with_a_sigkilled_poprun(tmp_path: Path, marked: Marked) -> None:
    """An instance's ``setsid`` daemon leaves every process group; the launch's cgroup still ends it with poprun."""
    # GIVEN
    probe = Cgroup.make()
    if probe is None:
        pytest.skip("no cgroup can be made here (cgroup v2 not writable, or POPRUN_CGROUP=0): poprun cannot hold a "
                    "daemon that leaves its process group once poprun itself is SIGKILLed (the README's limit)")
    probe.remove()
    proc = start(marked, tmp_path, f"setsid sh -c 'sleep 300' & {READY}; sleep 60", instances=2)
    ready = await_ready(proc, 2)
    cgroup = Path(f"/proc/{ready[0][0]}/cgroup").read_text().splitlines()[-1].split("::", 1)[1]
    deadline = time.monotonic() + 5
    while sum("sleep 300" in c for c in marked.alive().values()) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)

    # WHEN
    proc.kill()
    finish(proc)

    # THEN
    assert {} == marked.survivors(within_s=3.0)
    assert "/poprun-" in cgroup
    assert not Path(probe.parent, Path(cgroup).name).exists()



def test_only_the_launchs_own_cgroup_is_removed(tmp_path: Path, marked: Marked) -> None:
    """A cgroup named like poprun's but not made by this launch survives it; the launch's own is gone."""
    # GIVEN
    probe = Cgroup.make()
    if probe is None:
        pytest.skip("no cgroup can be made here (cgroup v2 not writable, or POPRUN_CGROUP=0)")
    probe.remove()
    planted = Path(probe.parent, "poprun-000000000000")
    planted.mkdir()
    try:
        # WHEN
        proc = start(marked, tmp_path, f"{READY}; cat /proc/self/cgroup", instances=2)
        status, out, _, _ = finish(proc)

        # THEN
        own = {line.split("::", 1)[1] for line in out.splitlines() if line.startswith("0::")}
        assert (0, True, 1) == (status, planted.is_dir(), len(own))
        assert not Path(probe.parent, Path(own.pop()).name).exists()
    finally:
        planted.rmdir()


@pytest.mark.parametrize("sig", ["USR1", "USR2", "ALRM"])
def test_a_forwarded_signal_leaves_the_watchdog_that_outlives_a_sigkilled_poprun(tmp_path: Path, marked: Marked,
                                                                                 sig: str) -> None:
    """``--signal``'s signal reaches the instances, not the watchdog: a SIGKILLed poprun still leaves nothing."""
    # GIVEN instances that say when the forwarded signal came, then keep running
    script = f"trap 'echo got $POPDIST_INSTANCE_INDEX' {sig}; {READY}; while :; do sleep 0.1; done"
    proc = subprocess.Popen([sys.executable, "-m", "poprun.cli.main", "--num-instances", "2", "--num-replicas", "2",
                             "--timeout", "120", "--signal", f"{sig}@119", "sh", "-c", script],
                            cwd=tmp_path, env=marked.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    await_ready(proc, 2)
    assert proc.stdout is not None
    got = {proc.stdout.readline().strip() for _ in range(2)}
    assert {"got 0", "got 1"} == got

    # WHEN poprun is killed after the signal was forwarded
    proc.kill()
    finish(proc)

    # THEN its watchdog was still there to end the instances
    assert {} == marked.survivors(within_s=5.0)
