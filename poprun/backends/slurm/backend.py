"""
The ``slurm`` backend: inside a Slurm allocation, every instance is a task of one ``srun`` step.

Layer: ``poprun.backends``; imports :mod:`poprun.backends.base`, :mod:`poprun.process`,
``poprun.planner.plan`` and ``poprun.planner.slurm`` (the allocation); never the spec, never
another backend. Its :mod:`.batch` writes the ``sbatch`` script, offered to ``poprun plan
--format sbatch`` and ``poprun submit`` by :meth:`SlurmBackend.formats`. Needs ``srun``, ``squeue`` and ``scancel`` here, and
the Python that runs poprun at the same path on the nodes (a shared software stack).

The step (:func:`srun_command`)::

    SLURM_HOSTFILE=<one host per instance, in index order> POPRUN_SLURM_LAUNCH=<the instances>
    srun --job-name=poprun-<random> --nodes=<hosts> --ntasks=<instances> --distribution=arbitrary
         --label --kill-on-bad-exit=0 --input=0|none [--mpi=PLUGIN] [--overcommit] <python> -I -S -c <WRAPPER>

Task *i* is instance *i* on its planned host: ``--distribution=arbitrary`` places the tasks in
the order of ``SLURM_HOSTFILE``, so ``SLURM_PROCID`` (and the MPI rank under ``--mpi=pmix``,
which the plan chooses for a program that calls MPI: ``plan.mpi.srun_plugin``) is the instance index. Every task runs
the same tiny wrapper (:data:`WRAPPER`, standard library only), which takes its instance's argv,
working directory, environment (unset, then set) and CPU binding from
``POPRUN_SLURM_LAUNCH`` (the plan's instances as zlib-compressed JSON, in base64: the
environment carries it to every node, and no file needs to be shared) and ``exec``s the program,
so the task *is* the instance. ``srun --multi-prog`` was not used: its line-based
configuration cannot carry per-instance environments with arbitrary values (newlines, quotes).
``--overcommit`` is added only when a node would run more instances than it has CPUs in the
allocation (``SLURM_JOB_CPUS_PER_NODE``); otherwise srun would wait for CPUs that never come.

Output: ``--label`` prefixes every line with its task number (``N: ``, right-aligned), and
:class:`LabelSplitter` gives each instance's lines to the :class:`~poprun.process.output.Router`,
which tags, filters and keeps the failure report's tail exactly as for the other backends.
srun splits a line longer than 1024 bytes into labelled pieces of 1024 (an exactly 1024-byte
line is followed by an empty piece); the splitter passes each piece on without its newline, so
that the router joins them again as they come (a line of any length, never held whole here). Lines srun writes itself are
unlabelled; its reports of instances ending (``srun: error: h3: task 4: Exited with exit code 3``)
tell which instance ended and how (:func:`parse_task_ends`) and are not shown, since poprun's
failure report says the same.

Teardown, matching the other backends rather than srun's ``--kill-on-bad-exit=1`` (which
SIGKILLs at once; poprun passes ``=0`` so a site default does not apply): at the first failure
poprun sends every instance SIGTERM (``scancel --signal=TERM`` of the step, found by its
unique name with ``squeue``), and after the grace period SIGTERM to srun, which makes srun kill
the whole step with SIGKILL. If srun has not ended 10 s later, its process group is killed.
If poprun dies, its watchdog kills srun; the step's tasks then end with the allocation (the
``salloc`` or batch script that ran poprun ends with it), as Slurm ends every step of a job.

Known limits: when a step is stopped, srun may exit before it has reported every task
(Slurm 22.05), so the last lines of a stopped instance can be missing and an unreported instance
is shown as stopped by SIGTERM; a temporary executable cache is made on each node by the wrapper
but removed only on poprun's own machine.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import zlib
from collections.abc import Mapping
from pathlib import Path

from poprun.backends.base import (
    NOT_FOUND,
    PROCESSES,
    ApplyResult,
    FormatRequest,
    Gate,
    InstanceEnded,
    OutputSink,
    PlanFormat,
    TemporaryCache,
)
from poprun.backends.slurm.hostcommand import outside_allocation, srun_missing
from poprun.core.diagnostic import launch_error
from poprun.core.exitstatus import CANNOT_LAUNCH, NOT_EXECUTABLE
from poprun.core.span import SourceSpan
from poprun.core.threads import spawn
from poprun.planner.plan import LaunchPlan
from poprun.planner.slurm import from_environ
from poprun.process.files import private_directory, which
from poprun.process.instance import DEFAULT_GRACE_S, directories_to_remove, forwarded_stdin
from poprun.process.launcher import LauncherLaunch, start_launcher
from poprun.process.output import Router
from poprun.process.watchdog import Watchdog

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from typing import ClassVar

    from poprun.backends.base import Stream

    Piece = tuple[int | None, Stream, bytes]

LAUNCH = "POPRUN_SLURM_LAUNCH"
MAX_PAYLOAD = 120_000  # bytes of POPRUN_SLURM_LAUNCH; Linux refuses a variable over 128 KiB (MAX_ARG_STRLEN)
SRUN_PIECE = 1024  # srun --label cuts longer lines into pieces of this many bytes
_SRUN_EXIT_S = 10.0  # after srun is told to kill the step: how long it has before its group is killed
# The wrapper every task runs: its instance from POPRUN_SLURM_LAUNCH by SLURM_PROCID, then exec (the statuses
# formatted in from poprun.core.exitstatus).
WRAPPER = f"""\
import base64, json, os, sys, zlib
e = os.environ
d = json.loads(zlib.decompress(base64.b64decode(e.pop("POPRUN_SLURM_LAUNCH"))))
e.pop("SLURM_HOSTFILE", None)
i = d[int(e["SLURM_PROCID"])]
def fail(status, text):
    sys.stderr.write("poprun: instance %s: %s\\n" % (e["SLURM_PROCID"], text))
    sys.exit(status)
for n in i["unset"]:
    e.pop(n, None)
e.update(i["set"])
if i["cpus"]:
    c = set()
    for r in i["cpus"].split(","):
        a, _, b = r.partition("-")
        c.update(range(int(a), int(b or a) + 1))
    try:
        os.sched_setaffinity(0, c)
    except OSError as x:
        sys.stderr.write("poprun: cannot bind to CPUs %s: %s\\n" % (i["cpus"], x.strerror))
if i["cache"]:
    os.makedirs(i["cache"], mode=0o700, exist_ok=True)
try:
    os.chdir(i["cwd"])
except OSError as x:
    fail({CANNOT_LAUNCH}, "no working directory %s (%s)" % (i["cwd"], x.strerror))
a = i["argv"]
p = a[0]
if "/" not in p and os.access(p, os.X_OK) and not any(
        os.access(os.path.join(q, p), os.X_OK) for q in e.get("PATH", os.defpath).split(os.pathsep)):
    p = "./" + p
try:
    os.execvpe(p, a, e)
except FileNotFoundError:
    fail({NOT_FOUND}, "program '%s' not found" % a[0])
except OSError as x:
    fail({NOT_EXECUTABLE}, "cannot run '%s': %s" % (a[0], x.strerror))
"""
_LABEL = re.compile(rb" *(\d+): ")
_STEP_NOTE = re.compile(rb"slurmstepd(?:-\S+)?: error: \*\*\* (?:STEP|JOB) .* \*\*\*")
_TASK_END = re.compile(r"srun: error: \S+: tasks? ([\d,\-]+): (.*?)\s*$")
_EXITED = re.compile(r"Exited with exit code (\d+)")
_TEARDOWN = re.compile(r"srun: (forcing job termination|Job step aborted|.*[Cc]ancel)")
_SIGNALS = {signal.strsignal(s) or s.name: int(s) for s in signal.Signals}


def srun_command(plan: LaunchPlan, *, srun: str = "srun", python: str = sys.executable, name: str = "poprun",
                 overcommit: bool = False, stdin: bool = False) -> tuple[str, ...]:
    """
    Return the argv of the one ``srun`` step that runs ``plan`` (see the module docstring).

    ``stdin``: srun's own stdin is poprun's, for task 0 alone (``--input=0``; the other tasks
    read ``/dev/null``); else no task reads any (``--input=none``).
    """
    hosts = dict.fromkeys(i.host for i in plan.instances)
    return (srun, f"--job-name={name}", f"--nodes={len(hosts)}", f"--ntasks={len(plan.instances)}",
            "--distribution=arbitrary", "--label", "--kill-on-bad-exit=0", "--input=0" if stdin else "--input=none",
            *([f"--mpi={plan.mpi.srun_plugin}"] if plan.mpi.srun_plugin else []),
            *(["--overcommit"] if overcommit else []), python, "-I", "-S", "-c", WRAPPER)


def encode_instances(plan: LaunchPlan, cache: TemporaryCache | None = None) -> str:
    """
    Return ``POPRUN_SLURM_LAUNCH``: each instance's argv, cwd, environment and CPUs, compressed.

    With ``cache``, each task makes that temporary executable cache on its node first.
    """
    path = cache.path if cache is not None else None
    data = [{"argv": list(i.argv), "cwd": i.cwd, "set": dict(i.env.set), "unset": list(i.env.unset),
             "cpus": i.placement.cpus, "cache": path} for i in plan.instances]
    raw = json.dumps(data, separators=(",", ":")).encode()  # bytes that are not UTF-8 as \udcXX: read back exactly
    return base64.b64encode(zlib.compress(raw, 9)).decode("ascii")


def needs_overcommit(plan: LaunchPlan, environ: Mapping[str, str]) -> bool:
    """Return whether a node of the allocation would run more instances than it has CPUs."""
    allocation = from_environ(environ)
    if allocation is None or not allocation.cpus_per_node:
        return False
    cpus = dict(zip(allocation.nodes, allocation.cpus_per_node, strict=True))
    counts: dict[str, int] = {}
    for instance in plan.instances:
        counts[instance.host] = counts.get(instance.host, 0) + 1
    return any(count > cpus.get(host, count) for host, count in counts.items())


class LabelSplitter:
    """
    Splits what srun ``--label`` writes to one pipe into each task's lines (see the module docstring).

    :meth:`feed` returns pieces ``(index, stream, data)``: ``data`` is whole lines with the
    labels removed; ``index`` None for srun's own (unlabelled) lines, and for Slurm's notes
    about the step (``slurmstepd-h1: error: *** STEP 12.0 ... CANCELLED ... ***``), which arrive
    labelled but are not the instance's.
    """

    def __init__(self, stream: Stream) -> None:
        self._stream = stream
        self._rest = b""

    def feed(self, chunk: bytes) -> list[Piece]:
        """Take ``chunk``, just read from the pipe; return the lines it completes."""
        data = self._rest + chunk
        cut = data.rfind(b"\n") + 1
        self._rest = data[cut:]
        out: list[Piece] = []
        for line in data[:cut].split(b"\n")[:-1]:
            self._line(line, out)
        return out

    def end(self) -> list[Piece]:
        """Take the end of the pipe; return what is left (the router ends a line srun cut and did not finish)."""
        out: list[Piece] = []
        if self._rest:
            self._line(self._rest, out)
            self._rest = b""
        return out

    def _line(self, line: bytes, out: list[Piece]) -> None:
        found = _LABEL.match(line)
        if found is None:
            _add(out, None, self._stream, line + b"\n")
            return
        index, body = int(found[1]), line[found.end():]
        if _STEP_NOTE.fullmatch(body):
            _add(out, None, self._stream, body + b"\n")
            return
        # a piece of a line srun cut goes on without newline: the router joins it to the rest as it comes
        _add(out, index, self._stream, body if len(body) == SRUN_PIECE else body + b"\n")


def _add(out: list[Piece], index: int | None, stream: Stream, data: bytes) -> None:
    """Append ``data`` to ``out``, to the last piece when it is of the same instance."""
    if out and out[-1][0] == index:
        out[-1] = (index, stream, out[-1][2] + data)
    else:
        out.append((index, stream, data))


def parse_task_ends(line: str) -> list[tuple[int, int | None, int | None]]:
    """
    Return ``(index, exit_code, signal)`` of each task that srun's line reports as ended badly; ``[]`` for other lines.

    srun 22.05 writes ``srun: error: h2: tasks 2-3: Exited with exit code 7`` and
    ``srun: error: h3: task 4: Killed`` (the signal's description, as ``strsignal`` gives it).
    """
    found = _TASK_END.match(line)
    if found is None:
        return []
    how = found[2].removesuffix(" (core dumped)")
    exited = _EXITED.fullmatch(how)
    if exited is None and how not in _SIGNALS:
        return []
    how_ended = (int(exited[1]), None) if exited else (None, _SIGNALS[how])
    ends: list[tuple[int, int | None, int | None]] = []
    for item in found[1].split(","):
        first, _, last = item.partition("-")
        ends.extend((index, *how_ended) for index in range(int(first), int(last or first) + 1))
    return ends


class SlurmLaunch(LauncherLaunch):
    """The running srun step of one plan; see :class:`~poprun.process.launcher.LauncherLaunch`."""

    thread_name = "poprun-slurm"

    def __init__(self, plan: LaunchPlan, proc: subprocess.Popen[bytes], *, watchdog: Watchdog, router: Router,
                 sink: OutputSink, grace_s: float, step: tuple[str, str], env: Mapping[str, str],
                 remove: tuple[str, ...] = (), gate: Gate | None = None) -> None:
        self._step, self._env = step, env
        self._gentle = False
        self._killed_at: float | None = None
        self._ends: dict[int, InstanceEnded] = {}
        self._order: list[int] = []
        super().__init__(plan, proc, watchdog=watchdog, router=router, sink=sink, grace_s=grace_s, remove=remove,
                         gate=gate)

    def _splitter(self, stream: Stream) -> LabelSplitter:
        return LabelSplitter(stream)

    def _stop_gently(self) -> None:
        """SIGTERM every instance through ``scancel``, from the reading thread: a signal handler must not wait."""
        self._gentle = True

    def _kill(self) -> None:
        """Have srun kill the step (SIGTERM to srun); kill srun's group if it has not ended in 10 s."""
        self._kill_at = None
        if self._killed_at is None:
            self._killed_at = time.monotonic()
            with contextlib.suppress(ProcessLookupError):
                self._proc.send_signal(signal.SIGTERM)

    def _timeout(self) -> float | None:
        deadlines = [t for t in (self._kill_at, self._killed_at and self._killed_at + _SRUN_EXIT_S) if t]
        return max(0.0, min(deadlines) - time.monotonic()) if deadlines else None

    def _due(self) -> None:
        """Do what is due: the gentle stop asked for, the kill after the grace, the group's kill after that."""
        with self._lock:
            if self._gentle:
                self._gentle = False
                spawn(self._signal_step, name="poprun-scancel")
            now = time.monotonic()
            if self._kill_at is not None and now >= self._kill_at:
                self._kill()
            if self._killed_at is not None and now >= self._killed_at + _SRUN_EXIT_S:
                self._watchdog.signal(signal.SIGKILL)

    def _signal_step(self) -> None:
        """Send the step's tasks SIGTERM: ``scancel --signal=TERM JOB.STEP`` (the step found by its name)."""
        job, name = self._step
        try:
            listed = subprocess.run(["squeue", "-h", "-s", "-j", job, "-o", "%i %j"], capture_output=True,  # noqa: S603, S607
                                    text=True, env=self._env, timeout=10, check=False).stdout
            steps = [line.split()[0] for line in listed.splitlines() if line.split()[1:] == [name]]
            if steps:
                subprocess.run(["scancel", "-Q", "--signal=TERM", steps[0]], capture_output=True,  # noqa: S603, S607
                               env=self._env, timeout=10, check=False)
                return
        except (OSError, subprocess.SubprocessError):
            pass
        with self._lock:  # no step to signal: kill instead
            if not self._finished:
                self._kill()

    def _own(self, stream: Stream, data: bytes) -> None:
        """Srun's own lines: reports of instances ending are noted, not shown; so is the noise of a stop."""
        shown = []
        for line in data.decode(errors="replace").splitlines(keepends=True):
            ends = parse_task_ends(line)
            for index, exit_code, sig in ends:
                self._ended(index, exit_code, sig)
            if not ends and not (self._stopping and (_TEARDOWN.match(line) or _STEP_NOTE.search(line.encode()))):
                shown.append(line)
        if shown:
            self._router.flush()
            self._sink.write(stream, "".join(shown).encode())

    def _ended(self, index: int, exit_code: int | None, sig: int | None) -> None:
        if not 0 <= index < len(self._plan.instances) or index in self._ends:
            return
        end = InstanceEnded(index=index, pid=self._proc.pid, exit_code=exit_code, signal=sig, stopped=self._stopping)
        self._ends[index] = end
        self._order.append(index)
        self._event(end)
        if not end.stopped:
            if end.status != 0:
                self._await_gate()
            self.terminate(self._grace_s)

    def _make_result(self, code: int, *, stopped: bool) -> ApplyResult:
        """Return the result: each instance as srun reported it; an unreported one exited 0, or was stopped."""
        count = len(self._plan.instances)
        if code != 0 and not self._ends and not stopped:  # srun failed, not an instance: its status is instance 0's
            self._ended(0, None if code < 0 else code, -code if code < 0 else None)
        for index in range(count):
            if index not in self._ends:
                ok = code == 0 or not (stopped or self._stopping)
                end = InstanceEnded(index=index, pid=self._proc.pid, exit_code=0 if ok else None,
                                    signal=None if ok else signal.SIGTERM, stopped=not ok)
                self._ends[index] = end
                self._order.append(index)
                self._event(end)
        return self._result_of([self._ends[i] for i in self._order])


class SlurmBackend:
    """Runs the plan as one srun step inside the Slurm allocation poprun runs in."""

    name: ClassVar[str] = "slurm"
    capabilities: ClassVar[frozenset[str]] = frozenset({PROCESSES})  # a task finds a missing directory itself

    def __init__(self, *, grace_s: float = DEFAULT_GRACE_S) -> None:
        self.grace_s = grace_s

    def unavailable_hosts(self, hosts: tuple[str, ...], *, environ: Mapping[str, str]) -> Mapping[str, str]:
        """Return the nodes of ``hosts`` that Slurm drained or marked down (:class:`~poprun.backends.base.HostStates`)."""
        from poprun.backends.slurm.hostcommand import unavailable_nodes

        return unavailable_nodes(hosts, environ=environ)

    def run_on_host(self, host: str, script: str, *, environ: Mapping[str, str],
                    timeout_s: float) -> tuple[int, bytes]:
        """Run ``script`` on node ``host`` in a step of its own (:mod:`.hostcommand`), or here when it is this machine."""
        from poprun.backends.slurm.hostcommand import run_on_host

        return run_on_host(host, script, environ=environ, timeout_s=timeout_s)

    def formats(self) -> Mapping[str, PlanFormat]:
        """Return ``sbatch``: the batch script of ``poprun submit`` (:func:`.batch.render_batch_script`)."""
        return {"sbatch": _sbatch}

    def launch(self, plan: LaunchPlan, *, env_source: Mapping[str, str], sink: OutputSink,
               cache: TemporaryCache | None = None, gate: Gate | None = None) -> SlurmLaunch:
        """
        Start the srun step of ``plan``; return without waiting.

        ``gate`` is awaited after a task's failure is told, before the step is stopped
        (:data:`~poprun.backends.base.Gate`).

        ``cache`` is made by each task on its node (:func:`encode_instances`), and, when to be
        removed at the end, removed on this machine only (see the module docstring).

        Raises:
            LaunchError: 125 outside an allocation, or when the instances do not fit in the
                environment; 127 when ``srun`` is not on PATH.
        """
        source = dict(env_source)
        job = source.get("SLURM_JOB_ID", "")
        if not job:
            raise outside_allocation("the slurm backend runs inside a Slurm allocation, and SLURM_JOB_ID is not set: "
                                     "run poprun under salloc or sbatch, or use 'poprun submit'")
        srun = which("srun", source.get("PATH", os.defpath))
        if srun is None:
            raise srun_missing("srun not found on PATH: the slurm backend needs Slurm's client commands",
                               status=NOT_FOUND)
        payload = encode_instances(plan, cache)
        if len(payload) > MAX_PAYLOAD:
            raise launch_error("PR438", "instances too large for srun's environment",
                               detail=f"the plan's {len(plan.instances)} instances take {len(payload)} bytes, more "
                                      f"than the environment carries ({MAX_PAYLOAD}): use fewer instances or variables",
                               span=SourceSpan.environment(LAUNCH),
                               hint="every task of the srun step reads its instance (argv, working directory, "
                                    "variables) from one variable of at most 128 KiB: use fewer instances, shorter "
                                    "arguments or fewer -x variables, or another backend")
        name = f"poprun-{secrets.token_hex(4)}"
        folder = private_directory("poprun-slurm-")
        hostfile = Path(folder, "hosts")
        hostfile.write_text("".join(f"{i.host}\n" for i in plan.instances), encoding="utf-8")
        stdin = forwarded_stdin()
        argv = srun_command(plan, srun=srun, name=name, overcommit=needs_overcommit(plan, source),
                            stdin=stdin is not None)
        env = source | {"SLURM_HOSTFILE": str(hostfile), LAUNCH: payload}
        remove = (*directories_to_remove(cache), folder)
        router = Router(plan, sink)
        proc, watchdog = start_launcher(argv, env=env, group_env=source, remove=remove, router=router,
                                        cleanup=(folder,), stdin=stdin)
        return SlurmLaunch(plan, proc, watchdog=watchdog, router=router, sink=sink, grace_s=self.grace_s,
                           step=(job, name), env=source, remove=remove, gate=gate)


def _sbatch(plan: LaunchPlan, request: FormatRequest) -> str:
    """Return the ``sbatch`` script that reruns ``request.command`` in an allocation shaped for ``plan``."""
    from poprun.backends.slurm.batch import render_batch_script

    return render_batch_script(plan, command=request.command, nodelist=request.hosts)


__all__ = ["LabelSplitter", "SlurmBackend", "SlurmLaunch", "encode_instances",
           "parse_task_ends", "srun_command"]
