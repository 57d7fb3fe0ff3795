"""
Launching over ssh at 4 to 64 hosts: poprun's ssh backend against OpenMPI's own ssh launch.

Run as root: ``.venv/bin/python bench/ssh_bench.py [--counts 4,16,32,64] [--runs N] [--runs-at K=N]``
(after installing the project, with Debian's ``openmpi-bin``, ``openssh-server`` and ``iproute2``).
It brings up as many hosts as the largest count (network namespaces, each with its own sshd:
``tests/testhosts.py``) and launches on the first K of them for each count K, one instance per
host, the two launchers taking turns (which one goes first alternates too). Every instance
prints the time at which it started. For each count it prints:

1. time until all instances run: the latest start minus the moment the launcher was started,
   the median over the successful runs. poprun runs ``poprun --host h1,...,hK --num-instances K
   --num-replicas K sh -c 'date +%s.%N' MARK`` (the ssh backend, chosen because the hosts are
   remote); OpenMPI runs ``mpirun --host h1,...,hK -np K`` the same program, launching its
   daemons over ssh (``plm_rsh_args=-F ssh_config``). Target: poprun / mpirun at most 0.5x.
2. the whole launch, to the launcher's exit (median; no target).
3. successes out of attempts (a failed launch is counted, never retried), and the reasons of
   the failures, each once with how often it happened. Target: every launch succeeds.
4. leftovers: processes of a launch still alive on the hosts (or ssh clients here) 2 s after
   the launcher exited. They are counted, then killed, so that each run starts clean.
5. growth: time until all run per host, and how it grows from one count to the next against
   the growth of the count itself. Target: at most linear.
6. planning's share of poprun's start: the run record's ``plan`` phase (report.json) over the
   time until all run, the median. Target: under 10%.

Both launchers use the hosts' ssh configuration (``POPRUN_SSH_CONFIG`` for poprun,
``OMPI_MCA_plm_rsh_args`` for mpirun). ``--env NAME=VALUE`` (repeatable) adds a variable to
poprun's environment only (``--relay`` is ``--env POPRUN_SSH_RELAY=on``). Nothing asserts: the
figures are for people and the issue's closing note. The hosts are removed at the end,
whatever happens (and by the hosts' guard process if this one is killed).
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))
from benchsetup import compile_bytecode

from tests.testhosts import TestHosts, TestHostsUnavailable, _netns_inode, _processes_in, down, up

PY = sys.executable
POPRUN = [str(Path(PY).with_name("poprun"))] if Path(PY).with_name("poprun").exists() else [PY, "-m",
                                                                                          "poprun.cli.main"]
PROGRAM = "date +%s.%N"  # run as ``sh -c PROGRAM MARK``: the mark is the shell's $0, in its command line
LINGER_S = 2.0  # a process of a launch still alive this long after the launcher exited is left behind
SEP = "-" * 100


class Run:
    """One launch: how long until all its instances ran and until it exited, or why it failed; what it left."""

    def __init__(self, started: float | None, whole: float, failure: str, left: list[str],
                 plan: float | None = None) -> None:
        self.started, self.whole, self.failure, self.left = started, whole, failure, left  # left: command names
        self.plan = plan  # poprun's planning, from its run record


def main() -> int:
    """Bring the hosts up, measure every count, print, take them down."""
    args = _arguments()
    mpirun = None if args.no_mpirun else shutil.which("mpirun")
    state = Path(tempfile.mkdtemp(prefix="poprun-ssh-bench-"))
    try:
        hosts = up(max(args.counts), state / "hosts", timeout_s=30)
    except TestHostsUnavailable as exc:
        print(f"cannot bring up test hosts: {exc}", file=sys.stderr)
        return 2
    try:
        print(compile_bytecode())
        extra = dict(item.split("=", 1) for item in args.env)
        print(f"poprun: {' '.join(POPRUN)}" + "".join(f" {k}={v}" for k, v in extra.items()))
        print(f"mpirun: {mpirun or 'not used: comparison skipped'}")
        print(f"{max(args.counts)} hosts up (network namespaces with sshd); one instance per host; "
              f"{os.cpu_count()} CPUs here\n")
        results = {count: _measure(hosts, count, args.runs_at.get(count, args.runs), mpirun=mpirun, extra=extra,
                                   runs_dir=state / "runs", timeout_s=args.timeout) for count in args.counts}
        _summary(results)
        return 0
    finally:
        down(state / "hosts")
        shutil.rmtree(state, ignore_errors=True)


def _arguments() -> argparse.Namespace:
    """Parse the command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--counts", default="4,16,32,64", type=lambda s: sorted({int(c) for c in s.split(",")}),
                        help="host counts to launch on, one instance per host (default 4,16,32,64)")
    parser.add_argument("--runs", type=int, default=5, help="launches of each launcher at each count (default 5)")
    parser.add_argument("--runs-at", action="append", default=[], metavar="K=N",
                        help="N launches at count K instead of --runs (repeatable), e.g. --runs-at 64=64")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="add a variable to poprun's environment only (repeatable)")
    parser.add_argument("--relay", action="store_true", help="force poprun's relay start: --env POPRUN_SSH_RELAY=on")
    parser.add_argument("--no-mpirun", action="store_true", help="measure poprun alone")
    parser.add_argument("--timeout", type=float, default=180, help="seconds before a launch counts as hung (180)")
    args = parser.parse_args()
    if any("=" not in item for item in [*args.env, *args.runs_at]):
        parser.error("--env and --runs-at take NAME=VALUE")
    args.runs_at = {int(k): int(v) for k, v in (item.split("=", 1) for item in args.runs_at)}
    args.env += ["POPRUN_SSH_RELAY=on"] if args.relay else []
    return args


def _measure(hosts: TestHosts, count: int, runs: int, *, mpirun: str | None, extra: dict[str, str],
             runs_dir: Path, timeout_s: float) -> dict[str, list[Run]]:
    """Launch ``runs`` times with each launcher on the first ``count`` hosts, taking turns; return the runs."""
    names = hosts.names[:count]
    base = os.environ | hosts.env()
    launchers = {"poprun": (lambda mark: [*POPRUN, "--host", ",".join(names), "--num-instances", str(count),
                                          "--num-replicas", str(count), "sh", "-c", PROGRAM, mark],
                            base | extra)}
    if mpirun:
        launchers["mpirun"] = (lambda mark: [mpirun, "--host", ",".join(names), "-np", str(count),
                                             "sh", "-c", PROGRAM, mark], base)
    results: dict[str, list[Run]] = {name: [] for name in launchers}
    print(f"{count} hosts, {runs} launches each:", flush=True)
    for attempt in range(runs):
        order = list(launchers) if attempt % 2 == 0 else list(reversed(launchers))
        for name in order:
            argv, env = launchers[name]
            mark = f"bench-{uuid.uuid4().hex[:10]}"
            record = runs_dir / mark if name == "poprun" else None
            run = _launch(argv(mark), env | ({"POPRUN_RUNS_DIR": str(record)} if record else {}), hosts, count,
                          timeout_s=timeout_s, record=record)
            results[name].append(run)
            took = f"{run.started * 1e3:.0f} ms" if run.started is not None else f"FAILED: {run.failure}"
            left = collections.Counter(run.left)
            print(f"  {name} #{attempt + 1}: {took}" + (f"; left and killed: {len(run.left)} processes ("
                                                        + ", ".join(f"{n} {c}" for c, n in left.most_common(4))
                                                        + ")" if run.left else ""), flush=True)
    return results


def _launch(argv: list[str], env: dict[str, str], hosts: TestHosts, count: int, *, timeout_s: float,
            record: Path | None = None) -> Run:
    """Run one launch; return how long it took or why it failed, what it left, and its planning (``record``: its runs)."""
    start = time.time()
    proc = subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        err = f"no exit within {timeout_s:.0f} s\n{err}"
    ended = time.time()
    left = _leftovers(hosts, hosts.names[:count])
    stamps = [float(line) for line in out.split() if re.fullmatch(r"\d+\.\d+", line)]
    if proc.returncode != 0 or len(stamps) != count:
        return Run(None, ended - start, _reason(proc.returncode, err, len(stamps), count), left)
    reports = list(record.glob("*/report.json")) if record else []
    plan = json.loads(reports[0].read_text())["phases"].get("plan") if len(reports) == 1 else None
    return Run(max(stamps) - start, ended - start, "", left, plan)


def _reason(status: int, err: str, printed: int, count: int) -> str:
    """
    Return why a launch failed, in words that are alike for alike failures (host names masked).

    poprun's diagnostics give their first one's summary and detail, and how many hosts had
    one (``error[PR406]: host 'hN' cannot be reached: no answer within 4.5 s (57 hosts)``); other
    failures give the first line that says error, failed or cannot.
    """
    lines = [line.strip() for line in err.splitlines() if line.strip()]
    codes = [i for i, line in enumerate(lines) if re.match(r"error\[PR\d{3}\]", line)]
    if codes:
        first = codes[0]
        detail = next((line[2:] for line in lines[first + 1:first + 4]
                       if line.startswith("= ") and not line.startswith("= hint")), "")
        named = {host for i in codes for host in re.findall(r"'(h\d+)'", lines[i])}
        line = lines[first] + (f": {detail}" if detail else "") + (f" ({len(named)} hosts)" if named else "")
    else:
        line = next((line for line in lines if re.search(r"error|fail|cannot|no exit", line, re.IGNORECASE)),
                    lines[0] if lines else f"{printed} of {count} instances printed")
    masked = re.sub(r"\bh\d+\b", "hN", line)  # alike for every host
    return f"status {status}: {masked[:200]}"


def _leftovers(hosts: TestHosts, names: tuple[str, ...]) -> list[str]:
    """
    Return the command names of the processes of the launch alive ``LINGER_S`` after it ended; kill them all.

    On the hosts: anything in their namespaces but the listening sshd (nothing else runs there
    during the bench). Here: ssh clients that use the hosts' ssh_config (both launchers do).
    """
    inodes = {_netns_inode(hosts.namespaces[name]) for name in names}
    listeners = {int((hosts.state / f"sshd_{name}.pid").read_text()) for name in names}
    config = str(hosts.ssh_config)

    def living() -> dict[int, str]:
        remote = {pid: line for pid, (_, line) in _processes_in(inodes).items() if pid not in listeners}
        return remote | _local_ssh_clients(config)

    deadline = time.monotonic() + LINGER_S
    while (left := living()) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            continue
    return sorted(Path(line.split(maxsplit=1)[0] if line.split() else "?").name for line in left.values())


def _local_ssh_clients(config: str) -> dict[int, str]:
    """Return {pid: command line} of the processes in this network namespace whose command line names ``config``."""
    here = Path("/proc/self/ns/net").stat().st_ino
    return {pid: line for pid, (_, line) in _processes_in({here}).items() if config in line and pid != os.getpid()}


def _summary(results: dict[int, dict[str, list[Run]]]) -> None:
    """Print the table of every count, the reasons of the failures and the growth from count to count."""
    print(f"\n{SEP}\n{'hosts':>5} {'launcher':>8} {'ok':>7} {'all run (ms)':>13} {'whole (ms)':>11} "
          f"{'per host (ms)':>14} {'left':>5}   poprun/mpirun (all run, target <= 0.5x)\n{SEP}")
    for count, by_name in results.items():
        for name, runs in by_name.items():
            started, whole = _median([r.started for r in runs]), _median([r.whole for r in runs if not r.failure])
            ratio = ""
            if name == "poprun" and "mpirun" in by_name:
                theirs = _median([r.started for r in by_name["mpirun"]])
                if started and theirs:
                    ratio = f"{started / theirs:.2f}x {'ok' if started / theirs <= 0.5 else 'MISSED'}"
            ok = sum(1 for r in runs if not r.failure)
            print(f"{count:>5} {name:>8} {f'{ok}/{len(runs)}':>7} {_ms(started):>13} {_ms(whole):>11} "
                  f"{_ms(started / count if started else None):>14} {sum(len(r.left) for r in runs):>5}   {ratio}")
    print(SEP)
    _failures(results)
    _growth(results)
    _planning(results)


def _failures(results: dict[int, dict[str, list[Run]]]) -> None:
    """Print each distinct reason of failure once per count and launcher, with how often it happened."""
    for count, by_name in results.items():
        for name, runs in by_name.items():
            hosts: dict[str, list[int]] = collections.defaultdict(list)  # reason -> how many hosts each time
            for run in runs:
                if run.failure:
                    many = re.search(r" \((\d+) hosts\)$", run.failure)
                    hosts[run.failure[:many.start()] if many else run.failure].append(int(many[1]) if many else 0)
            for reason, named in sorted(hosts.items(), key=lambda item: -len(item[1])):
                span = f" ({min(named)} to {max(named)} hosts)" if max(named) else ""
                print(f"failed: {count} hosts, {name}, {len(named)}x: {reason}{span}")


def _growth(results: dict[int, dict[str, list[Run]]]) -> None:
    """Print how the time until all run grows from each count to the next, against the count's growth."""
    counts = list(results)
    for name in ("poprun", "mpirun"):
        steps = []
        for low, high in itertools.pairwise(counts):
            a = _median([r.started for r in results[low].get(name, [])])
            b = _median([r.started for r in results[high].get(name, [])])
            if a and b:
                grows = (b / a) / (high / low)
                steps.append(f"{low}->{high}: {b / a:.2f}x for {high / low:.0f}x hosts "
                             f"({'linear or better' if grows <= 1 else 'WORSE than linear'})")
        if steps:
            print(f"growth of {name}'s time until all run: " + "; ".join(steps))


def _planning(results: dict[int, dict[str, list[Run]]]) -> None:
    """Print poprun's planning against its time until all run, at each count (target: under 10%)."""
    shares = []
    for count, by_name in results.items():
        runs = [r for r in by_name.get("poprun", []) if r.plan is not None and r.started]
        plan, started = _median([r.plan for r in runs]), _median([r.started for r in runs])
        if plan is not None and started:
            shares.append(f"{count} hosts: {plan * 1e3:.0f} ms of {started * 1e3:.0f} ms = {plan / started:.0%} "
                          f"({'ok' if plan / started < 0.10 else 'MISSED'})")
    if shares:
        print("poprun's planning in its time until all run (target < 10%): " + "; ".join(shares))


def _median(values: list[float | None]) -> float | None:
    """Return the median of the values that are not None, or None if there are none."""
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def _ms(seconds: float | None) -> str:
    """Return ``seconds`` in whole milliseconds, or "-" when unknown."""
    return "-" if seconds is None else f"{seconds * 1e3:.0f}"


if __name__ == "__main__":
    sys.exit(main())
