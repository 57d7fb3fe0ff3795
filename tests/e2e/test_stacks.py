"""Stacks of hung instances on this machine: py-spy's dump, else faulthandler's (no core file), else why not."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from poprun.apply.stacks import FAULTHANDLER, collect_stacks
from poprun.backends.conformance import MemorySink
from poprun.backends.local import LocalBackend
from tests.e2e.stacks_helpers import hang_plan, wait_ready

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(90)]
BASE_PYTHON = os.path.realpath(sys.executable)  # no py-spy beside it (py-spy is in the virtual environment)
NO_PY_SPY = ":".join(d for d in os.environ.get("PATH", "").split(":") if not Path(d, "py-spy").exists())


@pytest.fixture
def run_id() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def cores_allowed() -> Iterator[None]:
    """Let instances write core files (the soft limit at the hard one), so that 'no core file' means something."""
    soft, hard = resource.getrlimit(resource.RLIMIT_CORE)
    resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_CORE, (soft, hard))


def launched(tmp_path: Path, run_id: str, **kwargs: object):
    plan = hang_plan(tmp_path, backend="local", hosts=("localhost",), run_id=run_id, **kwargs)  # type: ignore[arg-type]
    sink = MemorySink()
    launch = LocalBackend(grace_s=1).launch(plan, env_source=dict(os.environ), sink=sink)
    wait_ready(sink, len(plan.instances))
    return launch, sink


def test_py_spy_shows_every_instance_in_the_function_it_hangs_in(tmp_path, run_id):
    """Each instance's text holds py-spy's dump: its thread, in hang_here; the hostile name is shown, not obeyed."""
    launch, _ = launched(tmp_path, run_id)
    try:
        found = collect_stacks(LocalBackend(), {0: "localhost", 1: "localhost"}, run_id, environ=os.environ,
                               timeout_s=30, skip_pid=os.getpid())
    finally:
        launch.terminate(0)
        launch.wait()

    assert [0, 1] == sorted(found)
    for text in found.values():
        assert "hang_here (<string>:6)" in text, text
        assert "Thread" in text
    assert "pid " in found[1]
    assert "(x?proc 9 0 $(id), state" in found[1]  # its name as the kernel keeps it (15 bytes), shown, never run
    assert not (tmp_path / "uid=0(root)").exists()


def test_without_py_spy_faulthandler_writes_the_stack_to_stderr_and_no_core_file(tmp_path, run_id, cores_allowed):
    """py-spy hidden, PYTHONFAULTHANDLER set: the text says where, stderr holds hang_here, the cwd holds no core."""
    launch, sink = launched(tmp_path, run_id, python=BASE_PYTHON, instances=1, extra=(("PYTHONFAULTHANDLER", "1"),))
    try:
        found = collect_stacks(LocalBackend(), {0: "localhost"}, run_id, environ=os.environ | {"PATH": NO_PY_SPY},
                               timeout_s=30, skip_pid=os.getpid())
        result = launch.wait()
    finally:
        launch.terminate(0)
        launch.wait()

    assert FAULTHANDLER in found[0]
    assert "in hang_here" in sink.data("stderr").decode(), sink.written
    assert (134,) == result.statuses  # faulthandler then lets SIGABRT end it
    assert [] == [p.name for p in tmp_path.iterdir() if p.name.startswith("core")]


def test_without_py_spy_or_faulthandler_the_text_says_why(tmp_path, run_id):
    """Neither way is there: the process is listed with the reason, and left running."""
    launch, _ = launched(tmp_path, run_id, python=BASE_PYTHON, instances=1)
    try:
        found = collect_stacks(LocalBackend(), {0: "localhost", 3: "localhost"}, run_id,
                               environ=os.environ | {"PATH": NO_PY_SPY}, timeout_s=30, skip_pid=os.getpid())
    finally:
        launch.terminate(0)
        launch.wait()

    assert "py-spy is not installed on the host and PYTHONFAULTHANDLER is not set" in found[0]
    assert "state S (sleeping)" in found[0]
    assert "no process of instance 3 found on localhost" in found[3]


def test_a_run_id_that_is_not_one_is_refused():
    """A run id with shell text never reaches a script."""
    with pytest.raises(ValueError, match="is not a run id"):
        collect_stacks(LocalBackend(), {0: "localhost"}, "x'; reboot; '", environ=os.environ, timeout_s=5)


def test_a_backend_that_cannot_reach_the_host_gives_a_line_not_an_exception():
    """A host the backend cannot run commands on: a line per instance saying so."""
    found = collect_stacks(LocalBackend(), {0: "pod9", 1: "pod9"}, "r1", environ=os.environ, timeout_s=5)

    assert {0: "pod9 did not answer: host 'pod9' is not this machine: the local backend runs commands here only",
            1: "pod9 did not answer: host 'pod9' is not this machine: the local backend runs commands here only"} == found


def test_a_python_that_ignores_pythonfaulthandler_is_never_signalled(run_id):
    """python -I (mpirun's output relay runs so) ignores PYTHONFAULTHANDLER: SIGABRT would kill it, so none is sent."""
    env = os.environ | {"POPRUN_RUN_ID": run_id, "POPDIST_INSTANCE_INDEX": "0", "PYTHONFAULTHANDLER": "1"}
    with subprocess.Popen([BASE_PYTHON, "-I", "-S", "-c", "import time; print(1, flush=True); time.sleep(60)"],
                          env=env, stdout=subprocess.PIPE) as isolated:
        try:
            assert isolated.stdout is not None
            isolated.stdout.readline()
            found = collect_stacks(LocalBackend(), {0: "localhost"}, run_id, environ=os.environ | {"PATH": NO_PY_SPY},
                                   timeout_s=30, skip_pid=os.getpid())
            alive = isolated.poll() is None
        finally:
            isolated.kill()

    assert "it runs with python -I or -E, which ignores PYTHONFAULTHANDLER" in found[0], found
    assert alive


def test_mpirun_instances_show_their_stacks(tmp_path, run_id):
    """Under the mpirun backend (this machine): each instance's stack, found by the run id mpirun passed on."""
    from poprun.backends.registry import default_registry

    backend = default_registry(environ={"POPRUN_NO_PLUGINS": "1"}).get("mpirun")
    plan = hang_plan(tmp_path, backend="mpirun", hosts=("localhost",), run_id=run_id)
    sink = MemorySink()
    launch = backend.launch(plan, env_source=dict(os.environ) | {"OMPI_ALLOW_RUN_AS_ROOT": "1",
                                                                 "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}, sink=sink)
    try:
        wait_ready(sink, 2)
        found = collect_stacks(backend, {0: "localhost", 1: "localhost"}, run_id, environ=os.environ, timeout_s=30,
                               skip_pid=os.getpid())
    finally:
        launch.terminate(0)
        launch.wait()

    for text in found.values():
        assert "hang_here (<string>:6)" in text, text
