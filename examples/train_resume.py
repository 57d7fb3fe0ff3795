"""
Training that survives a restart: it checkpoints every few steps and resumes from the last checkpoint.

    poprun --num-instances 2 --num-replicas 2 --offline-mode=1 --max-restarts 2 \\
        python examples/train_resume.py --checkpoint digits.ckpt --crash-at-step 25 --save final.pt
    poprun apply examples/train_resume.toml          # the same launch, declared

The model, data and numerics are ``train_digits.py``'s. Instance 0 writes a checkpoint (the
weights, the optimizer's momentum and the step) every ``--checkpoint-every`` steps, atomically: a
temporary file beside it, flushed, then renamed over the last one, so a crash while writing
leaves the previous checkpoint whole. On start, every instance reads the checkpoint if there is
one and goes on from its step. The data order is a function of the step (the sampler's epoch is
``step // steps_per_epoch``, then the batch within it), so a run that crashed and resumed ends
with the same weights as a run that never crashed: the suite checks exactly that.

``--hold-at-step N`` makes every instance stop at step N of the first attempt, once its checkpoint
is written, and wait there: the moment to take a host away (a lost host's instance is replaced
on a spare, or the plan shrinks: docs/membership.md); the next attempt resumes from step N.

``--crash-at-step N`` makes instance 1 (or 0, with one instance) exit with status 3 at step N on
the first attempt only: poprun's restart count (``popdist.getRestartCount()``, also
``POPRUN_RESTART_COUNT`` and torchrun's ``TORCHELASTIC_RESTART_COUNT``) is 0 there. With
``--max-restarts``, poprun stops every instance and starts them all again; they resume.
The checkpoint must be on a file system every instance reads (one machine, or a shared one).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
from torch import nn

import popdist
import popdist.torch as pdt

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # train_digits beside this file
from train_digits import build_model, evaluate, load_split, training_options


def parse_args() -> argparse.Namespace:
    """Return the command line's settings: train_digits.py's, and the checkpoint's."""
    parser = training_options(__doc__.splitlines()[1], steps=40)
    parser.add_argument("--checkpoint", required=True, help="the checkpoint file: read at start when it exists")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="steps between checkpoints (default 10)")
    parser.add_argument("--crash-at-step", type=int, default=0, help="fail at this step on the first attempt")
    parser.add_argument("--hold-at-step", type=int, default=0,
                        help="on the first attempt, after this step's checkpoint, say 'held at step N' and wait there "
                             "(for a host to be taken away: docs/membership.md)")
    return parser.parse_args()


def restart_count() -> int:
    """Return how many times poprun restarted this run (0 on the first attempt)."""
    return popdist.getRestartCount()


def write_checkpoint(path: str, model: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    """Write the checkpoint of ``step`` atomically: a temporary file, flushed, renamed over the last one."""
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "wb") as file:
        torch.save({"step": step, "model": model.state_dict(), "optimizer": optimizer.state_dict()}, file)
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)


def read_checkpoint(path: str, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Load the checkpoint at ``path`` into ``model`` and ``optimizer``; return its step (0 when there is none)."""
    if not os.path.exists(path):
        return 0
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    return int(state["step"])


def hold(step: int) -> None:
    """Say that this instance holds at ``step`` (its checkpoint written), then wait until poprun stops it."""
    pdt.all_reduce_metrics({"held": 1.0})  # every instance is here: instance 0's checkpoint of this step is written
    print(f"instance {popdist.getInstanceIndex()}: held at step {step}", flush=True)
    while True:
        time.sleep(1)


def train(args: argparse.Namespace) -> tuple[nn.Module, int, float]:
    """Train from the checkpoint (or the start) to ``args.steps``; return the model, the first step run and the loss."""
    replicas = popdist.getNumTotalReplicas()
    train_set, _ = load_split()
    model = build_model(args.hidden, args.seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    first = step = read_checkpoint(args.checkpoint, model, optimizer)
    loader = pdt.data_loader(train_set, batch_size=args.global_batch_size // replicas, seed=args.seed)
    sampler, per_epoch = loader.sampler, len(loader)
    crasher = 1 if popdist.getNumInstances() > 1 else 0
    loss = torch.zeros(())
    popdist.progress(step, args.steps)  # where this attempt starts: 0, or the checkpoint's step
    while step < args.steps:
        sampler.set_epoch(step // per_epoch)  # type: ignore[attr-defined]
        skip = step % per_epoch
        for batch, (features, labels) in enumerate(loader):
            if batch < skip:
                continue
            optimizer.zero_grad()
            loss = nn.functional.cross_entropy(model(features), labels)
            loss.backward()
            pdt.all_reduce_gradients(model)
            optimizer.step()
            step += 1
            popdist.progress(step, args.steps, loss=loss.detach())  # a resumed attempt goes on from its step
            if step == args.crash_at_step and restart_count() == 0 and popdist.getInstanceIndex() == crasher:
                print(f"instance {crasher}: crashing at step {step} on purpose", flush=True)
                os._exit(3)
            if step % args.checkpoint_every == 0 and popdist.getInstanceIndex() == 0:
                write_checkpoint(args.checkpoint, model, optimizer, step)
            if step == args.hold_at_step and restart_count() == 0:
                hold(step)
            if step == args.steps:
                break
    return model, first, pdt.all_reduce_metrics({"loss": loss.item()})["loss"]


def main() -> None:
    """Train (resuming when a checkpoint exists), evaluate, save on instance 0 and report."""
    args = parse_args()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))))
    pdt.init_process_group()
    model, first, loss = train(args)
    accuracy = evaluate(model, load_split()[1])
    if args.save:
        pdt.execute_on_instances({0}, torch.save, model.state_dict(), args.save)
    if popdist.getInstanceIndex() == 0:
        print(json.dumps({"attempt": restart_count(), "resumed_at_step": first, "steps": args.steps, "loss": loss,
                          "accuracy": round(accuracy, 4)}), flush=True)
    pdt.destroy_process_group()


if __name__ == "__main__":
    main()
