"""
Diagnostics: every user error and warning, with a stable code, a place and a hint.

Layer: ``poprun.core``; imports only ``poprun.core.record``, ``poprun.core.span`` and
``poprun.core.exitstatus``.

Codes are stable and never reused: ``PR1xx`` syntax (flags, TOML, DSL, host lists),
``PR2xx`` validation, ``PR3xx`` solving, ``PR4xx`` backends and apply, ``PR5xx`` partitions,
``PR6xx`` run records (``poprun ps``, ``logs``, ``report``, ``stop``, ``attach``, ``--detach``). Each code in
:data:`CODES` has a page in ``docs/errors/`` and a test that triggers it.

The exceptions poprun raises, all of them (the model is httpx's ``_exceptions.py``)::

    BaseException ── Stopped                    apply: a stop before the launch (poprun.apply)
    Exception
     ├── DiagnosticError                        coded; exit 2 when planning, 125/126/127 at apply
     │    ├── UnknownBackendError (+KeyError)   PR400, PR402 (poprun.backends.registry)
     │    ├── RunStateError                     PR603, PR604, PR607, PR608, PR618: exit 1 (poprun.runs.api)
     │    ├── HostLostError                     PR411 per host a launch lost while it ran (mpirun's wait)
     │    └── LaunchError ── PreflightError     nothing ran; carries the status (125, 126, 127) and
     │                                          its PR4xx diagnostics (PR405-PR409 per host: preflight)
     ├── ProviderError ── UnreachableError, MalformedAnswerError, NotFoundError, ExistsError,
     │                    CapacityError, InUseError → PR5xx (poprun.partitions.provider)
     ├── OSError ── WatchdogError, RecordError  a record that cannot be made is a warning
     ├── ValueError ── HostlistError, InvalidValueError, PlacementError, ShapeError,
     │                 RawBytesError: internal, each turned into a diagnostic where it is caught
     ├── AttributeError ── FrozenRecordError    a programmer's error: records are frozen
     ├── CancelledError                         a host command ended by its cancelled Scope: the health
     │                                          check's stop (poprun.process.hostscript)
     └── Refusal                                the V-IPU emulator's HTTP answer, not a failure

- :class:`DiagnosticError` is what a stage raises once, at its end, with every problem it
  found (:class:`Diagnostics` collects them); the CLI exits with status 2 for it
  (:mod:`poprun.core.exitstatus`).
- :class:`LaunchError` is what a backend raises from ``launch`` (or ``run_on_host``) when
  nothing of the plan runs: its ``status`` is poprun's (125, 126 or 127), its ``message`` one
  line (what ``str()`` gives, and what a restart that fails tells), its ``diagnostics`` the
  coded form shown to the user (:func:`launch_error` makes both from one diagnostic). The
  apply step maps it, at one boundary, to the result's
  :class:`~poprun.core.outcome.ApplyError`; met outside apply, the CLI exits with its status.
  :class:`PreflightError` (the ssh preflight's) holds one diagnostic per host that cannot run
  the plan, and :class:`HostLostError` one per host a launch lost while it ran; both name their
  hosts (``hosts``), which a membership policy leaves out of the next attempt.
- The ``ValueError`` family is raised by pure functions that know no place; the caller that
  knows the place turns them into a diagnostic (``raise ... from exc``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Sequence

from poprun.core.exitstatus import CANNOT_LAUNCH
from poprun.core.record import record
from poprun.core.span import SourceSpan

CODES: dict[str, str] = {
    "PR100": "TOML syntax error",
    "PR101": "unknown option",
    "PR102": "ambiguous option",
    "PR103": "invalid host list",
    "PR104": "option needs a value",
    "PR105": "invalid value",
    "PR106": "host list split by a space",
    "PR107": "unbalanced quotes",
    "PR108": "DSL syntax error",
    "PR109": "unknown key",
    "PR110": "wrong type",
    "PR111": "option given twice",
    "PR112": "option takes no value",
    "PR113": "cannot read file",
    "PR114": "invalid plan file",
    "PR115": "output format not available",
    "PR116": "not a regular file",
    "PR117": "file too large",
    "PR118": "file is not UTF-8 text",
    "PR119": "a format that cannot hold a value exactly",
    "PR200": "value must be a positive integer",
    "PR201": "--export-config and --import-config together",
    "PR202": "two executable caches",
    "PR203": "two autoreport directories",
    "PR204": "invalid per-instance arguments",
    "PR205": "instance index out of range",
    "PR206": "unknown offline target",
    "PR207": "offline target without offline mode",
    "PR208": "hosts given twice",
    "PR209": "no program",
    "PR210": "deprecated option",
    "PR211": "conflicting options",
    "PR212": "invalid port",
    "PR213": "invalid subnet",
    "PR214": "configuration file exists",
    "PR215": "empty host list",
    "PR216": "number too large",
    "PR217": "host outside the Slurm allocation",
    "PR218": "option of poprun plan after the program",
    "PR219": "signal before a time limit that is not set",
    "PR220": "signal not before the time limit",
    "PR221": "longest restart wait shorter than the first",
    "PR222": "invalid exit status",
    "PR223": "restart settings without restarts",
    "PR224": "stall limit not below the time limit",
    "PR225": "invalid setting",
    "PR226": "spare host named twice",
    "PR227": "more hosts asked for than the launch has",
    "PR228": "this backend cannot change hosts",
    "PR229": "health check timeout out of range",
    "PR230": "MPI program without an srun plugin that starts it",
    "PR231": "SLURM_MPI_TYPE names no MPI plugin of srun's",
    "PR232": "a variable poprun sets itself",
    "PR233": "-x replaces a value of the layout",
    "PR234": "executable cache not a fixed path for the run",
    "PR235": "heartbeat limit not below the time limit",
    "PR238": "unknown notification kind",
    "PR239": "notify timeout out of range",
    "PR240": "metrics file cannot be written",
    "PR241": "more devices than the host has",
    "PR242": "devices of a host not known",
    "PR243": "host without devices",
    "PR244": "no device on this machine",
    "PR245": "devices across NUMA nodes",
    "PR246": "-x of a device variable",
    "PR247": "nvidia-smi failed",
    "PR248": "nvidia-smi and sysfs disagree",
    "PR249": "device visibility without devices",
    "PR256": "network topology not used",
    "PR257": "rank order topology without a network topology",
    "PR258": "invalid network topology",
    "PR259": "network topology is not a tree",
    "PR300": "replicas do not divide across instances",
    "PR301": "instances do not divide across hosts",
    "PR302": "instances do not divide across IPU-Link domains",
    "PR303": "IPU-Link domain over capacity",
    "PR304": "one instance with one replica",
    "PR305": "more IPUs than the target has",
    "PR306": "not enough cores for the placement",
    "PR307": "cannot read the host topology",
    "PR308": "instances bound to one core",
    "PR309": "instance 0's host name does not resolve",
    "PR310": "too few hosts left",
    "PR311": "no plan on the hosts left",
    "PR312": "the plan's kept spec does not make the plan",
    "PR313": "MPI program without mpirun",
    "PR316": "the launching shell's device filter names other devices",
    "PR318": "MASTER_ADDR is a loopback address on a plan over several hosts",
    "PR322": "host not in the network topology",
    "PR324": "cannot read Slurm's network topology",
    "PR400": "unknown backend",
    "PR401": "backend plugin failed to load",
    "PR402": "backend declared twice",
    "PR403": "stale plan",
    # PR404 "backend not available in this version" is retired (every backend of the design ships): never reuse it.
    "PR405": "host name unknown",
    "PR406": "host unreachable",
    "PR407": "host key verification failed",
    "PR408": "permission denied by host",
    "PR409": "program missing on host",
    "PR410": "Graphviz not available",
    "PR411": "host stopped answering",
    "PR412": "mpirun failed before starting any instance",
    "PR413": "one machine named as two hosts",
    "PR414": "instance output lost on its way to poprun",
    "PR415": "connections to the output relay refused",
    "PR416": "instance output went through mpirun",
    "PR420": "mpirun not found",
    "PR421": "mpirun refused its arguments",
    "PR422": "mpirun could not start on a host",
    "PR423": "not enough slots for mpirun",
    "PR425": "instance loads MPI without an MPI launcher",
    "PR426": "program not found",
    "PR427": "program not executable",
    "PR428": "program could not be started",
    "PR429": "not enough open files for the instances",
    "PR430": "output files cannot be written safely",
    "PR431": "host is not this machine",
    "PR432": "planned CPUs not available here",
    "PR433": "instance cannot start as planned",
    "PR434": "a process poprun needs could not start",
    "PR435": "output files cannot be made",
    "PR436": "not inside a Slurm allocation",
    "PR437": "srun not found",
    "PR438": "instances too large for srun's environment",
    "PR439": "command could not run on a host",
    "PR440": "port already in use",
    "PR441": "popdist's hub port already in use",
    "PR442": "no SSH key to distribute",
    "PR443": "SSH key could not be made",
    "PR444": "ssh-copy-id refused",
    "PR445": "host failed its health check",
    "PR446": "health check could not reach a host",
    "PR447": "progress channel could not be opened",
    "PR448": "progress datagrams that were not the run's were dropped",
    "PR449": "progress cannot reach poprun from hosts reached through a jump host",
    "PR450": "this backend cannot restart one instance",
    "PR460": "backend plugin could not be made",
    "PR461": "backend plugin failed to launch",
    "PR462": "backend plugin failed while running",
    "PR463": "backend plugin named like a built-in backend",
    "PR467": "notifier failed",
    "PR468": "notification settings without a notifier",
    "PR469": "metrics file is not a regular file",
    "PR474": "no route to MASTER_ADDR",
    "PR475": "no interface in --host-subnet",
    "PR476": "cannot read a host's route",
    "PR477": "several interfaces in --host-subnet",
    "PR478": "interface name Gloo and NCCL cannot take",
    "PR500": "partition not found",
    "PR501": "V-IPU server unreachable",
    "PR502": "V-IPU server unreachable while planning",
    "PR503": "several partitions, none named",
    "PR504": "partition does not match",
    "PR505": "not enough IPUs in the allocation",
    "PR506": "partition in use",
    "PR507": "partition not active",
    "PR508": "partition not released at exit",
    "PR509": "V-IPU request failed",
    "PR510": "V-IPU answer not understood",
    "PR600": "no such run",
    "PR601": "ambiguous run",
    "PR602": "run record unreadable",
    "PR603": "run is not running",
    "PR604": "run supervised on another host",
    "PR605": "no such instance in the run",
    "PR606": "--detach without a run record",
    "PR607": "run did not stop in time",
    "PR608": "run has no report yet",
    "PR609": "no such attempt in the run",
    "PR618": "run's supervisor ignores SIGTERM",
}


class Severity(enum.Enum):
    """How bad a diagnostic is: errors stop the stage, warnings never do."""

    ERROR = "error"
    WARNING = "warning"


@record
class Diagnostic:
    """
    One problem found in the user's input or environment.

    ``summary`` is one line without a trailing period; ``detail`` says what was found,
    with values; ``hint`` says what to do next and is never empty.
    """

    code: str
    severity: Severity
    summary: str
    detail: str
    span: SourceSpan
    hint: str
    related: tuple[SourceSpan, ...] = ()
    # Where the span points into text the user gave (a file or a command line), the text.
    source_line: str | None = None

    def __post_init__(self) -> None:
        if self.code not in CODES:  # programmer error, not user error
            msg = f"unregistered diagnostic code {self.code}"
            raise ValueError(msg)

    @property
    def is_error(self) -> bool:
        """Whether this diagnostic stops the stage."""
        return self.severity is Severity.ERROR


def error(code: str, summary: str, *, detail: str, span: SourceSpan, hint: str,
          related: tuple[SourceSpan, ...] = (), source_line: str | None = None) -> Diagnostic:
    """Return an error diagnostic."""
    return Diagnostic(code=code, severity=Severity.ERROR, summary=summary, detail=detail, span=span, hint=hint,
                      related=related, source_line=source_line)


def warning(code: str, summary: str, *, detail: str, span: SourceSpan, hint: str,
            related: tuple[SourceSpan, ...] = (), source_line: str | None = None) -> Diagnostic:
    """Return a warning diagnostic."""
    return Diagnostic(code=code, severity=Severity.WARNING, summary=summary, detail=detail, span=span, hint=hint,
                      related=related, source_line=source_line)


class DiagnosticError(Exception):
    """A stage failed; ``diagnostics`` holds every problem it found, errors and warnings."""

    def __init__(self, diagnostics: Iterable[Diagnostic]) -> None:
        self.diagnostics = tuple(diagnostics)
        first = next((d for d in self.diagnostics if d.is_error), None)
        super().__init__(f"{first.code}: {first.summary}" if first else "failed")


class LaunchError(DiagnosticError):
    """
    Nothing of the plan runs: the program is missing, a host is wrong, a directory is gone.

    ``status`` is poprun's exit status: 127 program not found, 126 not executable, 125 any
    other reason poprun could not launch (design.md section 3). The message is one line;
    ``diagnostics``, when given, are what the user is shown instead (one per problem, with codes).
    """

    def __init__(self, message: str, *, status: int = CANNOT_LAUNCH, diagnostics: tuple[Diagnostic, ...] = ()) -> None:
        super().__init__(diagnostics)
        self.args = (message,)
        self.message = message
        self.status = status


class PreflightError(LaunchError):
    """
    Some hosts cannot run the plan; ``diagnostics`` says which and why, one each.

    ``hosts`` names them, in the same order, when the backend knows which host each problem is
    of (a re-plan leaves them out: docs/membership.md); empty otherwise.
    """

    def __init__(self, diagnostics: Sequence[Diagnostic], *, hosts: Sequence[str] = ()) -> None:
        super().__init__(f"{len(diagnostics)} host(s) cannot run the plan: "
                         + "; ".join(d.detail for d in diagnostics), diagnostics=tuple(diagnostics))
        self.hosts = tuple(hosts)


class HostLostError(DiagnosticError):
    """
    Hosts stopped answering while the launch ran (PR411, one diagnostic each); ``hosts`` names them, in the same order.

    Raised by a backend's :meth:`Launch.wait` when it cannot tell which instances ended how (mpirun
    lost its daemons there); with a membership policy the next attempt leaves them out.
    """

    def __init__(self, diagnostics: Sequence[Diagnostic], *, hosts: Sequence[str]) -> None:
        super().__init__(diagnostics)
        self.hosts = tuple(hosts)


def launch_error(code: str, summary: str, *, detail: str, span: SourceSpan, hint: str,
                 status: int = CANNOT_LAUNCH) -> LaunchError:
    """
    Return the :class:`LaunchError` of one coded problem: its message is ``detail``, in one line.

    The message is what a caller that shows no diagnostics tells (a restart that could not
    start, a command on a host that could not run: :mod:`poprun.apply.hostrun`); the user
    otherwise sees the diagnostic (code, place, detail and hint).
    """
    return LaunchError(detail, status=status, diagnostics=(error(code, summary, detail=detail, span=span, hint=hint),))


class Diagnostics:
    """
    A collector: stages append to it, then raise once at their end.

    Warnings never raise; :meth:`raise_if_errors` raises :class:`DiagnosticError` with all
    diagnostics when at least one is an error.
    """

    def __init__(self) -> None:
        self._items: list[Diagnostic] = []

    def add(self, diagnostic: Diagnostic) -> None:
        """Record a diagnostic."""
        self._items.append(diagnostic)

    def extend(self, diagnostics: Iterable[Diagnostic]) -> None:
        """Record several diagnostics."""
        self._items.extend(diagnostics)

    def __iter__(self) -> Iterator[Diagnostic]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    @property
    def has_errors(self) -> bool:
        """Whether any recorded diagnostic is an error."""
        return any(d.is_error for d in self._items)

    @property
    def warnings(self) -> tuple[Diagnostic, ...]:
        """The recorded warnings, in order."""
        return tuple(d for d in self._items if not d.is_error)

    def raise_if_errors(self) -> None:
        """Raise :class:`DiagnosticError` when an error was recorded."""
        if self.has_errors:
            raise DiagnosticError(self._items)
