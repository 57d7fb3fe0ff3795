#!/usr/bin/env python3
"""
A differential run: the same poprun cases through two checkouts, compared byte for byte.

Usage: ``python tests/differential/differential.py OLD_CHECKOUT NEW_CHECKOUT [--only CATEGORY] [--out DIR]``.
Each checkout runs with its own ``.venv`` (made when missing). Every case runs once per side, in a
fresh folder of the same shape (``<tmp>/old/<case>`` and ``<tmp>/new/<case>``: home, XDG folders,
run records, TMPDIR and the working folder), with the same small environment. Standard output,
standard error, exit status and the files a case leaves (its working folder, its run records) are
normalised (:func:`normalise`: only what differs from run to run) and compared; each difference
is written as a unified diff under ``--out``. See README.md beside this file.

Layer: a script of the tests; imports only the standard library (never poprun: it runs both sides
as processes).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import csv
import difflib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

SIDES = ("old", "new")  # the same length: a path under either has the same length (text wrapped by width)
CATEGORIES = ("help", "corpus", "golden", "saved", "launch")
BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CASE_TIMEOUT = 120.0  # seconds for a whole case on one side
STEP_TIMEOUT = 60.0
SORTED = "(lines sorted)"  # a step's outputs compared as sorted lines
TIMED_OUT = "TIMED OUT"  # in a transcript: the case is a difference even when both sides timed out

# ---------------------------------------------------------------------------------------------------------------
# Normalisation: only what must differ from one run to the next.
# ---------------------------------------------------------------------------------------------------------------

RUN_ID = re.compile(r"\b\d{8}-\d{6}-[0-9a-f]{6}\b")
DATE_TIME = re.compile(r"\b\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}:?\d{2})?")
CLOCK = re.compile(r"\b\d{2}:\d{2}:\d{2}\.\d{3}\b")
LOG_PID = re.compile(r"(<clock>) \d+ ")  # a log line's prefix: time, poprun's pid
EPOCH = re.compile(r"\b1[6-9]\d{8}\.\d+\b|\b1[6-9]\d{8}\b(?=[,}\]\s])")  # seconds since 1970: 2020 to 2033
DURATION = re.compile(r"\b\d+\.\d+( ?(?:s|ms|seconds?))\b")
PADDED_DURATION = re.compile(r"(<d> s) {2,}(?=\S)")  # a table's column after a duration: padded to its width
# Durations in JSON: a phase's or an attempt's seconds (floats, 7e-05 too, however near to a whole number), the
# milliseconds of a phase-ended event and of a limit reached. Never a plan's settings (timeout_ms, backoff_ms...).
DURATION_KEYS = re.compile(
    r'("(?:duration|uptime|elapsed|seconds|plan|partition|start|run|teardown|first-output|first_output|connect|'
    r'probe|preflight|wait|total)":\s*)-?\d+(?:\.\d+(?:e-?\d+)?|e-?\d+)|("(?:ms|after_ms)":\s*)\d+')
PID = re.compile(r'(\bPIDs? |\bpid |"pid":\s*|"supervisor":\s*|\bprocess )\d+')
PORT = re.compile(r'(MASTER_PORT[= ]|"MASTER_PORT":\s*"|"master_port":\s*|\["MASTER_PORT",\s*")\d+')
ENV_HASH = re.compile(r'("env_blake2b":\s*")[0-9a-f]+')  # a hash of an instance's environment (its run id, its port)
CACHE = re.compile(r"poprun-cache-[0-9a-f]+")
TIMESTAMP_SUFFIX = re.compile(r"\.\d{8}-\d{6}\b")  # a file set aside with its time (the golden tests do the same)


def normalise(text: str, paths: dict[str, str] | None = None, versions: tuple[str, str] | None = None) -> str:
    """
    Return ``text`` with what differs from run to run replaced by a fixed token.

    ``paths`` maps a path of this side (its temporary folder, its checkout) to its token; the longest
    is replaced first. ``versions`` is (this side's version, the token) when the two sides' versions
    differ. Run ids become ``<run1>``, ``<run2>``... in the order they first appear (two runs of a
    case stay apart); dates, clock times and seconds since 1970 become ``<date>``, ``<clock>``,
    ``<epoch>``; decimal durations ``<d>`` (and the padding after one in a table); pids, chosen ports and the cache folder's hash ``<pid>``,
    ``<port>``, ``<hash>``.
    """
    for path, token in sorted((paths or {}).items(), key=lambda item: -len(item[0])):
        if path:
            text = text.replace(path, token)
    if versions is not None and versions[0]:
        text = text.replace(versions[0], versions[1])
    runs: dict[str, str] = {}

    def run_token(match: re.Match[str]) -> str:
        return runs.setdefault(match.group(0), f"<run{len(runs) + 1}>")

    text = RUN_ID.sub(run_token, text)
    text = TIMESTAMP_SUFFIX.sub(".<stamp>", text)
    text = DATE_TIME.sub("<date>", text)
    text = CLOCK.sub("<clock>", text)
    text = LOG_PID.sub(r"\1 <pid> ", text)
    text = EPOCH.sub("<epoch>", text)
    text = DURATION_KEYS.sub(lambda m: f"{m.group(1) or m.group(2)}<d>", text)
    text = DURATION.sub(r"<d>\1", text)
    text = PADDED_DURATION.sub(r"\1  ", text)
    text = PID.sub(r"\1<pid>", text)
    text = PORT.sub(r"\1<port>", text)
    text = ENV_HASH.sub(r"\1<hash>", text)
    return CACHE.sub("poprun-cache-<hash>", text)


CONCURRENT_EVENTS = frozenset({"instance-started", "instance-ended", "instance-output-truncated", "launch-running",
                               "stopping", "host-checked", "host-connected"})
EVENT_KIND = re.compile(r'^\{"v":\d+,"event":"([a-z-]+)"(?:,"time":[^,]*)?(,"phase":"first-output")?')
VERIFIED = re.compile(r"^verified: \d+ of (\d+ instances? as planned \(argv, environment, CPUs\))"
                      r"(?:; \d+ not read back \([^)\n]*\))?\n(?:  instance .* not as planned.*\n)*", re.MULTILINE)


def canonical_events(text: str) -> str:
    """
    Sort each run of adjacent event lines that threads write concurrently; other lines keep their order.

    The events of instances (started, ended), ``launch-running``, ``stopping`` (after a failure) and
    the first-output phase come from the threads that watch the instances: their order among
    themselves is not fixed.
    """
    out: list[str] = []
    block: list[str] = []
    for line in text.splitlines(keepends=True):
        match = EVENT_KIND.match(line)
        if match and (match.group(1) in CONCURRENT_EVENTS or match.group(2)):
            block.append(line)
            continue
        out.extend(sorted(block))
        block = []
        out.append(line)
    out.extend(sorted(block))
    return "".join(out)


def verified_line(text: str) -> str:
    """
    Replace what ``poprun report`` says of reading the instances back (``verified: ...``) by its total alone.

    Whether an instance is read back (argv, environment, CPUs from /proc) before it ends, or while
    it is still between fork and exec, depends on timing; the number of instances does not.
    """
    return VERIFIED.sub(r"verified: <n> of \1 (what was read back: not compared)\n", text)


def log_order(text: str) -> str:
    """
    Reduce a run record's ``logs/order`` (instance, stream, bytes per read) to the bytes of each stream.

    How an instance's output is cut into reads, and how the reads of instances interleave, is not fixed.
    """
    totals: dict[tuple[str, str], int] = {}
    for line in text.splitlines():
        index, stream, size = [*line.split(), "", "", ""][:3]
        totals[index, stream] = totals.get((index, stream), 0) + (int(size) if size.isdigit() else 0)
    return "".join(f"{index} {stream} {size} (in all)\n" for (index, stream), size in sorted(totals.items()))


def failure_order(text: str) -> str:
    """
    Sort the items of each indented JSON ``"failures": [...]`` list (a run report's) by their text.

    The failures of instances stopped together (Ctrl-C, a failure's teardown) are listed in the order
    they ended, which is not fixed. Only the items' order changes, never their text.
    """
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        out.append(line)
        i += 1
        if not line.rstrip().endswith('"failures": ['):
            continue
        indent = line[:len(line) - len(line.lstrip())]
        items: list[list[str]] = []
        while i < len(lines) and not lines[i].startswith(f"{indent}]"):
            if lines[i].startswith(f"{indent}  {{") or not items:
                items.append([])
            items[-1].append(lines[i])
            i += 1
        bodies = sorted("".join(item).rstrip().removesuffix(",") for item in items)
        out.extend(f"{body},\n" if n < len(bodies) - 1 else f"{body}\n" for n, body in enumerate(bodies))
    return "".join(out)


def unordered(text: str) -> str:
    """Sort the lines of each output of the steps marked ``(lines sorted)``: their writers run concurrently."""
    out: list[str] = []
    block: list[str] = []
    sort = False
    for line in [*text.splitlines(), "=== end"]:
        if line.startswith(("=== ", "$ ", "--- ")):
            out.extend(sorted(block) if sort else block)
            block = []
            out.append(line)
            if line.startswith(("=== ", "$ ")):
                sort = line.startswith("$ ") and line.endswith(SORTED)
        else:
            block.append(line)
    return "\n".join(out[:-1]) + "\n"


# ---------------------------------------------------------------------------------------------------------------
# Cases
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Step:
    """
    One command of a case: ``poprun`` with ``argv`` in the working folder.

    ``{RUN}`` in argv is the newest run record's id. ``save`` writes the standard output (exit 0 only)
    to this file of the working folder. ``wait_for`` waits (before the command, or with ``interrupt``
    while it runs) until a file of the case's folder matches each glob (``work/ready``), holding the
    text after ``~`` if one is given (``runs/*/events.jsonl~"launch-running"``); ``interrupt`` then
    sends this signal to poprun. A step without argv only waits. ``unordered``: its output is compared as sorted lines.
    """

    argv: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()
    stdin: str = ""
    save: str = ""
    wait_for: tuple[str, ...] = ()
    interrupt: int = 0
    timeout: float = STEP_TIMEOUT
    unordered: bool = False


@dataclass
class Case:
    """A named list of steps in one fresh folder per side; ``files`` are written into the working folder first."""

    category: str
    name: str
    steps: list[Step]
    files: dict[str, str] = field(default_factory=dict)
    copy_from: Path | None = None  # a folder copied as the working folder (a golden case)
    sparse: dict[str, int] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    home_is_work: bool = False
    sys_path: tuple[str, ...] = ()


def step(*argv: str, **kw: object) -> Step:
    """A step of poprun's arguments."""
    return Step(argv=tuple(argv), **kw)  # type: ignore[arg-type]


SAMPLE = {  # the corpus's shell variables, as tests/e2e/test_corpus.py fills them
    "HOSTS": "pod1,pod2", "HOSTS_4": "pod1,pod2,pod3,pod4", "HOSTS_8": "pod[1-8]", "MAINHOST": "pod1",
    "TCP_IF_INCLUDE": "10.5.0.0/16", "VIPU_CLI_API_HOST": "vipu.example", "VIPU_SERVER_HOST": "vipu.example",
    "VIPU_SERVER": "vipu.example", "IPUOF_VIPU_API_HOST": "vipu.example", "IPUOF_VIPU_API_PARTITION_ID": "p64",
    "PARTITION": "p64", "CLUSTER": "c64", "VIPU_CLUSTER_ID": "c64", "VIPU_ALLOCATION_ID": "c64", "ALLOCATION": "c64",
    "REPLICAS": "8", "INSTANCES": "2", "NUM_REPLICA": "8", "NUM_INSTANCE": "2", "NUM_ILDS": "1",
    "MPI_SETTINGS": "--mpi-global-args='--tag-output --allow-run-as-root' --mpi-local-args='-x PYTHONPATH -x PATH' "
                    "--update-partition=yes --reset-partition=no --vipu-server-timeout=600",
    "MULTIHOST_SETTINGS": "--host pod1,pod2", "POPRUN_OPTIONS": "--vipu-server-host=vipu.example --vipu-partition=p64",
    "MPI_GLOBAL_ARGS": "--tag-output", "MPI_LOCAL_ARGS": "-x PYTHONPATH",
}
SHELL_STOP = ("|", "||", "&&", ";", "&", ">", ">>", "2>&1", "2>", "1>", ">&")


def corpus_argv(command: str) -> list[str] | None:
    """The words after ``poprun`` of a corpus command line, its shell variables filled, up to a pipe or redirection."""
    text = re.sub(r"\$\{([A-Za-z_]\w*)\}|\$([A-Za-z_]\w*)", lambda m: SAMPLE.get(m.group(1) or m.group(2), "x"), command)
    try:
        words = shlex.split(text)
    except ValueError:
        return None
    if "poprun" not in words:
        return None
    out = []
    for word in words[words.index("poprun") + 1:]:
        if word in SHELL_STOP or word.startswith((">", "2>", "|")):
            break
        out.append(word)
    return out


def corpus_cases(old: Path, new: Path) -> list[Case]:
    """Every corpus line through plan in each format, explain, render's DOT and validate of its TOML."""
    files = [Path("/work/shared/corpus/poprun-commands.tsv"), old / "tests/data/poprun-commands.tsv",
             new / "tests/data/poprun-commands.tsv"]
    seen: set[tuple[str, ...]] = set()
    cases = []
    for file in files:
        if not file.is_file():
            continue
        with file.open(encoding="utf-8", newline="") as rows:
            for row in csv.DictReader(rows, delimiter="\t"):
                argv = corpus_argv(row["command"])
                if argv is None or tuple(argv) in seen:
                    continue
                seen.add(tuple(argv))
                steps = [step("plan", "--format", fmt, *argv) for fmt in ("text", "json", "dot", "sbatch")]
                steps += [step("plan", "--format", "toml", *argv, save="spec.toml"), step("validate", "spec.toml"),
                          step("plan", "--explain", *argv), step("render", "--format", "dot", *argv)]
                cases.append(Case("corpus", f"{row['id']}", steps))
    return cases


def golden_cases(old: Path, new: Path) -> list[Case]:
    """
    Every golden case folder under tests/golden with a command line, through the CLI.

    The golden folders of the e2e tests (tests/e2e/*golden*) are left to those tests: they need
    live hosts, a held port or a program the test writes, and their text depends on which host
    fails first.
    """
    import json

    folders = [f"tests/golden/{p.name}" for checkout in (old, new) if (checkout / "tests/golden").is_dir()
               for p in sorted((checkout / "tests/golden").iterdir()) if p.is_dir()]
    folders = sorted(set(folders))
    cases: dict[str, Case] = {}
    for checkout in (new, old):  # the old checkout's copy of a case wins: the same input on both sides
        for folder in folders:
            root = checkout / folder
            if not root.is_dir():
                continue
            for case in sorted(p for p in root.iterdir() if (p / "case.json").is_file()):
                spec = json.loads((case / "case.json").read_text(encoding="utf-8"))
                name = f"{folder.removeprefix('tests/golden/')}.{case.name}"
                env = {k: str(v) for k, v in spec.get("env", {}).items()}
                if "old_argv" in spec:  # a diff: the old plan saved, then the new command line against it
                    env.setdefault("POPRUN_PARTITION_PROVIDER", "none")
                    steps = [step(*spec["old_argv"], save="old.json"), step(*spec["argv"])]
                elif "argv" in spec:
                    steps = [step(*spec["argv"])]
                else:
                    continue
                cases[name] = Case("golden", name, steps, copy_from=case, env=env, home_is_work=True,
                                   sparse={k: int(v) for k, v in spec.get("sparse_files", {}).items()},
                                   sys_path=tuple(spec.get("sys_path", [])))
    return [cases[name] for name in sorted(cases)]


HELP_COMMANDS = ("plan", "validate", "apply", "render", "submit", "vipu-server", "ps", "logs", "report", "stop",
                 "attach")


def help_cases() -> list[Case]:
    """``--help``, ``--version``, each subcommand's help and a bad option of each."""
    cases = [Case("help", "poprun--help", [step("--help")]), Case("help", "poprun-h", [step("-h")]),
             Case("help", "poprun--version", [step("--version")]),
             Case("help", "poprun--version-format", [step("--version-format", "full-json", "--version")]),
             Case("help", "poprun-bad-option", [step("--no-such-option", "true")]),
             Case("help", "poprun-bad-prefix", [step("--num", "2", "true")]),
             Case("help", "poprun-no-arguments", [step()])]
    for command in HELP_COMMANDS:
        cases += [Case("help", f"{command}--help", [step(command, "--help")]),
                  Case("help", f"{command}-h", [step(command, "-h")]),
                  Case("help", f"{command}-bad-option", [step(command, "--no-such-option")]),
                  Case("help", f"{command}-bad-option-value", [step(command, "--format", "nope", "x")])]
        if command != "vipu-server":  # without arguments it serves until stopped
            cases.append(Case("help", f"{command}-no-arguments", [step(command)]))
    return cases


OFFLINE_PROGRAM = ("sh", "-c", "echo applied $POPDIST_INSTANCE_INDEX")


def saved_cases() -> list[Case]:
    """Saved plans: written, shown, explained, compared, applied."""
    two = ("--num-instances", "2", "--num-replicas", "2", "--offline-mode", "1")
    four = ("--num-instances", "4", "--num-replicas", "4", "--offline-mode", "1")
    save_a = step("plan", "--format", "json", "-o", "a.json", *two, *OFFLINE_PROGRAM)
    save_b = step("plan", "--format", "json", "-o", "b.json", *four, *OFFLINE_PROGRAM)
    return [
        Case("saved", "plan-o", [save_a]),
        Case("saved", "plan-o-text", [step("plan", "-o", "a.txt", *two, *OFFLINE_PROGRAM), step("plan", "a.txt")]),
        Case("saved", "plan-o-toml", [step("plan", "--format", "toml", "-o", "a.toml", *two, *OFFLINE_PROGRAM),
                                      step("validate", "a.toml"), step("plan", "a.toml"),
                                      step("plan", "a.toml", "--format", "json")]),
        Case("saved", "plan-o-dot", [step("plan", "--format", "dot", "-o", "a.dot", *two, "true"),
                                     step("render", "-o", "b.dot", *two, "true")]),
        Case("saved", "plan-a.json", [save_a, step("plan", "a.json")]),
        Case("saved", "plan-a.json-explain", [save_a, step("plan", "a.json", "--explain")]),
        Case("saved", "plan-a.json-formats", [save_a] + [step("plan", "a.json", "--format", f)
                                                         for f in ("text", "json", "dot", "toml", "sbatch")]),
        Case("saved", "render-a.json", [save_a, step("render", "a.json", "--format", "dot")]),
        Case("saved", "diff-a-b", [save_a, save_b, step("plan", "--diff", "a.json", "b.json")]),
        Case("saved", "diff-a-b-json", [save_a, save_b, step("plan", "--diff", "a.json", "b.json", "--format", "json")]),
        Case("saved", "diff-a-a", [save_a, step("plan", "--diff", "a.json", "a.json")]),
        Case("saved", "diff-a-options", [save_a, step("plan", "--diff", "a.json", *four, *OFFLINE_PROGRAM)]),
        Case("saved", "diff-a-same-options", [save_a, step("plan", "--diff", "a.json", *two, *OFFLINE_PROGRAM)]),
        Case("saved", "diff-a-options-json", [save_a, step("plan", "--diff", "a.json", "--format", "json",
                                                          "--num-instances", "1", "--num-replicas", "2",
                                                          "--offline-mode", "1", "sh", "-c", "echo other")]),
        Case("saved", "diff-missing", [step("plan", "--diff", "missing.json", "b.json")]),
        Case("saved", "diff-not-a-plan", [step("plan", "--diff", "x.json", *two, "true")], files={"x.json": "{}\n"}),
        Case("saved", "plan-not-a-plan", [step("plan", "x.json")], files={"x.json": "[1, 2]\n"}),
        Case("saved", "apply-a.json", [save_a, launch("apply", "a.json")]),
        Case("saved", "apply-a.json-v", [save_a, launch("apply", "a.json", "-v")]),
        Case("saved", "apply-one", [step("plan", "--format", "json", "-o", "one.json", "sh", "-c",
                                         "echo one; echo err >&2"),
                                    step("apply", "one.json"), step("report", "{RUN}")]),
        Case("saved", "apply-toml", [step("apply", "a.toml")],
             files={"a.toml": '[program]\nargv = ["sh", "-c", "echo from toml"]\n'}),
        Case("saved", "apply-toml-with-options", [step("apply", "a.toml", "--offline-mode", "1", "sh", "-c", "echo x")],
             files={"a.toml": "[topology]\nnum_replicas = 2\nnum_instances = 2\n"}),
        Case("saved", "apply-then-apply-again", [save_a, launch("apply", "a.json"), launch("apply", "a.json"),
                                                 step("ps", "--all", unordered=True)]),  # two runs of one second
        Case("saved", "apply-missing", [step("apply", "nothing.json")]),
        Case("saved", "submit-dry-run", [step("submit", "--dry-run", "--nodes", "1", "true")]),
        Case("saved", "submit-dry-run-two", [step("submit", "--dry-run", "--nodes", "2", "--num-instances", "2",
                                                  "--num-replicas", "2", "sh", "-c", "echo $SLURM_PROCID")]),
    ]


def views(*, several: bool = False) -> list[Step]:
    """The views of a case's run record; the interleaved logs of several instances are compared as sorted lines."""
    return [step("ps", "--all"), step("ps", "--all", "--json"), step("report", "{RUN}"),
            step("report", "{RUN}", "--json"), step("logs", "{RUN}", unordered=several),
            step("logs", "{RUN}", "--tag", unordered=several), step("logs", "{RUN}", "--instance", "0"),
            step("logs", "{RUN}", "--tail", "1", unordered=several), step("logs", "{RUN}", "-f", unordered=several),
            step("attach", "{RUN}")]


RUNNING = 'runs/*/events.jsonl~"launch-running"'  # poprun knows its instances started (not only they themselves)


def launch(*argv: str, **kw: object) -> Step:
    """A launch: its output is compared as sorted lines (instances and poprun's threads write concurrently)."""
    return Step(argv=tuple(argv), unordered=True, **kw)  # type: ignore[arg-type]


# A program that waits for USR1 without a child process (a shell's sleep would be signalled too, and the shell
# reports it or not depending on when the signal comes).
TRAP = """\
import pathlib, signal, sys

def caught(signum, frame):
    print("got USR1", flush=True)
    sys.exit(7)

signal.signal(signal.SIGUSR1, caught)
pathlib.Path("ready").touch()
while True:
    signal.pause()
"""


def launch_cases() -> list[Case]:
    """Classic launches: verbosity, events, failures, signals, restarts, limits, Ctrl-C, detach and the run views."""
    off = ("--offline-mode", "1")
    two = ("--num-instances", "2", "--num-replicas", "2", *off)
    echo = ("sh", "-c", "echo out $POPDIST_INSTANCE_INDEX; echo err $POPDIST_INSTANCE_INDEX >&2")
    cases = [
        Case("launch", "one-true", [step("true"), *views()]),
        Case("launch", "one-local-echo", [step(*echo), *views()]),
        Case("launch", "one-offline", [step(*off, *echo), *views()]),
        Case("launch", "two-offline", [launch(*two, *echo), *views(several=True)]),
        Case("launch", "stdin", [step(*off, "sh", "-c", "cat; echo done", stdin="line one\nline two\n")]),
        Case("launch", "program-not-found", [step(*off, "no-such-program-here"), *views()]),
        Case("launch", "not-executable", [step(*off, "./script")], files={"script": "echo hi\n"}),
        Case("launch", "exit-3", [step(*off, "sh", "-c", "echo bye >&2; exit 3"), *views()]),
        Case("launch", "killed-by-signal", [step(*off, "sh", "-c", "echo dying; kill -KILL $$"), *views()]),
        Case("launch", "terminated-by-signal", [step(*off, "sh", "-c", "kill -TERM $$"), *views()]),
        Case("launch", "one-of-two-fails", [launch(*two, "sh", "-c",
                                                   'if [ "$POPDIST_INSTANCE_INDEX" = 0 ]; then touch ready0; '
                                                   "exec sleep 100; fi; while [ ! -e ready0 ]; do sleep 0.05; done; "
                                                   "echo failing; exit 5"), *views(several=True)]),
        Case("launch", "max-restarts", [launch(*off, "--max-restarts", "2", "--restart-backoff", "0", "sh", "-c",
                                               "echo try $POPRUN_RESTART_COUNT; exit 4"), *views()]),
        Case("launch", "max-restarts-recovers", [launch(*off, "--max-restarts", "2", "--restart-backoff", "0", "sh",
                                                        "-c", '[ "$POPRUN_RESTART_COUNT" = 1 ] && exit 0; exit 4'),
                                                 *views()]),
        Case("launch", "restart-scope-instance", [launch(*two, "--max-restarts", "1", "--restart-backoff", "0",
                                                         "--restart-scope", "instance", "sh", "-c",
                                                         # instance 1 fails once; instance 0 ends after its restart
                                                         '[ "$POPDIST_INSTANCE_INDEX$POPRUN_RESTART_COUNT" = 10 ] '
                                                         '&& exit 4; [ "$POPDIST_INSTANCE_INDEX" = 1 ] && '
                                                         "touch restarted && exit 0; "
                                                         "while [ ! -e restarted ]; do sleep 0.05; done"),
                                                  *views(several=True)]),
        Case("launch", "never-retry", [step(*off, "--max-restarts", "2", "sh", "-c", "exit 2"), *views()]),
        Case("launch", "timeout", [step(*off, "--timeout", "1", "sleep", "100"), *views()]),
        Case("launch", "signal-before-timeout", [step(*off, "--timeout", "4", "--signal", "USR1@3", "python3",
                                                      "trap.py"), *views()], files={"trap.py": TRAP}),
        Case("launch", "ctrl-c", [launch(*two, "sh", "-c", "touch ready$POPDIST_INSTANCE_INDEX; exec sleep 100",
                                         wait_for=("work/ready0", "work/ready1", RUNNING), interrupt=signal.SIGINT),
                                  *views(several=True)]),
        Case("launch", "ctrl-c-v", [launch("-v", *off, "sh", "-c", "touch ready; exec sleep 100",
                                           wait_for=("work/ready", RUNNING), interrupt=signal.SIGINT), *views()]),
        Case("launch", "sigterm", [launch(*off, "sh", "-c", "touch ready; exec sleep 100",
                                          wait_for=("work/ready", RUNNING),
                                          interrupt=signal.SIGTERM), *views()]),
        Case("launch", "detach", [step(*off, "--detach", "sh", "-c", "echo started; touch ready; exec sleep 100"),
                                  Step(wait_for=("work/ready",)), step("ps"), step("ps", "--json"),
                                  step("stop", "{RUN}"), *views(), step("stop", "{RUN}")]),
        Case("launch", "views-of-nothing", [step("ps"), step("ps", "--all"), step("ps", "--json"),
                                            step("report", "20200101-000000-abcdef"), step("logs", "nope"),
                                            step("stop", "nope"), step("attach", "nope")]),
        Case("launch", "only-output-from-instance", [launch(*two, "--only-output-from-instance", "1", *echo)]),
        Case("launch", "print-topology", [launch(*two, "--print-topology", "yes", "true")]),
        Case("launch", "instance-args", [launch(*two, "--instance-mpi-local-args", "1:-x EXTRA=1", "sh", "-c",
                                                "echo ${EXTRA:-none}")]),
    ]
    for verbosity in ("-v", "-vv", "-vvv"):
        cases += [Case("launch", f"one{verbosity}", [launch(verbosity, *off, *echo)]),
                  Case("launch", f"two{verbosity}", [launch(verbosity, *two, *echo)]),
                  Case("launch", f"fails{verbosity}", [launch(verbosity, *off, "sh", "-c", "exit 9")])]
    for name, argv in (("events-file", ("--events", "events.jsonl")), ("events-stdout", ("--events", "-")),
                       ("events-fd", ("--events", "fd:1"))):
        cases += [Case("launch", f"{name}-one", [launch(*argv, *off, *echo), *views()]),
                  Case("launch", f"{name}-two", [launch(*argv, *two, *echo), *views(several=True)]),
                  Case("launch", f"{name}-fails", [launch(*argv, *off, "sh", "-c", "exit 6")])]
    return cases


def all_cases(old: Path, new: Path, only: set[str]) -> list[Case]:
    """The cases of the categories asked for."""
    makers = {"help": help_cases, "corpus": lambda: corpus_cases(old, new), "golden": lambda: golden_cases(old, new),
              "saved": saved_cases, "launch": launch_cases}
    return [case for category in CATEGORIES if category in only for case in makers[category]()]


# ---------------------------------------------------------------------------------------------------------------
# Running one side
# ---------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Side:
    """One checkout: its poprun, the root of its cases' folders and what is normalised."""

    name: str
    checkout: Path
    root: Path  # <tmp>/<name>
    version: str
    version_token: str | None  # "<version>" when the two versions differ

    @property
    def venv(self) -> Path:
        """The link to the checkout's virtual environment: the same length on both sides."""
        return self.root / "venv"

    def paths(self) -> dict[str, str]:
        """Paths normalised: this side's folders, its checkout (resolved too) and its environment."""
        return {str(self.root): "<tmp>", str(self.checkout): "<checkout>",
                str(self.checkout.resolve()): "<checkout>", str((self.checkout / ".venv").resolve()): "<venv>"}


def _environment(side: Side, case: Case, folder: Path) -> dict[str, str]:
    env = {"PATH": f"{side.venv}/bin:{BASE_PATH}", "HOME": str(folder / "home"), "LANG": "C.UTF-8",
           "LC_ALL": "C.UTF-8", "TERM": "dumb", "COLUMNS": "120", "TMPDIR": str(folder / "tmp"),
           "XDG_RUNTIME_DIR": str(folder / "xdg/runtime"), "XDG_CONFIG_HOME": str(folder / "xdg/config"),
           "XDG_CACHE_HOME": str(folder / "xdg/cache"), "XDG_STATE_HOME": str(folder / "xdg/state"),
           "XDG_DATA_HOME": str(folder / "xdg/data"), "POPRUN_RUNS_DIR": str(folder / "runs"),
           "USER": os.environ.get("USER", "root"), "LOGNAME": os.environ.get("LOGNAME", "root")}
    if case.home_is_work:
        env["HOME"] = str(folder / "work")
    if case.sys_path:
        env["PYTHONPATH"] = ":".join(str(folder / "work" / p) for p in case.sys_path)
    env.update(case.env)
    return env


def _run_dirs(folder: Path) -> list[Path]:
    """
    The case's run records in the order they were made.

    Two ids of one second sort by their random part, so the time their marker file was written decides.
    """
    runs = folder / "runs"
    if not runs.is_dir():
        return []

    def made(path: Path) -> tuple[str, int, str]:
        marker = path / ".poprun-run"
        return path.name[:15], (marker if marker.exists() else path).stat().st_mtime_ns, path.name

    return sorted((p for p in runs.iterdir() if p.is_dir() and RUN_ID.fullmatch(p.name)), key=made)


def _newest_run(folder: Path) -> str:
    made = _run_dirs(folder)
    return made[-1].name if made else "no-run"


def _there(folder: Path, condition: str) -> bool:
    """Whether a file of the case's folder matching the glob exists (and, after ``~``, holds this text)."""
    pattern, _, text = condition.partition("~")
    for path in folder.glob(pattern):
        if not text:
            return True
        with contextlib.suppress(OSError):
            if text.encode() in path.read_bytes():
                return True
    return False


def _wait_for(folder: Path, conditions: tuple[str, ...], deadline: float,
              proc: subprocess.Popen[bytes] | None) -> bool:
    while not all(_there(folder, c) for c in conditions):
        if time.monotonic() > deadline or (proc is not None and proc.poll() is not None):
            return False
        time.sleep(0.02)
    return True


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="backslashreplace")


def _run_step(side: Side, folder: Path, env: dict[str, str], item: Step, deadline: float) -> str:
    work = folder / "work"
    if not item.argv and item.wait_for:
        ok = _wait_for(folder, item.wait_for, min(deadline, time.monotonic() + item.timeout), None)
        return f"$ (wait for {' '.join(item.wait_for)}: {'there' if ok else TIMED_OUT})\n"
    argv = [a.replace("{RUN}", _newest_run(folder)) for a in item.argv]
    shown = ("$ poprun " + shlex.join(argv) + (f"  < {item.stdin!r}" if item.stdin else "")
             + (f"  {SORTED}" if item.unordered else "") + "\n")
    step_env = {**env, **dict(item.env)}
    timeout = max(1.0, min(item.timeout, deadline - time.monotonic()))
    proc = subprocess.Popen([str(side.venv / "bin" / "poprun"), *argv], cwd=work, env=step_env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    out, err, note, ended = _communicate(proc, item, folder, time.monotonic() + timeout)
    if not ended:
        return f"{shown}{note}--- stdout\n{_decode(out)}--- stderr\n{_decode(err)}--- {TIMED_OUT} after {timeout:.0f} s\n"
    if item.save and proc.returncode == 0:
        (work / item.save).write_bytes(out)
    return f"{shown}{note}--- stdout\n{_decode(out)}--- stderr\n{_decode(err)}--- exit {proc.returncode}\n"


def _communicate(proc: subprocess.Popen[bytes], item: Step, folder: Path, end: float) -> tuple[bytes, bytes, str, bool]:
    """
    Feed poprun its input and read its output until it ends (its pipes are read all along, so it never blocks).

    With ``interrupt``, send it that signal once the conditions of ``wait_for`` hold. Return its output, a note
    and whether it ended before ``end``; if it did not, its process group is killed.
    """
    result: dict[str, tuple[bytes, bytes]] = {}
    reader = threading.Thread(target=lambda: result.setdefault("io", proc.communicate(item.stdin.encode())),
                              daemon=True)
    reader.start()
    note = ""
    if item.interrupt:
        if _wait_for(folder, item.wait_for, end, proc):
            os.kill(proc.pid, item.interrupt)
        else:
            note = "(the files waited for never appeared)\n"
    reader.join(max(0.0, end - time.monotonic()))
    ended = not reader.is_alive()
    if not ended:
        _kill_group(proc)
        reader.join(5)  # a process outside the group may still hold the pipes: what it read is lost then
    out, err = result.get("io", (b"", b""))
    return out, err, note, ended


# A run record's supervisor file: a pid and a start time, nothing else. actual.json: what could be read back of
# each instance from /proc, which depends on how long it lived (see verified_line).
SKIPPED_FILES = {"supervisor", "actual.json"}


def _entries(folder: Path) -> list[tuple[str, Path]]:
    """The working folder's entries, the run records' (in the order they were made, then anything else there), home's."""
    def under(top: str, paths: list[Path]) -> list[tuple[str, Path]]:
        return [(f"{top}/{p.relative_to(folder / top)}", p) for p in paths]

    every = under("work", sorted((folder / "work").rglob("*")))
    made = _run_dirs(folder)
    for run in made:
        every += under("runs", [run, *sorted(run.rglob("*"))])
    others = [p for p in sorted((folder / "runs").rglob("*")) if not any(p == r or r in p.parents for r in made)]
    return every + under("runs", others) + under("home", sorted((folder / "home").rglob("*")))


def _files(folder: Path, before: dict[str, bytes]) -> str:
    """The working folder's new or changed files and every run record's files, each normalised by the caller."""
    parts = []
    for rel, path in _entries(folder):
        if path.is_dir() and not path.is_symlink():
            if not any(path.iterdir()):
                parts.append(f"=== folder {rel} (empty)\n")
            continue
        if path.is_symlink():
            parts.append(f"=== link {rel} -> {path.readlink()}\n")
            continue
        if path.name in SKIPPED_FILES:
            parts.append(f"=== file {rel} (not compared)\n")
            continue
        try:
            data = path.read_bytes()
        except OSError as exc:
            parts.append(f"=== file {rel} (unreadable: {exc.strerror})\n")
            continue
        if before.get(rel) == data:
            continue
        mode = oct(path.stat().st_mode & 0o7777)
        text = _decode(data)
        if rel.startswith("runs/") and rel.endswith("/logs/order"):
            text = log_order(text)
        parts.append(f"=== file {rel} {mode}\n{text}{'' if text.endswith(chr(10)) or not text else chr(10)}")
    return "".join(parts)


def _stop_leftovers(folder: Path) -> None:
    """End the supervisors a case left running (detached runs): by the pid each run record names."""
    runs = folder / "runs"
    if not runs.is_dir():
        return
    for supervisor in runs.glob("*/supervisor"):
        try:
            pid = int(supervisor.read_text().split()[0])
            os.kill(pid, signal.SIGKILL)
        except (OSError, ValueError, IndexError):
            pass


def run_side(side: Side, case: Case, slug: str) -> str:
    """Run the case's steps on one side; return the normalised transcript."""
    folder = side.root / slug
    if folder.exists():
        shutil.rmtree(folder)
    for sub in ("home", "tmp", "runs", "xdg/runtime", "xdg/config", "xdg/cache", "xdg/state", "xdg/data"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    (folder / "xdg/runtime").chmod(0o700)
    work = folder / "work"
    if case.copy_from is not None:
        shutil.copytree(case.copy_from, work, symlinks=True)
        for name in ("expected.txt", "case.json"):
            (work / name).unlink(missing_ok=True)
    else:
        work.mkdir()
    for name, text in case.files.items():
        (work / name).write_text(text, encoding="utf-8", errors="backslashreplace")
    for name, size in case.sparse.items():
        with (work / name).open("wb") as made:
            made.truncate(size)
    before = {f"work/{p.relative_to(work)}": p.read_bytes() for p in work.rglob("*") if p.is_file()}
    env = _environment(side, case, folder)
    deadline = time.monotonic() + CASE_TIMEOUT
    transcript = []
    try:
        for item in case.steps:
            if time.monotonic() > deadline:
                transcript.append("$ (the case ran out of time)\n")
                break
            transcript.append(_run_step(side, folder, env, item, deadline))
        transcript.append(_files(folder, before))
    finally:
        _stop_leftovers(folder)
    text = "".join(transcript)
    versions = (side.version, side.version_token) if side.version_token else None
    text = failure_order(verified_line(canonical_events(normalise(text, side.paths(), versions))))
    return unordered(text)


# ---------------------------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------------------------


def ensure_venv(checkout: Path) -> Path:
    """The checkout's virtual environment with poprun installed, made when it is missing."""
    venv = checkout / ".venv"
    if not (venv / "bin" / "poprun").exists():
        sys.stderr.write(f"making {venv} ...\n")
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "-e", f"{checkout}[test]"], check=True)
    return venv


def version_of(checkout: Path) -> str:
    """The version the checkout's poprun reports."""
    out = subprocess.run([str(checkout / ".venv/bin/python"), "-c", "import poprun; print(poprun.__version__)"],
                         capture_output=True, text=True, check=False)
    return out.stdout.strip()


def slug_of(case: Case) -> str:
    """A folder name for the case."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", f"{case.category}.{case.name}")[:150]


def compare(case: Case, sides: tuple[Side, Side]) -> tuple[Case, str, str, float]:
    """Run the case on both sides; return the two transcripts and the seconds it took."""
    started = time.monotonic()
    slug = slug_of(case)
    old, new = (run_side(side, case, slug) for side in sides)
    for side in sides:  # the folders of an identical case are not kept
        if old == new and TIMED_OUT not in old:
            shutil.rmtree(side.root / slug, ignore_errors=True)
    return case, old, new, time.monotonic() - started


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("old", type=Path, help="the old checkout (with its .venv, made if missing)")
    parser.add_argument("new", type=Path, help="the new checkout")
    parser.add_argument("--only", action="append", choices=CATEGORIES, help="run only this category (repeatable)")
    parser.add_argument("--case", action="append", default=[], help="run only cases whose name contains this")
    parser.add_argument("--out", type=Path, default=Path("differential-out"), help="where the diffs are written")
    parser.add_argument("--jobs", type=int, default=2, help="cases run at the same time (default 2)")
    parser.add_argument("--verbose", action="store_true", help="print each case and its time as it ends")
    parser.add_argument("--transcripts", action="store_true",
                        help="also write every case's normalised transcripts under OUT/transcripts/{old,new}/")
    parser.add_argument("--keep", action="store_true", help="keep the temporary folders")
    return parser.parse_args(argv)


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8", errors="backslashreplace")  # a name or output not UTF-8: shown escaped


def _run_all(cases: list[Case], sides: tuple[Side, Side], args: argparse.Namespace) -> dict[str, list[str]]:
    """
    Run the cases on a small pool; write the diffs (and transcripts).

    Return the slugs of each category's cases, a different one marked with a leading ``!``.
    """
    results: dict[str, list[str]] = {category: [] for category in CATEGORIES}
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        jobs = [pool.submit(compare, case, sides) for case in cases]
        for done, job in enumerate(concurrent.futures.as_completed(jobs), 1):
            case, old_text, new_text, seconds = job.result()
            slug = slug_of(case)
            same = old_text == new_text and TIMED_OUT not in old_text
            results[case.category].append(slug if same else f"!{slug}")
            if args.transcripts:
                for name, text in zip(SIDES, (old_text, new_text), strict=True):
                    _write(args.out / "transcripts" / name / f"{slug}.txt", text)
            if not same:
                diff = difflib.unified_diff(old_text.splitlines(keepends=True), new_text.splitlines(keepends=True),
                                            fromfile=f"old/{slug}", tofile=f"new/{slug}")
                _write(args.out / f"{slug}.diff", "".join(diff))
            if args.verbose or not same:
                sys.stderr.write(f"[{done}/{len(cases)}] {'' if same else 'DIFFERENT '}{slug} ({seconds:.1f} s)\n")
    return results


def _summary(results: dict[str, list[str]], sides: tuple[Side, Side], seconds: float) -> str:
    lines = [f"{'category':<10} {'cases':>6} {'identical':>10} {'different':>10}"]
    for category, slugs in results.items():
        if slugs:
            same = sum(not s.startswith("!") for s in slugs)
            lines.append(f"{category:<10} {len(slugs):>6} {same:>10} {len(slugs) - same:>10}")
    every = [s for slugs in results.values() for s in slugs]
    different = sorted(s[1:] for s in every if s.startswith("!"))
    lines.append(f"{'all':<10} {len(every):>6} {len(every) - len(different):>10} {len(different):>10}")
    lines.append(", ".join(f"{side.name} {side.checkout} ({side.version})" for side in sides) + f"; {seconds:.0f} s")
    lines += [f"different: {slug} (see {slug}.diff)" for slug in different]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Run every case of the categories asked for on both checkouts; print a summary; 0 when all are identical."""
    args = _arguments(argv)
    old, new = args.old.resolve(), args.new.resolve()
    for checkout in (old, new):
        ensure_venv(checkout)
    versions = (version_of(old), version_of(new))
    token = "<version>" if versions[0] != versions[1] else None
    tmp = Path(tempfile.mkdtemp(prefix="poprun-diff-"))
    sides = (Side(SIDES[0], old, tmp / SIDES[0], versions[0], token), Side(SIDES[1], new, tmp / SIDES[1], versions[1], token))
    for side in sides:
        side.root.mkdir()
        side.venv.symlink_to(side.checkout / ".venv")
    cases = all_cases(old, new, set(args.only or CATEGORIES))
    if args.case:
        cases = [c for c in cases if any(part in f"{c.category}.{c.name}" for part in args.case)]
    if args.out.exists():
        shutil.rmtree(args.out)
    args.out.mkdir(parents=True)
    started = time.monotonic()
    try:
        results = _run_all(cases, sides, args)
    finally:
        if not args.keep:
            shutil.rmtree(tmp, ignore_errors=True)
    summary = _summary(results, sides, time.monotonic() - started)
    _write(args.out / "summary.txt", summary)
    sys.stdout.write(summary)
    return 1 if any(slug.startswith("!") for slugs in results.values() for slug in slugs) else 0


if __name__ == "__main__":
    sys.exit(main())
