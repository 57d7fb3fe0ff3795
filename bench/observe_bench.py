"""
The cost of ``--notify`` and ``--metrics-file``: what the run pays, measured with the real parts.

Run: ``.venv/bin/python bench/observe_bench.py [--events N] [--instances N]``. Nothing asserts:
the figures are for people.

1. Telling the notifier an event (what the relay's thread pays): the time to queue ``--events``
   attempt-ended events, per event; then the time until every notification's command
   (``cat > /dev/null``, through ``/bin/sh`` in a watchdog's group) has run, per notification.
2. One version of the metrics file for ``--instances`` instances: rendering it, and rendering,
   writing, ``fsync``-ing and renaming it (what the metrics thread does once a second), in a
   temporary folder.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

from poprun.apply.metrics import MetricsFile, render
from poprun.apply.notify import Notifier
from poprun.core.events import AttemptEnded
from poprun.core.progress import InstanceProgress
from poprun.planner.plan import Observe


def notifier(events: int) -> None:
    n = Notifier(Observe(notify="cat > /dev/null", notify_on=("attempt-ended",), notify_timeout_ms=60000),
                 dict(os.environ), "bench")
    started = time.perf_counter()
    for number in range(events):
        n.event(AttemptEnded(attempt=number, status=1))
    queued = time.perf_counter() - started
    n.close()
    ran = time.perf_counter() - started
    print(f"notify: {events} events queued in {queued * 1e3:.2f} ms ({queued / events * 1e6:.1f} us each); "
          f"{n.sent} commands ran in {ran:.2f} s ({ran / max(n.sent, 1) * 1e3:.1f} ms each)")


def metrics(instances: int) -> None:
    progress = [InstanceProgress(index=i, host=f"pod{i // 4}", attempt=0, step=1234, total=5000, steps_per_s=4.0,
                                 step_time_s=0.25, eta_s=941.5, heard_s=0.3, calls=1234) for i in range(instances)]
    rendered, written = [], []
    with tempfile.TemporaryDirectory() as folder:
        kept = MetricsFile(os.path.join(folder, "poprun.prom"), run_id="bench", backend="ssh",
                           snapshot=lambda: progress)
        for _ in range(20):
            started = time.perf_counter()
            text = render(run_id="bench", backend="ssh", state="running", attempt=0, restarts=0, progress=progress)
            rendered.append(time.perf_counter() - started)
            started = time.perf_counter()
            kept.write()
            written.append(time.perf_counter() - started)
        kept.close()
    print(f"metrics: {instances} instances, {len(text)} bytes: render {statistics.median(rendered) * 1e3:.1f} ms, "
          f"render + write + fsync + rename {statistics.median(written) * 1e3:.1f} ms (medians of 20)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--events", type=int, default=50)
    parser.add_argument("--instances", type=int, default=1024)
    args = parser.parse_args()
    notifier(args.events)
    metrics(args.instances)


if __name__ == "__main__":
    main()
