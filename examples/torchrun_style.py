"""
A torchrun-style program, which runs under poprun unchanged: it needs nothing of popdist.

    poprun --num-instances 2 --num-replicas 2 --offline-mode=1 python examples/torchrun_style.py
    torchrun --nproc-per-node 2 examples/torchrun_style.py          # the same program

It reads what torchrun sets (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``), which poprun sets for every instance too, joins torch.distributed with
``init_method="env://"``, sums the ranks with ``all_reduce`` (a few rounds, each told to poprun
with ``popdist.progress`` when popdist is installed: a no-op under torchrun) and gathers who is
where. Each process prints one line; rank 0 also prints what it gathered.
"""

from __future__ import annotations

import json
import os
import socket

import torch
import torch.distributed as dist

try:  # poprun's progress when popdist is there (a no-op without poprun); the program runs without it too
    from popdist import progress
except ImportError:
    def progress(step: int, total: int | None = None, **metrics: float) -> None:
        """Report nothing: popdist is not installed."""

ROUNDS = 3


def main() -> None:
    """Join the process group, check a collective, and report."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, init_method="env://")
    total = torch.tensor([0.0])
    for done in range(1, ROUNDS + 1):
        total = torch.tensor([float(rank)])
        dist.all_reduce(total)
        assert total.item() == world * (world - 1) / 2, f"all_reduce gave {total.item()}"
        progress(done, ROUNDS, sum_of_ranks=total.item())
    everyone: list[object] = [None] * world
    dist.all_gather_object(everyone, {"rank": rank, "local_rank": local_rank, "host": socket.gethostname()})
    print(f"rank {rank} of {world}, local rank {local_rank}, master {os.environ['MASTER_ADDR']}:"
          f"{os.environ['MASTER_PORT']}, sum of ranks {total.item():g}", flush=True)
    if rank == 0:
        print(json.dumps(everyone), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
