"""
Launching over ssh: poprun's ssh backend against OpenMPI's own ssh launch, on 8 emulated hosts.

Run as root: ``.venv/bin/python bench/ssh_bench.py [--runs N] [--hosts K]`` (after installing the
project, with Debian's ``openmpi-bin``, ``openssh-server`` and ``iproute2``). It brings up K hosts
(network namespaces, each with its own sshd: ``tests/testhosts.py``), then measures, the two
launchers taking turns, each figure the median of ``--runs`` runs:

1. time until all instances run: every instance (one per host) prints the time at which it
   started; the latest of them minus the moment the launcher was started. poprun runs
   ``poprun --host h1,...,hK --num-instances K --num-replicas K sh -c 'date +%s.%N'`` (the ssh
   backend, chosen because the hosts are remote); OpenMPI runs ``mpirun --host h1,...,hK -np K``
   the same program, launching its daemons over ssh (``plm_rsh_args=-F ssh_config``).
   Target: poprun / mpirun at most 1.0x.
2. the whole launch, to the launcher's exit (for the record; no target).

Both use the hosts' ssh configuration (``POPRUN_SSH_CONFIG`` for poprun, ``OMPI_MCA_plm_rsh_args``
for mpirun). Nothing asserts: the figures are for people and the issue's closing note. The hosts
are removed at the end, whatever happens.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1]))
from tests.testhosts import TestHosts, TestHostsUnavailable, down, up

PY = sys.executable
POPRUN = [str(Path(PY).with_name("poprun"))] if Path(PY).with_name("poprun").exists() else [PY, "-m",
                                                                                          "poprun.cli.main"]
PROGRAM = ["sh", "-c", "date +%s.%N"]


def measure(argv: list[str], env: dict[str, str], expected: int) -> tuple[float, float] | None:
    """Return (time until the last instance started, time to exit) of one run, or None if it failed."""
    start = time.time()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    ended = time.time()
    stamps = [float(word) for line in done.stdout.splitlines() for word in line.split()[-1:]
              if word.replace(".", "", 1).isdigit()]
    if done.returncode != 0 or len(stamps) != expected:
        print(f"  a run failed (status {done.returncode}): {done.stderr.strip()[-300:]}", file=sys.stderr)
        return None
    return max(stamps) - start, ended - start


def main() -> int:
    """Bring the hosts up, measure, print, take them down."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--runs", type=int, default=7, help="runs per measurement (median)")
    parser.add_argument("--hosts", type=int, default=8, help="emulated hosts, one instance each")
    args = parser.parse_args()
    mpirun = shutil.which("mpirun")
    state = Path(tempfile.mkdtemp(prefix="poprun-ssh-bench-"))
    try:
        hosts = up(args.hosts, state)
    except TestHostsUnavailable as exc:
        print(f"cannot bring up test hosts: {exc}", file=sys.stderr)
        return 2
    try:
        return _run(hosts, args.runs, mpirun)
    finally:
        down(state)


def _run(hosts: TestHosts, runs: int, mpirun: str | None) -> int:
    env = os.environ | hosts.env()
    count = len(hosts.names)
    ours = [*POPRUN, "--host", ",".join(hosts.names), "--num-instances", str(count), "--num-replicas", str(count),
            *PROGRAM]
    theirs = [mpirun or "mpirun", "--host", ",".join(hosts.names), "-np", str(count), *PROGRAM]
    print(f"poprun: {' '.join(POPRUN)}\nmpirun: {mpirun or 'not installed: comparison skipped'}\n"
          f"{count} hosts (network namespaces with sshd), one instance each; median of {runs} runs\n")
    results: dict[str, list[tuple[float, float]]] = {"poprun": [], "mpirun": []}
    while len(results["poprun"]) < runs or (mpirun and len(results["mpirun"]) < runs):
        for name, argv in (("poprun", ours), ("mpirun", theirs)):
            if (name == "mpirun" and not mpirun) or len(results[name]) >= runs:
                continue
            if (got := measure(argv, env, count)) is not None:
                results[name].append(got)
    started = {k: statistics.median(r[0] for r in v) for k, v in results.items() if v}
    total = {k: statistics.median(r[1] for r in v) for k, v in results.items() if v}
    print(f"1. time until all {count} instances run: poprun {started['poprun'] * 1e3:.0f} ms"
          + (f", mpirun {started['mpirun'] * 1e3:.0f} ms" if mpirun else ""))
    print(f"2. whole launch, to exit: poprun {total['poprun'] * 1e3:.0f} ms"
          + (f", mpirun {total['mpirun'] * 1e3:.0f} ms" if mpirun else ""))
    if mpirun:
        ratio = started["poprun"] / started["mpirun"]
        print(f"\n  time until all run: poprun / mpirun {ratio:.2f}x   target <= 1.0x   {'ok' if ratio <= 1 else 'MISSED'}")
        print(f"  whole launch:       poprun / mpirun {total['poprun'] / total['mpirun']:.2f}x   (no target)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
