"""
Probe program for the e2e tests: print what poprun gave this instance, then end as asked.

Prints one JSON line: every field of ``popdist.current()``, plus ``instance_index``
(``popdist.getInstanceIndex()``), ``pid`` and ``executable_cache_exists`` (whether the cache
directory exists while the instance runs). ``--sleep S`` waits before exiting and
``--exitcode N`` exits with N; ``--ignore-sigterm`` makes teardown need SIGKILL.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import time
from pathlib import Path

import popdist


def main() -> int:
    """Print the JSON line; return the requested exit code."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--exitcode", type=int, default=0)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--ignore-sigterm", action="store_true")
    args = parser.parse_args()
    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    config = popdist.current()
    record = dataclasses.asdict(config) | {
        "instance_index": popdist.getInstanceIndex(),
        "pid": os.getpid(),
        "executable_cache_exists": bool(config.executable_cache_path and Path(config.executable_cache_path).is_dir()),
    }
    print(json.dumps(record, sort_keys=True), flush=True)  # noqa: T201 - the probe's one output
    time.sleep(args.sleep)
    return int(args.exitcode)


if __name__ == "__main__":
    sys.exit(main())
