"""
Data-parallel training of a small classifier on scikit-learn's digits, on every instance of a launch.

    poprun --num-instances 4 --num-replicas 4 --offline-mode=1 python examples/train_digits.py
    poprun apply examples/train_digits.toml
    python examples/train_digits.py            # alone: one replica, the same numerics

The seed's promise, kept with a few popdist lines: every replica starts from instance 0's
weights (``broadcast_parameters``), reads its own slice of each global batch (``data_loader``),
gradients are averaged over every replica (``all_reduce_gradients``), and every replica applies
the same update. So for the same ``--global-batch-size``, 1, 2 or 4 replicas end with the same
weights (up to float rounding). The data set ships inside scikit-learn (1,797 8x8 images; no
download): a fixed 80/20 split, the same on every instance. Instance 0 prints one JSON line
with the held-out accuracy (each instance scores its share of the held-out set; the counts are
summed with ``all_reduce``) and, with ``--save``, writes the weights (``execute_on_instances``).
Every step is reported to poprun with ``popdist.progress(step, steps, loss=...)``: ``poprun ps``
shows the step and an ETA (docs/progress.md).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import TensorDataset

import popdist
import popdist.torch as pdt


def training_options(description: str, *, steps: int = 60) -> argparse.ArgumentParser:
    """Return a parser of the training's settings (``train_resume.py`` adds its own to it)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--steps", type=int, default=steps, help=f"optimizer steps (default {steps})")
    parser.add_argument("--global-batch-size", type=int, default=64, help="items per step, all replicas together")
    parser.add_argument("--lr", type=float, default=0.1, help="SGD learning rate")
    parser.add_argument("--momentum", type=float, default=0.9, help="SGD momentum")
    parser.add_argument("--hidden", type=int, default=64, help="hidden units")
    parser.add_argument("--seed", type=int, default=0, help="data order and initial weights")
    parser.add_argument("--save", help="write the final weights here (instance 0)")
    return parser


def parse_args() -> argparse.Namespace:
    """Return the command line's settings."""
    return training_options(__doc__.splitlines()[1]).parse_args()


def load_split(seed: int = 0) -> tuple[TensorDataset, TensorDataset]:
    """Return the digits as (training, held-out) sets: the same fixed 80/20 split on every instance."""
    digits = load_digits()
    features = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    labels = torch.tensor(digits.target, dtype=torch.int64)
    order = torch.tensor(np.random.default_rng(seed).permutation(len(labels)))
    cut = int(0.8 * len(labels))
    train, held_out = order[:cut], order[cut:]
    return TensorDataset(features[train], labels[train]), TensorDataset(features[held_out], labels[held_out])


def build_model(hidden: int, seed: int) -> nn.Module:
    """Return the classifier, initialised on instance 0's weights."""
    # A different seed per instance on purpose: broadcast_parameters makes them all equal.
    torch.manual_seed(seed + popdist.getInstanceIndex())
    model = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))
    pdt.broadcast_parameters(model)
    return model


def train(model: nn.Module, data: TensorDataset, args: argparse.Namespace) -> tuple[float, float]:
    """
    Run ``args.steps`` steps of data-parallel SGD.

    Returns:
        The last step's loss (the mean over every replica) and the seconds the steps after
        the first took (the first pays for PyTorch's lazy set-up).
    """
    replicas = popdist.getNumTotalReplicas()
    if args.global_batch_size % replicas:
        raise SystemExit(f"--global-batch-size {args.global_batch_size} does not divide among {replicas} replicas")
    loader = pdt.data_loader(data, batch_size=args.global_batch_size // replicas, seed=args.seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    loss, step, start = torch.zeros(()), 0, time.perf_counter()
    popdist.progress(step, args.steps)  # the run's own steps from the start (the loader's per-epoch count then only beats)
    while step < args.steps:
        for features, labels in loader:
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(features), labels)
            loss.backward()
            pdt.all_reduce_gradients(model)
            optimizer.step()
            step += 1
            # Tell poprun (poprun ps, the -v line, report.json): coalesced, so cheap at every step; a
            # tensor is converted only when sent (ten times a second at most). A no-op without poprun.
            popdist.progress(step, args.steps, loss=loss.detach())
            if step == 1:
                start = time.perf_counter()
            if step == args.steps:
                break
    elapsed = time.perf_counter() - start
    return pdt.all_reduce_metrics({"loss": loss.item()})["loss"], elapsed


def evaluate(model: nn.Module, data: TensorDataset) -> float:
    """Return the accuracy on ``data``: each instance scores its share, and the counts are summed."""
    mine = popdist.shard_range(len(data), drop_last=False)
    features, labels = data[mine.start:mine.stop]
    with torch.no_grad():
        correct = (model(features).argmax(dim=1) == labels).sum()
    counts = pdt.all_reduce_metrics({"correct": float(correct), "seen": float(len(labels))}, op="sum")
    return counts["correct"] / counts["seen"]


def save(model: nn.Module, path: str) -> None:
    """Write the weights to ``path`` (run on instance 0 only)."""
    torch.save(model.state_dict(), path)


def main() -> None:
    """Train, evaluate, save on instance 0 and report."""
    args = parse_args()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
    pdt.init_process_group()
    train_set, held_out = load_split()
    model = build_model(args.hidden, args.seed)
    loss, elapsed = train(model, train_set, args)
    accuracy = evaluate(model, held_out)
    if args.save:
        pdt.execute_on_instances({0}, save, model, args.save)
    if popdist.getInstanceIndex() == 0:
        print(json.dumps({
            "instances": popdist.getNumInstances(), "replicas": popdist.getNumTotalReplicas(),
            "collectives": pdt.collective_backend(), "steps": args.steps, "global_batch_size": args.global_batch_size,
            "loss": loss, "accuracy": round(accuracy, 4), "train_s": round(elapsed, 3),
            "samples_per_s": round((args.steps - 1) * args.global_batch_size / elapsed, 1) if elapsed else None,
        }), flush=True)
    pdt.destroy_process_group()


if __name__ == "__main__":
    main()
