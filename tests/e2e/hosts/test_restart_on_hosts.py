"""Restarting one remote instance alone (``--restart-scope instance``) with the ssh backend, on the real test hosts."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from poprun.backends.base import InstanceStarted, TemporaryCache
from poprun.backends.conformance import EventSink, RestartOnce, probe_plan
from poprun.backends.ssh.backend import SshBackend
from poprun.process.files import private_directory
from tests.e2e.hosts.test_adversarial_ssh import private_tmp_h4  # noqa: F401 - a fixture
from tests.e2e.hosts.test_ssh_backend import marked_anywhere, wait_for
from tests.testhosts import TestHosts

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(120)]

# Instance 1 fails on its first run; started again, it says whether its temporary cache is there.
# Instance 0 runs on for 2 s meanwhile.
CODE = ("import os, sys, time; i = os.environ['POPDIST_INSTANCE_INDEX']; n = os.environ.get('POPRUN_RESTART_COUNT')\n"
        "cache = os.environ.get('POPDIST_EXECUTABLE_CACHE_PATH', '')\n"
        "if i == '0': time.sleep(2); sys.exit(0)\n"
        "print('run', n, os.path.isdir(cache), flush=True); sys.exit(0 if n == '1' else 5)\n"
        "# {mark}")


def test_a_remote_instance_starts_again_and_leaves_nothing_on_its_host(test_hosts: TestHosts, tmp_path: Path,
                                                                       private_tmp_h4: Path) -> None:  # noqa: F811
    """
    Instance 1, alone on h4 (its own /tmp), fails and starts again through a new session: its run has the
    temporary cache that the failed run's end removed, made again; at the end no process of the launch and no
    directory of poprun's is left on h4, nor the cache here.
    """
    # GIVEN instance 0 on h3, instance 1 on h4, a temporary cache made here
    mark = f"poprun-mark-{uuid.uuid4().hex[:8]}"
    (tmp_path / "h4").mkdir()
    cache = private_directory("poprun-cache-")
    sink = EventSink()
    env = dict(os.environ) | test_hosts.env()
    plan = probe_plan(CODE.format(mark=mark), tmp_path, backend="ssh", hosts=("h3", "h4"), environ=env)

    # WHEN
    launch = SshBackend().launch(plan, env_source=env, sink=sink,
                                 cache=TemporaryCache(path=cache, remove_at_exit=True), restarter=RestartOnce())
    result = launch.wait()

    # THEN
    assert (0, (0, 0)) == (result.status, result.statuses), sink.data("stderr")
    assert ["run None True", "run 1 True"] == [line for line in sink.lines() if line.startswith("run")]
    assert [(0, 0), (1, 0), (1, 1)] == [(e.index, e.restart) for e in sink.events if isinstance(e, InstanceStarted)]
    assert wait_for(lambda: not marked_anywhere(test_hosts, mark), within_s=3), marked_anywhere(test_hosts, mark)
    assert wait_for(lambda: not any(private_tmp_h4.glob("poprun-*")), within_s=3), list(private_tmp_h4.iterdir())
    assert not Path(cache).exists()


def test_a_restarted_remote_instance_hears_the_heartbeat(test_hosts: TestHosts, tmp_path: Path) -> None:
    """With a host timeout of 3 s, the restarted instance runs 4.5 s: its new session gets poprun's heartbeat, so it lives."""
    code = ("import os, sys, time; i = os.environ['POPDIST_INSTANCE_INDEX']; n = os.environ.get('POPRUN_RESTART_COUNT')\n"
            "sys.exit(5) if i == '1' and n is None else time.sleep(4.5 if i == '1' else 0); print('done', i, n)")
    sink = EventSink()
    env = dict(os.environ) | test_hosts.env() | {"POPRUN_HOST_TIMEOUT": "3"}
    launch = SshBackend().launch(probe_plan(code, tmp_path, backend="ssh", hosts=("h1", "h2"), environ=env),
                                 env_source=env, sink=sink, restarter=RestartOnce())

    result = launch.wait()

    assert (0, (0, 0)) == (result.status, result.statuses), sink.data("stderr")
    assert ["done 0 None", "done 1 1"] == sorted(sink.lines())


def test_a_stop_reaches_the_restarted_remote_instance_gently(test_hosts: TestHosts, tmp_path: Path) -> None:
    """terminate() once instance 1 (h2) runs again: its new session passes SIGTERM on; nothing is left on any host."""
    mark = f"poprun-mark-{uuid.uuid4().hex[:8]}"
    code = ("import os, sys, time; i = os.environ['POPDIST_INSTANCE_INDEX']; n = os.environ.get('POPRUN_RESTART_COUNT')\n"
            f"sys.exit(5) if i == '1' and n is None else time.sleep(60)  # {mark}")

    class Stopper(EventSink):
        def event(self, event: object) -> None:
            super().event(event)  # type: ignore[arg-type]
            if isinstance(event, InstanceStarted) and event.restart:
                launch.terminate(10.0)

    sink = Stopper()
    env = dict(os.environ) | test_hosts.env()
    launch = SshBackend().launch(probe_plan(code, tmp_path, backend="ssh", hosts=("h1", "h2"), environ=env),
                                 env_source=env, sink=sink, restarter=RestartOnce())

    result = launch.wait()

    assert ((143, 143), [0, 1]) == (result.statuses, sorted(f.index for f in result.failures if f.stopped))
    assert wait_for(lambda: not marked_anywhere(test_hosts, mark), within_s=3), marked_anywhere(test_hosts, mark)
