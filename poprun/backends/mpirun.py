"""
The ``mpirun`` backend: OpenMPI's ``mpirun`` starts every instance, as real poprun had it do.

Layer: ``poprun.backends``; imports the backend modules, ``poprun.planner.mpicommand`` (the
command, which ``poprun plan --explain`` shows too) and ``poprun.planner.plan``; never the spec.

poprun runs the one command of :func:`~poprun.planner.mpicommand.mpirun_command` (global args
first, ``--bind-to none``, ``--tag-output``, ``-H host:slots``, one app context per instance,
so MPI rank = instance index) as its child, in the process group of a
:class:`~poprun.backends.watchdog.Watchdog`, and reads its two pipes: mpirun's tags
(``--tag-output``, always) tell which instance wrote each line
(:class:`~poprun.backends.mpiout.TagSplitter`), and the :class:`~poprun.backends.output.Router`
forwards each instance's lines as the local backend does (tagged or not, only one instance's,
the failure report's tail). mpirun's own messages are passed on as they come. Known limit,
OpenMPI 4.1.4's: under ``--tag-output`` it drops part of bulk output made of very short lines
(see :mod:`poprun.planner.mpicommand`); the local and ssh backends have no such problem.
With ``--output-filename`` in the global arguments mpirun writes the files itself (its layout
is the one the local backend copies).

Lifecycle: when an instance fails, mpirun stops the others and exits; its message says which
instance failed first and how (:func:`~poprun.backends.mpiout.parse_failure`), which becomes
the root cause, the others being reported as stopped. To stop the launch poprun sends mpirun
SIGTERM (mpirun passes it on to every instance and tears its daemons down), then SIGKILL to the
whole group after the grace period; on other hosts, mpirun's daemons end their instances when
they lose mpirun. If poprun dies, even by SIGKILL, the watchdog kills mpirun.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping

from poprun.backends.base import NOT_FOUND, ApplyResult, InstanceEnded, LaunchError, OutputSink
from poprun.backends.files import which
from poprun.backends.launcher import LauncherLaunch, start_launcher
from poprun.backends.local import DEFAULT_GRACE_S, temporary_directories
from poprun.backends.mpiout import TagSplitter, parse_failure
from poprun.backends.output import Router
from poprun.backends.watchdog import Watchdog
from poprun.core.record import evolve
from poprun.planner.mpicommand import mpirun_command
from poprun.planner.plan import LaunchPlan

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from typing import ClassVar

    from poprun.backends.base import Stream

_OWN_TEXT = 1 << 16  # how much of mpirun's own messages is kept to find the failure in


class MpirunLaunch(LauncherLaunch):
    """The running ``mpirun`` of one plan; see :class:`~poprun.backends.launcher.LauncherLaunch`."""

    thread_name = "poprun-mpirun"

    def __init__(self, plan: LaunchPlan, proc: subprocess.Popen[bytes], *, watchdog: Watchdog, router: Router,
                 sink: OutputSink, grace_s: float, remove: tuple[str, ...] = ()) -> None:
        self._messages = bytearray()  # mpirun's own stderr, the last _OWN_TEXT bytes: where the failure is named
        super().__init__(plan, proc, watchdog=watchdog, router=router, sink=sink, grace_s=grace_s, remove=remove)

    def _splitter(self, stream: Stream) -> TagSplitter:
        return TagSplitter(stream)

    def _own(self, stream: Stream, data: bytes) -> None:
        """Untagged: mpirun's own words, passed on as they are."""
        super()._own(stream, data)
        if stream == "stderr":  # mpirun's messages: kept to find the failing instance in
            self._messages += data
            del self._messages[:-_OWN_TEXT]

    def _make_result(self, code: int, *, stopped: bool) -> ApplyResult:
        """Return the result: the instance mpirun names as failing first is the root cause, the others stopped."""
        count = len(self._plan.instances)
        found = parse_failure(self._messages.decode(errors="replace")) if code != 0 else None
        if code == 0:
            ends = [InstanceEnded(index=i, pid=self._proc.pid, exit_code=0) for i in range(count)]
        elif found is not None and 0 <= found[0] < count and not stopped:
            first, exit_code, sig = found
            ends = [InstanceEnded(index=first, pid=self._proc.pid, exit_code=exit_code, signal=sig)]
            ends += [InstanceEnded(index=i, pid=self._proc.pid, signal=signal.SIGTERM, stopped=True)
                     for i in range(count) if i != first]
        else:  # stopped by poprun, or a failure mpirun did not pin on one instance: it is mpirun's own status
            ends = [InstanceEnded(index=0, pid=self._proc.pid, stopped=stopped, signal=-code if code < 0 else None,
                                  exit_code=code if code >= 0 else None)]
            ends += [InstanceEnded(index=i, pid=self._proc.pid, signal=signal.SIGTERM, stopped=True)
                     for i in range(1, count)]
        for end in ends:
            self._event(end)
        return self._result_of(ends)


class MpirunBackend:
    """Runs the plan with OpenMPI's ``mpirun``: every host, this one too, through mpirun's own launch."""

    name: ClassVar[str] = "mpirun"

    def __init__(self, *, grace_s: float = DEFAULT_GRACE_S) -> None:
        self.grace_s = grace_s

    def launch(self, plan: LaunchPlan, *, env_source: Mapping[str, str], sink: OutputSink) -> MpirunLaunch:
        """
        Start mpirun with the plan's command; return without waiting.

        Raises:
            LaunchError: 127 when ``mpirun`` is not on PATH, 125 when it cannot be started.
        """
        source = dict(env_source)
        mpirun = which("mpirun", source.get("PATH", os.defpath))
        if mpirun is None:
            raise LaunchError("mpirun not found on PATH: install OpenMPI (Debian: apt-get install openmpi-bin) "
                              "or use another backend", status=NOT_FOUND)
        argv = mpirun_command(plan, mpirun=mpirun, environ=source)
        remove = temporary_directories(plan)
        # mpirun writes --output-filename's files itself: the router only forwards
        router = Router(evolve(plan, output=evolve(plan.output, output_filename=None)), sink)
        proc, watchdog = start_launcher(argv, env=source, group_env=source, remove=remove, router=router)
        return MpirunLaunch(plan, proc, watchdog=watchdog, router=router, sink=sink, grace_s=self.grace_s,
                            remove=remove)
