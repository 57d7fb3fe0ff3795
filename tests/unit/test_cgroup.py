"""The launch's cgroup never kills poprun, even when a stop signal interrupts poprun's move into it."""

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
