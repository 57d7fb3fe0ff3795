"""
poprun's settings as data: every ``POPRUN_*`` variable that is not an option's fallback, in one table.

Layer: ``poprun.planner``; imports ``poprun.core`` and the plan model (:mod:`plan`) only;
nothing here reads ``os.environ``: callers pass the environment in. A setting is a row of
:data:`SETTINGS` (name, kind, range, default, owner, help). A row with ``backends`` is
*planned*: when the plan's backend is one of them (or a plugin that declares the row in its
``settings`` class attribute), the solver decides its value from the planning shell's
environment or the default (:func:`plan_settings`), checks it (PR225 with the variable's span)
and records it in ``plan.backend.settings``; the backend reads it there, never from the
environment, so that a saved plan runs with the settings it was planned with. The other rows
have no bearing on a plan (where runs are kept, the record, plugins, tracebacks): they are read
where they are used, through :func:`setting_value`. ``docs/settings.md`` and the settings section
of ``poprun --help`` are made from this table (:func:`render_settings_doc`, :func:`help_lines`).
"""

from __future__ import annotations

from poprun.core.record import positional_record
from poprun.core.span import SourceSpan
from poprun.planner.plan import DEFAULT_SOURCE

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (start-up; see poprun.core.record)
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping

    from poprun.core.diagnostic import Diagnostic
    from poprun.planner.plan import BackendSetting

DEFAULT = DEFAULT_SOURCE  # the source of a setting not set in the planning shell
EVERY = ("*",)  # a row's backends: planned for every backend, plugins' too (what apply itself reads)


@positional_record
class Setting:
    """
    One ``POPRUN_*`` setting.

    ``kind`` says how its text is read: ``count`` (a whole number in ``range``, ``lo-hi``),
    ``seconds`` (a number of seconds in ``range``), ``number`` (a decimal number in ``range``), ``choice`` (one of ``range``, ``a|b|c``,
    any case), ``path`` (a file; empty: none), ``switch`` (``0`` turns it off), ``flag``
    (set: on), ``text``. ``default`` is the text a backend reads when the variable is unset
    (``auto``: computed where it runs). ``owner``: what reads it. ``backends``: the built-in
    backends whose plans record it (empty: not planned; :data:`EVERY`: every backend's plans,
    plugins' too: settings that apply itself reads).
    """

    name: str
    kind: str
    range: str
    default: str
    owner: str
    help: str
    backends: tuple[str, ...] = ()
    unit: str = ""  # what a count counts, for messages ("connections")
    shown: str = ""  # the default in words, where its text says too little ("auto: 4 per core, from 8 to 64")

    def check(self, text: str, *, recorded: bool = False) -> str:
        """
        Return the value ``text`` of this setting as a backend reads it (unset or blank: the default).

        ``recorded``: ``text`` is a plan's value, where the default's own text (``auto``) stands too.

        Raises:
            ValueError: when ``text`` is not a value of this setting (the message names the
                variable and what it takes).
        """
        text = text.strip()
        if not text or (recorded and text == self.default):
            return self.default
        if self.kind == "count":
            lo, hi = (int(n) for n in self.range.split("-"))
            if not (text.isascii() and text.isdigit() and len(text) <= len(str(hi))) or not lo <= int(text) <= hi:
                raise ValueError(f"{self.name}={text!r} is not a whole number of {self.unit or 'units'} from {lo} to {hi}")
            return str(int(text))
        if self.kind == "seconds":
            lo, hi = (int(n) for n in self.range.split("-"))
            try:
                value = float(text)
            except ValueError:
                value = -1.0
            if not lo <= value <= hi:
                raise ValueError(f"{self.name}={text!r} is not a number of seconds from {lo} to {hi}")
            return text
        if self.kind == "number":
            low, high = (float(n) for n in self.range.split("-"))
            try:
                number = float(text)
            except ValueError:
                number = float("nan")
            if not low <= number <= high:  # NaN fails too
                raise ValueError(f"{self.name}={text!r} is not a number from {self.range.replace('-', ' to ')}")
            return str(number).removesuffix(".0")
        if self.kind == "choice":
            choices = self.range.split("|")
            if text.lower() not in choices:
                raise ValueError(f"{self.name}={text!r} is not one of {', '.join(choices)}")
            return text.lower()
        return text

    @property
    def planned(self) -> bool:
        """Whether the plan records this setting for the backends that read it."""
        return bool(self.backends)


SETTINGS: tuple[Setting, ...] = (
    Setting("POPRUN_SSH_CONFIG", "path", "", "", "ssh backend",
            "the ssh_config file ssh reads (-F), also for MASTER_ADDR's HostName; unset: ssh's own",
            ("ssh",)),
    Setting("POPRUN_HOST_TIMEOUT", "seconds", "3-3600", "15", "ssh and mpirun backends",
            "seconds a host may not answer before it is declared lost", ("ssh", "mpirun")),
    Setting("POPRUN_SSH_FANOUT", "count", "1-1024", "auto", "ssh backend",
            "how many ssh connections are opened at once", ("ssh",), "connections",
            "auto: 4 per core, from 8 to 64"),
    Setting("POPRUN_SSH_RELAY", "choice", "auto|on|off", "auto", "ssh backend",
            "how remote hosts are started: through relay hosts above 256 hosts (auto), from 3 (on), never (off)",
            ("ssh",)),
    Setting("POPRUN_STRAGGLER_WINDOW", "count", "2-10000", "20", "apply (stragglers)",
            "W: an instance's median step time is taken over its last W steps (docs/progress.md, Stragglers)",
            EVERY, "steps"),
    Setting("POPRUN_STRAGGLER_FACTOR", "number", "1.05-1000", "1.5", "apply (stragglers)",
            "k: an instance whose median step time is more than k x the run's median is a straggler",
            EVERY),
    Setting("POPRUN_CGROUP", "switch", "0", "", "local backend",
            "0: make no cgroup for the instances of a launch"),
    Setting("POPRUN_HOST_TOPOLOGY", "path", "", "", "planner",
            "a topology file (or recorded name) every host is taken to look like, for placement"),
    Setting("POPRUN_PARTITION_PROVIDER", "choice", "auto|vipu|emulated|none", "auto", "partitions",
            "the V-IPU provider: the vipu tool, the emulated service, or none"),
    Setting("POPRUN_VIPU_EMULATOR_DB", "path", "", "", "partitions",
            "an in-process emulated V-IPU service on this SQLite file"),
    Setting("POPRUN_VIPU_EMULATOR_INVENTORY", "path", "", "", "partitions",
            "the emulated service's inventory (JSON), for a new database"),
    Setting("POPRUN_RUNS_DIR", "path", "", "", "run records",
            "where run records are kept; unset: $XDG_STATE_HOME/poprun/runs, else ~/.local/state/poprun/runs"),
    Setting("POPRUN_RUNS_KEEP", "count", "1-", "100", "run records", "how many run records are kept"),
    Setting("POPRUN_RUN_LOG_LIMIT", "count", "0-", "67108864", "run records",
            "bytes of output kept per instance in a run record", shown="64 MiB"),
    Setting("POPRUN_RECORD", "switch", "0", "", "run records", "0: keep no run record"),
    Setting("POPRUN_NO_PLUGINS", "flag", "", "", "backend registry",
            "set (not 0, no, false or off): load no backend plugin"),
    Setting("POPRUN_DEBUG", "flag", "", "", "cli", "set: an internal error prints its traceback"),
)
"""Every setting, planned ones first, in the order ``docs/settings.md`` lists them."""

_BY_NAME = {s.name: s for s in SETTINGS}


def setting(name: str) -> Setting:
    """Return the row of setting ``name`` (a programmer's error when there is none: KeyError)."""
    return _BY_NAME[name]


def setting_value(name: str, environ: Mapping[str, str]) -> str | None:
    """
    Return the text of setting ``name`` in ``environ`` as it is set (None when unset), for the settings no plan records.

    The one way to read an unplanned setting: ``name`` must be a row of :data:`SETTINGS` (a
    KeyError otherwise, a programmer's error), so that every setting read is in the table.
    """
    return environ.get(setting(name).name)


def backend_rows(backend: str, declared: Iterable[Setting] = ()) -> tuple[Setting, ...]:
    """Return the settings a plan for ``backend`` records: the built-in rows for it, and a plugin's ``declared`` rows."""
    rows = [s for s in SETTINGS if backend in s.backends or s.backends == EVERY]
    rows += [s for s in declared if s.name not in {r.name for r in rows}]
    return tuple(sorted(rows, key=lambda s: s.name))


def straggler_rule(environ: Mapping[str, str]) -> tuple[int, float]:
    """
    Return the straggler rule's window W and factor k as ``environ`` sets them (a bad value: the default).

    What the plan records is checked where the backend's settings are (PR225); this is for the
    explanation, and for apply reading a plan's recorded values (``environ``: the plan's settings).
    """
    def value(name: str) -> str:
        try:
            return setting(name).check(environ.get(name, ""), recorded=True)
        except ValueError:
            return setting(name).default

    return int(value("POPRUN_STRAGGLER_WINDOW")), float(value("POPRUN_STRAGGLER_FACTOR"))


def default_settings(rows: Iterable[Setting]) -> tuple[BackendSetting, ...]:
    """Return ``rows`` at their defaults (what a plan written before settings were recorded loads with)."""
    from poprun.planner.plan import BackendSetting

    return tuple(BackendSetting(name=s.name, value=s.default, source=DEFAULT) for s in rows)


def plan_settings(rows: Iterable[Setting], environ: Mapping[str, str]) -> tuple[
        tuple[BackendSetting, ...], tuple[Diagnostic, ...]]:
    """
    Return the settings ``rows`` take in ``environ`` (the planning shell's), with their sources.

    Diagnostics:
        PR225 for each variable set to a value its setting does not take, with the
        variable's span and the values it takes.
    """
    from poprun.core.diagnostic import error
    from poprun.planner.plan import BackendSetting

    values, problems = [], []
    for row in rows:
        text = environ.get(row.name, "")
        try:
            value = row.check(text)
        except ValueError as exc:
            problems.append(error("PR225", "invalid setting", detail=str(exc), span=SourceSpan.env(row.name),
                                  hint=f"set {row.name} to {_takes(row)}, or unset it ({_default(row)})"))
            continue
        source = SourceSpan.env(row.name).describe() if text.strip() else DEFAULT
        values.append(BackendSetting(name=row.name, value=value, source=source))
    return tuple(values), tuple(problems)


def _takes(row: Setting) -> str:
    lo, _, hi = row.range.partition("-")
    if row.kind == "count":
        return f"a whole number from {lo} to {hi}" if hi else f"a whole number, {lo} or more"
    if row.kind == "seconds":
        return f"a number of seconds from {lo} to {hi}"
    if row.kind == "number":
        return f"a number from {lo} to {hi}"
    if row.kind == "choice":
        return _join_or(row.range.split("|"))
    return "a value"


def _default(row: Setting) -> str:
    return f"default: {describe_default(row)}"


def describe_default(row: Setting) -> str:
    """Return the default of ``row`` in words (``15 s``, ``auto: 4 per core, from 8 to 64``, ``none``)."""
    if row.shown:
        return row.shown
    if row.kind == "seconds":
        return f"{row.default} s"
    return row.default or "unset"


def _join_or(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def help_lines() -> list[str]:
    """Return the settings section of ``poprun --help``: one line per setting."""
    width = max(len(s.name) for s in SETTINGS)
    lines = ["Settings (environment variables; docs/settings.md):"]
    lines += [f"  {s.name.ljust(width)}  {_first_line(s)}" for s in SETTINGS]
    return lines


def _first_line(row: Setting) -> str:
    return f"{row.help} [{describe_default(row)}]" if row.default else row.help


def render_settings_doc() -> str:
    """Return ``docs/settings.md``, made from :data:`SETTINGS` (a test keeps the file equal to it)."""
    out = [
        "# Settings",
        "",
        "<!-- Made from poprun/planner/setting.py (SETTINGS); tests/unit/test_setting.py keeps them equal. -->",
        "",
        "A setting is a `POPRUN_*` environment variable that is not an option's fallback (options fall",
        "back on `POPRUN_<FLAG>`: `--num-replicas` on `POPRUN_NUM_REPLICAS`). A *planned* setting is",
        "decided when the plan is made, from the planning shell's environment or its default, checked",
        "(a bad value is [PR225](errors/PR225.md), before anything starts) and recorded in the plan's",
        "backend record (`backend.settings`, with where each came from; `plan --explain` shows them).",
        "The backend reads it there, never from the environment: a saved plan runs with the settings it",
        "was planned with, whatever the shell that runs `poprun apply PLAN.json` sets (what apply asks the",
        "backend without the plan, the port plan's command on instance 0's host, carries the plan's",
        "settings too). While planning, reading other hosts' topologies uses the planning shell's values,",
        "the ones the plan records. The other settings have no bearing on a plan and are read where they",
        "are used.",
        "",
        "```console",
        "$ POPRUN_SSH_FANOUT=16 poprun plan --host pod1,pod2 --num-instances 2 --num-replicas 2 --explain python3 train.py",
        "...",
        "settings of the ssh backend:",
        "  setting              value  source",
        "  POPRUN_HOST_TIMEOUT  15 s   default",
        "  POPRUN_SSH_CONFIG    unset  default",
        "  POPRUN_SSH_FANOUT    16     environment variable POPRUN_SSH_FANOUT",
        "  POPRUN_SSH_RELAY     auto   default",
        "```",
        "",
        "A backend plugin can declare settings of its own (rows of `poprun.planner.setting.Setting` in",
        "its `settings` class attribute): they are planned for its plans the same way",
        "([backends.md](backends.md)).",
        "",
        "`POPRUN_EVENTS` is the fallback of `--events`, an option's, and not a setting. `POPRUN_SLURM_LAUNCH`,",
        "`POPRUN_OUTPUT_RELAY` and `POPRUN_SSH_COPY_ID_SECRET` carry data to poprun's own helpers, and",
        "`POPRUN_RUN_ID` and `POPRUN_RESTART_COUNT` are set for the instances ([the environment",
        "contract](popdist.md)): none of them is a setting either.",
        "",
        "| setting | kind | takes | default | read by | planned for | what it does |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in SETTINGS:
        takes = _takes(s) if s.kind in ("count", "seconds", "number", "choice") else s.kind
        planned = "every backend" if s.backends == EVERY else ", ".join(s.backends) or "-"
        out.append(f"| `{s.name}` | {s.kind} | {takes} | {describe_default(s)} | {s.owner} | {planned} | {s.help} |")
    return "\n".join(out) + "\n"
