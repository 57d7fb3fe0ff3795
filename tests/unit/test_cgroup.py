"""The launch's cgroup never kills poprun, even when a stop signal interrupts poprun's move into it."""

import subprocess
import sys

import pytest

from poprun.backends._process.cgroup import Cgroup

# Moves this process into a new cgroup with a _write that raises right after the move is made
# (a stop signal's handler raising as the slow write returns), then kills the cgroup.
_CHILD = """
import sys
from poprun.backends._process import cgroup

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
