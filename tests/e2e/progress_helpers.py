"""
What the progress channel's end-to-end tests share: the program that reports progress, and the checks of a run's record.

The program calls ``popdist.progress(i, TOTAL)`` for i in 0..TOTAL-1 with a pause between steps
(its last state, step TOTAL-1 or TOTAL, reaches poprun at its exit). The checks read the run's
record as the tests' own runs folder holds it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

PY = sys.executable
TOTAL = 50
# popdist.progress in a loop; "print" names the host the instance ran on (socket.gethostname())
PROGRAM = ("import os, socket, sys, time, popdist\n"
           "pause = float(sys.argv[1]) if len(sys.argv) > 1 else 0.02\n"
           f"for i in range({TOTAL}):\n"
           f"    popdist.progress(i, {TOTAL}, loss=1.0 / (i + 1))\n"
           "    time.sleep(pause)\n"
           "print(os.environ['POPDIST_INSTANCE_INDEX'], socket.gethostname(), flush=True)\n"
           "time.sleep(float(sys.argv[2]) if len(sys.argv) > 2 else 0)\n")


def only_run(runs: Path) -> Path:
    """Return the directory of the one run under ``runs``."""
    (found,) = [d for d in runs.iterdir() if d.is_dir()]
    return found


def events(run: Path) -> list[dict[str, object]]:
    """Return the run's events, as its record keeps them."""
    return [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]


def last_progress(run: Path) -> dict[int, dict[str, object]]:
    """Return each instance's last instance-progress event of the run."""
    return {int(e["index"]): e for e in events(run) if e["event"] == "instance-progress"}  # type: ignore[call-overload]


def assert_progress_recorded(run: Path, hosts: list[str]) -> None:
    """Every instance (``hosts``: its host, by index) has progress events with its host and a last step of 49 or 50, and step times in the report."""
    last = last_progress(run)
    assert sorted(last) == list(range(len(hosts))), events(run)
    assert [(e["host"], e["step"] in (TOTAL - 1, TOTAL), e["total"]) for _, e in sorted(last.items())] == [
        (host, True, TOTAL) for host in hosts]
    report = json.loads((run / "report.json").read_text())
    progress = report["progress"]["instances"]
    assert [(p["index"], p["host"]) for p in progress] == list(enumerate(hosts))
    for item in progress:
        times = item["step_time_ms"]
        assert item["steps"] >= TOTAL - 10, item  # a few steps' datagrams may be coalesced into the last one
        assert 0 < times["min"] <= times["median"] <= times["p90"] <= times["max"], item
        assert 15 <= times["median"] <= 2000, item  # 20 ms a step (a loaded machine is slower, never faster)


def ps_shows_progress(env: dict[str, str], *, within_s: float = 60) -> dict[str, object] | None:
    """Poll ``poprun ps --json`` until a running run shows progress of TOTAL with an ETA; return it (None: never)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        done = subprocess.run([PY, "-m", "poprun.cli.main", "ps", "--json"], env=env, capture_output=True, text=True,
                              timeout=30, check=False)
        for run in json.loads(done.stdout or "[]"):
            shown = run.get("progress")
            if run["state"] == "running" and shown and shown["total"] == TOTAL and shown["eta_s"] is not None:
                table = subprocess.run([PY, "-m", "poprun.cli.main", "ps"], env=env, capture_output=True, text=True,
                                       timeout=30, check=False).stdout
                return {**shown, "table": table}
        time.sleep(0.2)
    return None


def environ(runs: Path, **extra: str) -> dict[str, str]:
    """Return this process's environment with the test's runs folder."""
    return os.environ | {"POPRUN_RUNS_DIR": str(runs)} | extra
