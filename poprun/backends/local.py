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
import contextlib
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
from pathlib import Path
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


def executable(instance: Instance, env: Mapping[str, str]) -> str:
    """
    Return the file that runs ``instance.argv[0]``, relative to the instance's cwd or absolute.

    A bare name is looked up on the PATH of ``env``, then run as ``./name`` from the instance's
    working directory (PopRun 2.1 runs programs there without a ``./`` prefix); a name with
    ``/`` is taken as it is, from the cwd.

    Raises:
        LaunchError: status 127 when the program is not found, 126 when it is not executable,
            125 when there is no program or no working directory.
    """
    if not instance.argv or not Path(instance.cwd).is_dir():
        what = "no program to run" if not instance.argv else f"no working directory ({instance.cwd} is missing)"
        raise LaunchError(f"instance {instance.index} has {what}")
    name = instance.argv[0]
    found = shutil.which(name, path=env.get("PATH", os.defpath)) if "/" not in name else None
    candidate = Path(found or Path(instance.cwd) / name).absolute()
    if not candidate.exists():
        where = "on PATH or in " + instance.cwd if "/" not in name else str(candidate)
        raise LaunchError(f"program '{name}' not found ({where})", status=NOT_FOUND)
    if candidate.is_dir() or not os.access(candidate, os.X_OK):
        raise LaunchError(f"program '{name}' is not executable ({candidate})", status=NOT_EXECUTABLE)
    return str(candidate) if found else name if "/" in name else "./" + name


def _start(instance: Instance, env: dict[str, str], program: str,
           preexec: Callable[[], None] | None) -> subprocess.Popen[bytes]:
    try:
        # preexec_fn's hazard with threads is running Python that takes locks in the child;
        # ours only calls prctl(2) through a ctypes function loaded beforehand, and getppid.
        return subprocess.Popen(  # noqa: S603 - running the plan's program is the point
            instance.argv, executable=program, cwd=instance.cwd, env=env, stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True,
            preexec_fn=preexec)  # noqa: PLW1509
    except OSError as exc:
        status = {errno.ENOENT: NOT_FOUND, errno.EACCES: NOT_EXECUTABLE, errno.ENOEXEC: NOT_EXECUTABLE}
        raise LaunchError(f"cannot run '{instance.argv[0]}': {exc.strerror}",
                          status=status.get(exc.errno or 0, NOT_EXECUTABLE)) from exc


class Output:
    """
    Forwards instance output in whole lines, never cut mid-line.

    Every line goes to its instance's tail, to mpirun's ``<dir>/1/rank.<index>/{stdout,stderr}`` with
    ``output_filename``, and to the sink (tagged ``[1,<index>]<stdout>:`` with ``tag``) unless
    ``only_from_instance`` names another instance. The sink is written by one thread at a time.
    """

    def __init__(self, plan: LaunchPlan, sink: OutputSink) -> None:
        self._sink, self._lock = sink, threading.Lock()
        self._tag, self._only = plan.output.tag, plan.output.only_from_instance
        self._tails = {i.index: collections.deque[str](maxlen=TAIL_LINES) for i in plan.instances}
        self._files = _open_files(plan.output.output_filename, [i.index for i in plan.instances])
        self._threads: list[threading.Thread] = []

    def start(self, procs: list[subprocess.Popen[bytes]]) -> None:
        """Start forwarding the stdout and stderr of each instance (``procs`` in index order)."""
        self._threads = [threading.Thread(target=self._pump, args=(i, name, getattr(proc, name)), daemon=True)
                         for i, proc in enumerate(procs) for name in ("stdout", "stderr")]
        for thread in self._threads:
            thread.start()

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
        with contextlib.suppress(KeyError):
            self._files.pop((index, stream)).close()

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
        """Close the output files of a launch that failed to start (forwarding closes its own)."""
        for file in self._files.values():
            file.close()

    def tail(self, index: int) -> tuple[str, ...]:
        """Return the last lines of instance ``index``'s output."""
        return tuple(self._tails[index])


def _open_files(directory: str | None, indices: list[int]) -> dict[tuple[int, Stream], IO[bytes]]:
    files: dict[tuple[int, Stream], IO[bytes]] = {}
    if directory is None:
        return files
    try:
        for index in indices:
            folder = Path(directory) / "1" / f"rank.{index}"
            folder.mkdir(parents=True, exist_ok=True)
            for stream in ("stdout", "stderr"):
                files[index, stream] = (folder / stream).open("wb", buffering=0)
    except OSError as exc:
        for file in files.values():
            file.close()
        raise LaunchError(f"cannot write output files under '{directory}': {exc.strerror}") from exc
    return files


def _signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):  # the whole group has ended
        os.killpg(proc.pid, sig)


class LocalLaunch:
    """The running instances of one plan on this machine; see :class:`~poprun.backends.base.Launch`."""

    def __init__(self, plan: LaunchPlan, procs: list[subprocess.Popen[bytes]], output: Output, *,
                 grace_s: float) -> None:
        self._plan, self._procs, self._output, self._grace_s = plan, procs, output, grace_s
        self._ended: queue.SimpleQueue[tuple[int, int, bool]] = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._timer: threading.Timer | None = None
        for index, proc in enumerate(procs):
            threading.Thread(target=self._watch, args=(index, proc), daemon=True).start()

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
            index, code, stopped = self._ended.get()  # signal handlers still run while blocked
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

    def _result(self, ends: list[tuple[int, int, bool]]) -> ApplyResult:
        """Return the result of ``ends`` (index, Popen return code, stopped) in the order seen."""
        failures = tuple(InstanceFailure(index=i, host=self._plan.instances[i].host, exit_code=max(code, 0) or None,
                                         signal=-code if code < 0 else None, stopped=stopped, tail=self._output.tail(i))
                         for i, code, stopped in ends if code != 0)
        statuses = tuple(code if code >= 0 else 128 - code for _, code, _ in sorted(ends))
        cause = next((f.index for f in failures if not f.stopped), None)
        return ApplyResult(statuses=statuses, failures=failures, root_cause=cause)


class LocalBackend:
    """Runs every instance as a child process; every instance must be planned for this machine."""

    name: ClassVar[str] = "local"

    def __init__(self, *, grace_s: float = DEFAULT_GRACE_S) -> None:
        self.grace_s = grace_s

    def check_hosts(self, plan: LaunchPlan) -> None:
        """Raise :class:`LaunchError` (125) naming the first host of the plan that is not this machine."""
        name = socket.gethostname()
        local = {"localhost", "127.0.0.1", "::1", name, name.split(".")[0]}
        remote = next((i.host for i in plan.instances if i.host not in local), None)
        if remote is not None:
            raise LaunchError(f"host '{remote}' is not this machine: the local backend runs instances here only "
                              "(the offline backend runs every instance here whatever its host)")

    def launch(self, plan: LaunchPlan, *, env_source: Mapping[str, str], sink: OutputSink) -> LocalLaunch:
        """Start every instance of ``plan``; raise :class:`LaunchError` when nothing can start."""
        self.check_hosts(plan)
        envs = [environment(i, env_source) for i in plan.instances]
        programs = [executable(i, env) for i, env in zip(plan.instances, envs, strict=True)]
        output = Output(plan, sink)
        preexec = _die_with_parent()
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for instance, env, program in zip(plan.instances, envs, programs, strict=True):
                procs.append(_start(instance, env, program, preexec))
        except LaunchError:
            for proc in procs:
                _signal_group(proc, signal.SIGKILL)
                proc.wait()
            output.close()
            raise
        output.start(procs)
        return LocalLaunch(plan, procs, output, grace_s=self.grace_s)
