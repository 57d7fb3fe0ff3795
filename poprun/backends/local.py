"""
The ``local`` backend: every instance of the plan is a child process of poprun.

Layer: ``poprun.backends``; imports ``poprun.planner.plan`` and the backend modules; never
the spec. Each instance runs with exactly its argv and cwd, and the launching environment
minus ``env.unset`` plus ``env.set`` (forwarded names are inherited). Each child leads its
own process group, so teardown reaches what it started, and dies with poprun (Linux
``PR_SET_PDEATHSIG``) even when poprun is killed with SIGKILL.
"""

from __future__ import annotations

import collections
import ctypes
import errno
import os
import queue
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import IO, ClassVar

from poprun.backends.base import (
    NOT_EXECUTABLE,
    NOT_FOUND,
    ApplyResult,
    InstanceFailure,
    LaunchError,
    OutputSink,
    Stream,
)
from poprun.planner.plan import Instance, LaunchPlan

DEFAULT_GRACE_S = 5.0
TAIL_LINES = 20  # lines of each instance's output kept for the failure report
_CHUNK = 1 << 16
_DRAIN_S = 1.0  # how long output may keep flowing after the last instance ended
_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> Callable[[], None] | None:
    """Return a function for ``preexec_fn`` that makes the child die with poprun (Linux only)."""
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # poprun died before the request took effect
            os._exit(1)

    return preexec


def environment(instance: Instance, env_source: Mapping[str, str]) -> dict[str, str]:
    """Return the environment of ``instance``: ``env_source`` minus ``unset`` plus ``set``."""
    env = {k: v for k, v in env_source.items() if k not in instance.env.unset}
    env.update(instance.env.set)
    return env


def executable(instance: Instance, path: str | None) -> str:
    """
    Return the absolute file that runs ``instance.argv[0]``.

    A bare name is looked up on ``path``, then in the instance's working directory (PopRun 2.1
    runs programs there without a ``./`` prefix); a name with ``/`` is taken from the cwd.

    Raises:
        LaunchError: status 127 when the program is not found, 126 when it is not executable.
    """
    name = instance.argv[0]
    found = shutil.which(name, path=path) if "/" not in name else None
    candidate = os.path.abspath(found or os.path.join(instance.cwd, name))
    if not os.path.exists(candidate):
        where = "on PATH or in " + instance.cwd if "/" not in name else candidate
        raise LaunchError(f"program '{name}' not found ({where})", status=NOT_FOUND)
    if os.path.isdir(candidate) or not os.access(candidate, os.X_OK):
        raise LaunchError(f"program '{name}' is not executable ({candidate})", status=NOT_EXECUTABLE)
    return candidate


def _check(instance: Instance) -> None:
    if not instance.argv:
        raise LaunchError(f"instance {instance.index} has no program to run")
    if not os.path.isdir(instance.cwd):
        raise LaunchError(f"working directory '{instance.cwd}' of instance {instance.index} does not exist")


def _start(instance: Instance, env: dict[str, str], preexec: Callable[[], None] | None) -> subprocess.Popen[bytes]:
    program = executable(instance, env.get("PATH", os.defpath))
    try:
        return subprocess.Popen(  # noqa: S603 - running the plan's program is the point
            instance.argv, executable=program, cwd=instance.cwd, env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True, preexec_fn=preexec)
    except OSError as exc:
        status = {errno.ENOENT: NOT_FOUND, errno.EACCES: NOT_EXECUTABLE, errno.ENOEXEC: NOT_EXECUTABLE}
        raise LaunchError(f"cannot run '{instance.argv[0]}': {exc.strerror}",
                          status=status.get(exc.errno or 0, NOT_EXECUTABLE)) from exc


class Output:
    """
    Forwards instance output in whole lines, never cut mid-line.

    Every line goes to the instance's tail and, with ``output_filename``, to mpirun's file
    layout ``<dir>/1/rank.<index>/{stdout,stderr}``; it reaches the sink (tagged
    ``[1,<index>]<stdout>:`` with ``tag``) unless ``only_from_instance`` names another instance.
    """

    def __init__(self, plan: LaunchPlan, sink: OutputSink) -> None:
        self._sink, self._lock = sink, threading.Lock()
        self._tag, self._only = plan.output.tag, plan.output.only_from_instance
        self._tails = {i.index: collections.deque[str](maxlen=TAIL_LINES) for i in plan.instances}
        self._files = _open_files(plan.output.output_filename, [i.index for i in plan.instances])
        self._threads: list[threading.Thread] = []

    def start(self, procs: list[subprocess.Popen[bytes]]) -> None:
        """Start forwarding the stdout and stderr of each instance (``procs`` in index order)."""
        for index, proc in enumerate(procs):
            for stream, pipe in (("stdout", proc.stdout), ("stderr", proc.stderr)):
                thread = threading.Thread(target=self._pump, args=(index, stream, pipe), daemon=True)
                thread.start()
                self._threads.append(thread)

    def _pump(self, index: int, stream: Stream, pipe: IO[bytes]) -> None:
        buffer = bytearray()
        while chunk := os.read(pipe.fileno(), _CHUNK):
            cut = chunk.rfind(b"\n") + 1
            buffer += chunk[:cut] if cut else chunk
            if cut:
                self._emit(index, stream, bytes(buffer))
                buffer = bytearray(chunk[cut:])
        if buffer:
            self._emit(index, stream, bytes(buffer) + b"\n")
        pipe.close()
        file = self._files.pop((index, stream), None)
        if file is not None:
            file.close()

    def _emit(self, index: int, stream: Stream, data: bytes) -> None:
        lines = data.split(b"\n")[:-1]
        self._tails[index].extend(line.decode(errors="replace") for line in lines[-TAIL_LINES:])
        file = self._files.get((index, stream))
        if file is not None:
            file.write(data)
        if self._only is not None and self._only != index:
            return
        if self._tag:
            prefix = b"[1,%d]<%s>:" % (index, stream.encode())
            data = b"".join(prefix + line + b"\n" for line in lines)
        with self._lock:
            self._sink.write(stream, data)

    def join(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` in all for every stream to reach its end."""
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        """Close the output files not closed yet (a launch that failed to start)."""
        for file in list(self._files.values()):
            file.close()
        self._files.clear()

    def tail(self, index: int) -> tuple[str, ...]:
        """Return the last lines of instance ``index``'s output."""
        return tuple(self._tails[index])


def _open_files(directory: str | None, indices: list[int]) -> dict[tuple[int, Stream], IO[bytes]]:
    files: dict[tuple[int, Stream], IO[bytes]] = {}
    if directory is None:
        return files
    try:
        for index in indices:
            folder = os.path.join(directory, "1", f"rank.{index}")
            os.makedirs(folder, exist_ok=True)
            for stream in ("stdout", "stderr"):
                files[index, stream] = open(os.path.join(folder, stream), "wb", buffering=0)  # noqa: SIM115
    except OSError as exc:
        for file in files.values():
            file.close()
        raise LaunchError(f"cannot write output files under '{directory}': {exc.strerror}") from exc
    return files


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass  # the whole group has ended already


class LocalLaunch:
    """The running instances of one plan on this machine; see :class:`~poprun.backends.base.Launch`."""

    def __init__(self, plan: LaunchPlan, procs: list[subprocess.Popen[bytes]], output: Output, *,
                 grace_s: float) -> None:
        self._plan, self._procs, self._output, self._grace_s = plan, procs, output, grace_s
        self._ended: queue.SimpleQueue[tuple[int, int, bool]] = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._timer: threading.Timer | None = None
        self._threads = [threading.Thread(target=self._watch, args=(i, p), daemon=True) for i, p in enumerate(procs)]
        for thread in self._threads:
            thread.start()

    def _watch(self, index: int, proc: subprocess.Popen[bytes]) -> None:
        code = proc.wait()
        self._ended.put((index, code, self._stopping.is_set()))

    def terminate(self, grace_s: float) -> None:
        """Send SIGTERM to every running instance's group now, SIGKILL after ``grace_s``."""
        first = not self._stopping.is_set()
        self._stopping.set()
        if grace_s <= 0:
            self._signal_running(signal.SIGKILL)
        elif first:
            self._signal_running(signal.SIGTERM)
            self._timer = threading.Timer(grace_s, self._signal_running, (signal.SIGKILL,))
            self._timer.daemon = True
            self._timer.start()

    def _signal_running(self, sig: int) -> None:
        for proc in self._procs:
            if proc.returncode is None:
                _signal_group(proc, sig)

    def wait(self) -> ApplyResult:
        """Return once every instance has ended; stop the others at the first failure."""
        ends: list[tuple[int, int, bool]] = []
        while len(ends) < len(self._procs):
            try:
                index, code, stopped = self._ended.get(timeout=0.5)
            except queue.Empty:
                continue
            ends.append((index, code, stopped))
            if code != 0 and not stopped:
                self.terminate(self._grace_s)
        self._finish()
        return self._result(ends)

    def _finish(self) -> None:
        """Let output drain, then kill what the instances left behind in their groups."""
        if self._timer is not None:
            self._timer.cancel()
        self._output.join(_DRAIN_S)
        for proc in self._procs:
            _signal_group(proc, signal.SIGKILL)
        self._output.join(_DRAIN_S)
        self._output.close()

    def _result(self, ends: list[tuple[int, int, bool]]) -> ApplyResult:
        statuses = [0] * len(self._procs)
        failures = []
        for index, code, stopped in ends:
            statuses[index] = code if code >= 0 else 128 - code
            if code != 0:
                failures.append(InstanceFailure(
                    index=index, host=self._plan.instances[index].host, exit_code=code if code > 0 else None,
                    signal=-code if code < 0 else None, stopped=stopped, tail=self._output.tail(index)))
        cause = next((f.index for f in failures if not f.stopped), None)
        return ApplyResult(statuses=tuple(statuses), failures=tuple(failures), root_cause=cause)


def _local_names() -> frozenset[str]:
    name = socket.gethostname()
    return frozenset({"localhost", "127.0.0.1", "::1", name, name.split(".")[0]})


class LocalBackend:
    """Runs every instance as a child process; every instance must be planned for this machine."""

    name: ClassVar[str] = "local"

    def __init__(self, *, grace_s: float = DEFAULT_GRACE_S) -> None:
        self.grace_s = grace_s

    def check_hosts(self, plan: LaunchPlan) -> None:
        """
        Refuse a plan with an instance on another host.

        Raises:
            LaunchError: status 125, naming the first such host.
        """
        local = _local_names()
        remote = next((i.host for i in plan.instances if i.host not in local), None)
        if remote is not None:
            raise LaunchError(f"host '{remote}' is not this machine: the local backend runs instances here only "
                              "(the offline backend runs every instance here whatever its host)")

    def launch(self, plan: LaunchPlan, *, env_source: Mapping[str, str], sink: OutputSink) -> LocalLaunch:
        """Start every instance of ``plan``; raise :class:`LaunchError` when nothing can start."""
        self.check_hosts(plan)
        envs = [environment(i, env_source) for i in plan.instances]
        for instance, env in zip(plan.instances, envs, strict=True):
            _check(instance)
            executable(instance, env.get("PATH", os.defpath))
        output = Output(plan, sink)
        preexec = _die_with_parent()
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for instance, env in zip(plan.instances, envs, strict=True):
                procs.append(_start(instance, env, preexec))
        except LaunchError:
            for proc in procs:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
            output.close()
            raise
        output.start(procs)
        return LocalLaunch(plan, procs, output, grace_s=self.grace_s)
