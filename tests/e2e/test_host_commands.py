"""Host commands of the local and offline backends, on this machine: a script on /bin/sh's input, bounded."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from poprun.backends.base import LaunchError
from poprun.backends.local import LocalBackend
from poprun.backends.offline import OfflineBackend
from poprun.backends.registry import BackendRegistry, default_registry
from poprun.process.hostscript import MAX_OUTPUT, TIMED_OUT

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(60)]


@pytest.mark.parametrize("backend", [LocalBackend(), OfflineBackend()], ids=["local", "offline"])
def test_a_script_runs_here_from_its_input_never_its_argv(backend):
    """The shell's argv is /bin/sh -s only; the script's words, quotes and $() arrive as written; stderr is dropped."""
    script = """printf '%s\\n' "it's \\"$(echo quoted)\\"" ; tr '\\0' ' ' < /proc/$$/cmdline; echo; echo oops >&2; exit 7"""

    status, out = backend.run_on_host("localhost", script, environ=os.environ, timeout_s=10)

    assert (7, b"it's \"quoted\"\n/bin/sh -s \n") == (status, out)


def test_a_command_of_the_script_that_reads_its_input_cannot_swallow_the_rest():
    """cat in the script reads /dev/null, not the lines after it."""
    status, out = LocalBackend().run_on_host("localhost", "cat\necho after", environ=os.environ, timeout_s=10)

    assert (0, b"after\n") == (status, out)


def test_a_script_that_outlives_its_time_is_killed_with_what_it_started():
    """timeout_s passed: 124, what it printed so far, and its background child is gone too."""
    script = "sleep 300 & echo $!; sleep 300"

    status, out = LocalBackend().run_on_host("localhost", script, environ=os.environ, timeout_s=0.5)

    assert TIMED_OUT == status
    assert gone(int(out))


def gone(pid: int) -> bool:
    """Return whether process ``pid`` has ended (or is a zombie, dead but not yet reaped) within 2 s."""
    for _ in range(200):
        try:
            if Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] in "ZX":
                return True
        except OSError:
            return True
        time.sleep(0.01)
    return False


def test_output_is_kept_up_to_one_mebibyte_and_the_script_is_not_blocked():
    """2 MiB printed: 1 MiB kept, and the script ran to its end (status 0)."""
    status, out = LocalBackend().run_on_host("localhost", "head -c 2097152 /dev/zero; exit 0", environ=os.environ,
                                             timeout_s=20)

    assert (0, MAX_OUTPUT) == (status, len(out))


def test_the_local_backend_refuses_another_host_and_offline_runs_it_here():
    """local: a host that is not this machine is a LaunchError; offline: every host is this machine."""
    with pytest.raises(LaunchError, match="'pod9' is not this machine"):
        LocalBackend().run_on_host("pod9", "true", environ=os.environ, timeout_s=5)

    assert (0, b"here\n") == OfflineBackend().run_on_host("pod9", "echo here", environ=os.environ, timeout_s=5)


def test_every_built_in_backend_offers_host_commands():
    """The registry's backends all have run_on_host; mpirun's reaches other hosts as the ssh backend does."""
    registry: BackendRegistry = default_registry(environ={"POPRUN_NO_PLUGINS": "1"})

    missing = [name for name in registry.names() if not callable(getattr(registry.get(name), "run_on_host", None))]

    assert [] == missing
    assert (0, b"mpirun here\n") == registry.get("mpirun").run_on_host("localhost", "echo mpirun here",
                                                                       environ=os.environ, timeout_s=5)


def test_mpirun_made_without_a_way_to_other_hosts_says_so():
    """MpirunBackend() (not from the registry) runs this machine's commands only."""
    from poprun.backends.mpirun.backend import MpirunBackend

    with pytest.raises(LaunchError, match="without a way to reach other hosts"):
        MpirunBackend().run_on_host("pod9", "true", environ=os.environ, timeout_s=5)
