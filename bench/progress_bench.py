"""
The cost of ``popdist.progress`` and ``popdist.heartbeat``: per call, and on a training step.

Run: ``.venv/bin/python bench/progress_bench.py [--rounds N]`` (torch installed, as the ``test``
extra does, for the training step; without it a pure Python step of similar cost stands in).
Each condition runs in a fresh interpreter (popdist's sender is per process): one whose
``POPRUN_PROGRESS`` names a UDP receiver of this script, which a thread keeps draining as poprun
would, and one without ``POPRUN_PROGRESS`` (a program run without poprun). Every figure is
the median over ``--rounds`` rounds; per-call figures are net of the same loop calling a Python
function that does nothing (so they are popdist's own cost, the call included). Nothing
asserts: the figures are for people, each printed with its target and ``ok`` or ``MISSED``.

1. A coalesced ``progress(step, total, loss=...)`` call (what almost every call is: within 0.1 s
   of the last send, it only stores its values); target under 2 us.
2. A sending call (every call sends: the interval set to 0): converting the values, building the
   JSON, checking the socket is still popdist's, ``sendto``; no target (at most ten a second).
3. A coalesced ``heartbeat()``; target under 2 us. 4. Both without ``POPRUN_PROGRESS``: a no-op.
5. The first call of a process (reading the environment, importing ``socket`` and ``json``, the
   socket): once per process.
6. One ``progress`` call between two training steps, timed alone (median): its cost with the
   caches full of the step's data, which is what a training loop pays.
7. A training step with and without ``popdist.progress(step, total, loss=loss.detach())``: a
   small MLP's step on CPU (64 -> 512 -> 10, batch 256, forward, backward, SGD; one thread), the two loops
   taking turns; the slowdown target is under 1 %. With a receiver and without.
8. How many datagrams the receiver got per second from a program that only calls ``progress``
   for 3 s, as fast as it can (at most about 10).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "0123456789abcdef" * 2  # a bench run's token


def child(rounds: int) -> dict[str, float]:
    """Measure in this process (its environment says whether there is a receiver); return the figures in seconds."""
    import popdist
    from popdist import _progress

    figures: dict[str, float] = {}
    began = time.perf_counter()
    popdist.progress(0, 1_000_000)
    figures["first"] = time.perf_counter() - began
    figures["coalesced"] = per_call(lambda i: popdist.progress(i, 1_000_000, loss=0.5), rounds)
    figures["heartbeat"] = per_call(lambda _: popdist.heartbeat(), rounds)
    _progress.INTERVAL_S = 0.0
    figures["sending"] = per_call(lambda i: popdist.progress(i, 1_000_000, loss=0.5), rounds, calls=20_000)
    _progress.INTERVAL_S = 0.1
    figures |= training(rounds)
    return figures


def per_call(call: object, rounds: int, calls: int = 200_000) -> float:
    """Return the median over ``rounds`` of a call's cost, net of the same loop calling a no-op function."""

    def nothing(_: int) -> None:
        pass

    def loop(function: object) -> float:
        began = time.perf_counter()
        for i in range(calls):
            function(i)  # type: ignore[operator]
        return time.perf_counter() - began

    samples = [(loop(call) - loop(nothing)) / calls for _ in range(rounds)]
    return max(statistics.median(samples), 0.0)


def training(rounds: int) -> dict[str, float]:
    """
    Return the step time of a small training loop without and with a progress call, and their ratio.

    The two loops take turns every 20 steps in the order bare, reported, reported, bare (which
    cancels a steady drift of the machine's speed), ``rounds * 10`` times, and the ratio is the
    median of each turn's ratio, so that the machine's slow spells (other processes) weigh on
    both alike. ``noise`` is the same figure for the bare loop against itself (four more bare
    runs per turn): what a ratio this close to 1 can be trusted to. Times are the process's CPU
    time, so that other processes of a busy machine taking the core away are not counted.
    """
    import popdist

    step = torch_step() or python_step()
    steps, turns = 20, rounds * 10

    clock = time.process_time  # CPU time: another process taking the core away is not counted

    def bare() -> float:
        began = clock()
        for i in range(steps):
            loss = step(i)  # kept until the next step, as a training loop keeps it (and as the reported loop does)
        del loss
        return (clock() - began) / steps

    def reported() -> float:
        began = clock()
        for i in range(steps):
            loss = step(i)
            popdist.progress(i, steps, loss=loss)
        return (clock() - began) / steps

    in_loop = []
    for i in range(turns * steps // 4):  # each call timed alone, between two steps: popdist's code and data cold
        loss = step(i)
        began = time.perf_counter_ns()
        popdist.progress(i, steps, loss=loss)
        in_loop.append(time.perf_counter_ns() - began)
    turns_measured = [(bare(), reported(), reported(), bare(), bare(), bare(), bare(), bare()) for _ in range(turns)]
    return {"step": statistics.median(t[0] for t in turns_measured),
            "step_reported": statistics.median(t[1] for t in turns_measured),
            "ratio": statistics.median((t[1] + t[2]) / (t[0] + t[3]) for t in turns_measured),
            "noise": statistics.median((t[5] + t[6]) / (t[4] + t[7]) for t in turns_measured),
            "in_loop": statistics.median(in_loop) / 1e9, "torch": float(step.__name__ == "torch_train_step")}


def flood(seconds: float) -> dict[str, float]:
    """Call ``progress`` as fast as possible for ``seconds``; return the calls and the seconds they took."""
    import popdist

    calls, now = 0, time.perf_counter
    began = now()
    end = began + seconds
    while now() < end:
        calls += 1
        popdist.progress(calls, None, loss=0.5)
    return {"calls": calls, "seconds": now() - began}


def torch_step() -> object:
    """Return a small MLP's training step on CPU (returns its loss, detached), or None without torch."""
    try:
        import torch
    except ImportError:
        return None
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    features, labels = torch.randn(256, 64), torch.randint(0, 10, (256,))

    def torch_train_step(_: int) -> object:
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(features), labels)
        loss.backward()
        optimizer.step()
        return loss.detach()

    return torch_train_step


def python_step() -> object:
    """Return a pure Python step of a few hundred microseconds (sums of squares), standing in for torch."""

    def python_train_step(i: int) -> float:
        return float(sum(j * j for j in range(i % 7, 3000)))

    return python_train_step


class Drain:
    """A UDP receiver on loopback that a thread keeps reading, as poprun's does, counting datagrams."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.count = 0
        self.stopped = False
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stopped:
            try:
                self.sock.recv(2048)
                self.count += 1
            except TimeoutError:
                continue

    def stop(self) -> None:
        self.stopped = True
        self.thread.join()
        self.sock.close()


def measure(rounds: int, *, receiver: Drain | None, flood_s: float = 0.0) -> dict[str, float]:
    """Run the child measurements (or its flood of calls) in a fresh interpreter; return its figures."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("POPRUN_", "POPDIST_"))}
    if receiver is not None:
        environ |= {"POPRUN_PROGRESS": f"127.0.0.1:{receiver.sock.getsockname()[1]}", "POPRUN_PROGRESS_TOKEN": TOKEN}
    done = subprocess.run([sys.executable, __file__, "--child", "--rounds", str(rounds), "--flood", str(flood_s)],
                          env=environ, cwd=ROOT, capture_output=True, text=True, check=True)
    figures: dict[str, float] = json.loads(done.stdout)
    return figures


def line(name: str, value: str, target: str, ok: bool | None) -> None:
    """Print one figure with its target and verdict."""
    verdict = "" if ok is None else ("ok" if ok else "MISSED")
    print(f"  {name:<56} {value:<22} target {target:<10} {verdict}")


def report(title: str, figures: dict[str, float]) -> None:
    """Print one condition's figures."""
    us = 1e6
    print(title)
    line("progress(), coalesced (almost every call)", f"{figures['coalesced'] * us:.3f} us", "< 2 us",
         figures["coalesced"] < 2e-6)
    line("heartbeat(), coalesced", f"{figures['heartbeat'] * us:.3f} us", "< 2 us", figures["heartbeat"] < 2e-6)
    line("progress(), every call sending", f"{figures['sending'] * us:.3f} us", "-", None)
    line("the first call of a process", f"{figures['first'] * 1e3:.3f} ms", "-", None)
    slowdown = figures["ratio"] - 1
    kind = "torch MLP" if figures["torch"] else "Python stand-in"
    line(f"training step ({kind}) without progress()", f"{figures['step'] * us:.1f} us", "-", None)
    line("training step with progress(step, total, loss=loss)", f"{figures['step_reported'] * us:.1f} us", "-", None)
    line("progress() between two training steps (cold caches)", f"{figures['in_loop'] * us:.3f} us", "-", None)
    line("slowdown of a training step (median of turns' ratios)", f"{slowdown * 100:+.2f} %", "< 1 %", slowdown < 0.01)
    line("  noise: the bare loop against itself", f"{(figures['noise'] - 1) * 100:+.2f} %", "-", None)


def main() -> None:
    """Measure with a receiver, then without POPRUN_PROGRESS."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--rounds", type=int, default=20, help="rounds per figure (median)")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--flood", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(flood(args.flood) if args.flood else child(args.rounds)))
        return
    print(f"{os.cpu_count()} CPU cores, Python {sys.version.split()[0]}, median of {args.rounds} rounds")
    drain = Drain()
    with_receiver = measure(args.rounds, receiver=drain)
    report("with a receiver (POPRUN_PROGRESS set):", with_receiver)
    drain.count = 0
    flooded = measure(args.rounds, receiver=drain, flood_s=3.0)
    time.sleep(0.5)  # the last datagrams (the exit's) reach the draining thread
    drain.stop()
    rate = drain.count / flooded["seconds"]
    line(f"{flooded['calls'] / flooded['seconds'] / 1e6:.2f} million calls a second for 3 s: datagrams a second",
         f"{rate:.1f}", "<= ~10", rate <= 11)
    without = measure(args.rounds, receiver=None)
    report("without POPRUN_PROGRESS (a no-op):", without)


if __name__ == "__main__":
    main()
