"""The launch's cgroup never kills poprun, even when a stop signal interrupts poprun's move into it."""

import os
import subprocess
import sys

import pytest

from poprun.process.cgroup import Cgroup

# Moves this process into a new cgroup with a _write that raises right after the move is made
# (a stop signal's handler raising as the slow write returns), then kills the cgroup.
_CHILD = """
import sys
from poprun.process import cgroup

real = cgroup._write
def interrupted(path, text):
    real(path, text)
    if path.endswith("cgroup.procs") and not path.startswith(made.parent + "/cgroup.procs"):
        raise KeyboardInterrupt
cgroup._write = interrupted
made = cgroup.Cgroup.make()
try:
    made.enter()
except KeyboardInterrupt:
    pass
cgroup._write = real
made.kill()
made.remove()
print("alive")
"""


def test_a_move_interrupted_after_it_is_made_does_not_kill_poprun() -> None:
    """Cgroup.kill after an enter() interrupted once the move was made leaves the cgroup first, so poprun lives."""
    made = Cgroup.make()
    if made is None:
        pytest.skip("no writable cgroup v2 with cgroup.kill here")
    made.remove()

    # WHEN
    child = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True, timeout=30, check=False)

    # THEN
    assert (0, "alive\n") == (child.returncode, child.stdout), child.stderr


# Makes a cgroup ahead, then: the next make() takes it; enter() waits for the move; a child begins inside;
# leave() and remove() end it. Then one made ahead and never taken: release_ahead() leaves and removes it.
_AHEAD = """
import os, subprocess
from poprun.process import cgroup

def where():
    with open("/proc/self/cgroup") as file:
        return next(line[3:].strip() for line in file if line.startswith("0::"))

own = where()
ahead = cgroup.Cgroup.ahead()
taken = cgroup.Cgroup.make()
entered = taken.enter()
child = subprocess.run(["cat", "/proc/self/cgroup"], capture_output=True, text=True).stdout
print(taken is ahead, entered, where() != own, os.path.basename(ahead.path) in child)
taken.kill()
taken.remove()
other = cgroup.Cgroup.make()
print(where() == own, os.path.isdir(ahead.path), other is not ahead)
other.remove()
left = cgroup.Cgroup.ahead()
cgroup.release_ahead()
print(where() == own, os.path.isdir(left.path), cgroup._ahead)
"""


def test_a_cgroup_made_ahead_is_the_next_launchs_and_one_never_taken_is_released() -> None:
    """Cgroup.ahead() moves this process in a thread; make() takes that cgroup; release_ahead() undoes an unused one."""
    made = Cgroup.make()
    if made is None:
        pytest.skip("no writable cgroup v2 with cgroup.kill here")
    made.remove()

    # WHEN
    child = subprocess.run([sys.executable, "-c", _AHEAD], capture_output=True, text=True, timeout=30, check=False)

    # THEN
    assert (0, ["True True True True", "True False True", "True False []"]) == (
        child.returncode, child.stdout.splitlines()), child.stderr


# prime() readies the kernel in a thread that moves this process into the cgroup it is in; make()
# stops that thread (and waits for it) before it makes a cgroup, so that no write of it can follow
# a move in. Prints: the thread ran and wrote, it is stopped after make(), the process is inside the
# new cgroup after enter(), and a second prime() starts nothing.
_PRIME = """
import os
from poprun.process import cgroup

writes = []
real = cgroup._write
def counted(path, text):
    writes.append(path)
    real(path, text)
cgroup._write = counted
cgroup.prime()
thread, stop = cgroup._primer[0]
while not writes:
    pass
made = cgroup.Cgroup.make()
print(len(writes) > 0, thread.is_alive(), stop.is_set())
made.enter()
own = open("/proc/self/cgroup").read()
primed = len(writes)
print(os.path.basename(made.path) in own, all(p == writes[0] for p in writes[:primed - 1]))
cgroup.prime()
print(len(cgroup._primer))
made.kill()
made.remove()
"""


def test_priming_stops_before_a_cgroup_is_made() -> None:
    """prime()'s thread is stopped and joined by Cgroup.make(): the launch's move is never undone by it."""
    made = Cgroup.make()
    if made is None:
        pytest.skip("no writable cgroup v2 with cgroup.kill here")
    made.remove()

    # WHEN
    child = subprocess.run([sys.executable, "-c", _PRIME], capture_output=True, text=True, timeout=30, check=False)

    # THEN
    assert (0, ["True False True", "True True", "1"]) == (child.returncode, child.stdout.splitlines()), child.stderr


def test_priming_does_nothing_when_cgroups_are_off() -> None:
    """POPRUN_CGROUP=0: prime() starts no thread, and stop_priming() is then nothing to do."""
    code = ("from poprun.process import cgroup; cgroup.prime(); cgroup.stop_priming(); "
            "print(len(cgroup._primer))")
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=False,
                           env={**os.environ, "POPRUN_CGROUP": "0"})
    assert (0, "0\n") == (child.returncode, child.stdout), child.stderr


def test_priming_ends_quietly_where_the_cgroup_is_not_writable() -> None:
    """A cgroup.procs that cannot be written ends the primer's thread at once: nothing to ready."""
    import threading

    from poprun.process import cgroup

    stop = threading.Event()
    cgroup._keep_ready("/nonexistent-poprun/cgroup.procs", stop)  # returns: the write fails
    assert not stop.is_set()


# Inside a launch's cgroup, a thread starts a child of poprun's own with outside(): it waits until
# poprun left the cgroup, so the launch's kill spares the child; a move in waits for it in turn.
_OUTSIDE = """
import subprocess, threading, time
from poprun.process import cgroup

made = cgroup.Cgroup.make()
made.enter()
started = []
def start():
    with cgroup.outside():
        started.append(subprocess.Popen(["sleep", "30"]))
thread = threading.Thread(target=start)
thread.start()
thread.join(0.5)
print("waited" if not started else "did not wait")
made.kill()  # leaves first: the child then starts, outside
thread.join(30)
child = started[0]
with open(f"/proc/{child.pid}/cgroup") as file:
    print("outside" if made.path.rsplit("/", 1)[1] not in file.read() else "inside")
time.sleep(0.2)
print("alive" if child.poll() is None else "killed")
child.kill()
child.wait()
made.remove()
"""


def test_a_child_started_outside_is_born_out_of_a_launchs_cgroup_and_outlives_its_kill() -> None:
    """outside() waits while poprun is inside a launch's cgroup; the child it starts then is not killed with it."""
    made = Cgroup.make()
    if made is None:
        pytest.skip("no writable cgroup v2 with cgroup.kill here")
    made.remove()

    result = subprocess.run([sys.executable, "-c", _OUTSIDE], capture_output=True, text=True, timeout=60, check=False)

    assert ("waited\noutside\nalive\n", 0) == (result.stdout, result.returncode), result.stderr
