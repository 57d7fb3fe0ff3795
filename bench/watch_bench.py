"""
The instance watch's cost on poprun's side: what the straggler rule adds to each update the board takes, and a heartbeat tick.

Run: ``.venv/bin/python bench/watch_bench.py [--instances N] [--updates U]``. A real
:class:`~poprun.apply.progress.Board` (W = 20) takes ``U`` progress updates spread over ``N``
instances, round robin, each a step further with a step time of its own, first alone, then with
a :class:`~poprun.apply.watch.Watch` listening (the straggler rule, checked at most once a second
per instance: the updates are given a clock that moves 10 ms each, so every instance is checked
about as often as it would be in a run that reports 100 times a second in all). Then one
heartbeat tick over ``N`` instances, all heard. Each figure is the best of 5 repetitions, in
microseconds: the receiver's thread spends this per datagram (target: the rule adds at most
5 µs an update at 1,000 instances), the watch's thread per tick (target: under 10 ms at 10,000).
Nothing asserts: the figures are for people.
"""

from __future__ import annotations

import argparse
import time

from poprun.apply.progress import Board
from poprun.apply.watch import Watch
from poprun.core.progress import Update


def feed(instances: int, updates: int, *, watched: bool) -> float:
    """Return the seconds ``updates`` updates take on a board of ``instances`` (with a watch listening, or not)."""
    now = [0.0]
    hosts = tuple(f"h{i}" for i in range(instances))
    board = Board(hosts, window=20, clock=lambda: now[0])
    if watched:
        watch = Watch(board, hosts, heartbeat_s=60, window=20, factor=1.5, restart=False, emit=lambda _e: None,
                      end=lambda _v: None, clock=lambda: now[0], thread=False)
        watch.attempt(0)
    made = [Update(index=n % instances, attempt=0, step=n // instances, total=None, time=n * 0.01,
                   step_time=0.1 if n % instances else 0.4) for n in range(updates)]
    began = time.perf_counter()
    for n, update in enumerate(made):
        now[0] = n * 0.01
        board.feed(update, now[0])
    return time.perf_counter() - began


def tick(instances: int) -> float:
    """Return the seconds one heartbeat tick takes over ``instances`` instances, every one of them heard."""
    now = [0.0]
    hosts = tuple(f"h{i}" for i in range(instances))
    board = Board(hosts, window=20, clock=lambda: now[0])
    watch = Watch(board, hosts, heartbeat_s=60, window=20, factor=1.5, restart=False, emit=lambda _e: None,
                  end=lambda _v: None, clock=lambda: now[0], thread=False)
    watch.attempt(0)
    for index in range(instances):
        board.feed(Update(index=index, attempt=0, step=None, total=None, time=0.0), 0.0)
    watch.tick(0.25)
    began = time.perf_counter()
    watch.tick(0.5)
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--instances", type=int, nargs="*", default=[16, 1000])
    parser.add_argument("--updates", type=int, default=100_000)
    args = parser.parse_args()
    for instances in args.instances:
        alone = min(feed(instances, args.updates, watched=False) for _ in range(5)) / args.updates
        watched = min(feed(instances, args.updates, watched=True) for _ in range(5)) / args.updates
        print(f"{instances} instances: an update {alone * 1e6:.2f} µs alone, {watched * 1e6:.2f} µs watched "
              f"(the rule adds {(watched - alone) * 1e6:.2f} µs)")
    for instances in (1000, 10_000):
        best = min(tick(instances) for _ in range(5))
        print(f"a heartbeat tick over {instances} instances: {best * 1e6:.0f} µs")


if __name__ == "__main__":
    main()
