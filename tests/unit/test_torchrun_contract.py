"""torchrun's variables: each instance gets the values torch's elastic agent gives for the same layout."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from popdist import env as names
from poprun.planner.context import Context
from poprun.planner.flags import parse_flags
from poprun.planner.solve import solve

CTX = Context(environ={"PATH": "/usr/bin"}, cwd="/work", local_names=("localhost",))
# The variables of torch's LocalElasticAgent._start_workers that the plan decides (MASTER_*, the
# restart count and the run id are decided at apply time).
COMPARED = ("RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK", "ROLE_NAME", "LOCAL_WORLD_SIZE", "WORLD_SIZE",
            "GROUP_WORLD_SIZE", "ROLE_WORLD_SIZE", "TORCHELASTIC_MAX_RESTARTS")


def torchrun_environments(nnodes: int, nproc_per_node: int, max_restarts: int) -> list[dict[str, str]]:
    """Return each worker's variables, by global rank, as torch's elastic agent assigns them (its own code)."""
    pytest.importorskip("torch")
    from torch.distributed import HashStore
    from torch.distributed.elastic.agent.server.api import SimpleElasticAgent, WorkerSpec

    store = HashStore()
    store.set_timeout(timedelta(seconds=20))
    spec = WorkerSpec(role="default", local_world_size=nproc_per_node, rdzv_handler=None,  # type: ignore[arg-type]
                      entrypoint="python3", max_restarts=max_restarts)
    found: dict[int, list[dict[str, str]]] = {}

    def agent(group_rank: int) -> None:  # one agent per node, meeting in the store as torchrun's do
        workers = SimpleElasticAgent._assign_worker_ranks(None, store, group_rank, nnodes, spec)  # type: ignore[arg-type]
        # as LocalElasticAgent._start_workers writes them
        found[group_rank] = [{"RANK": str(w.global_rank), "LOCAL_RANK": str(w.local_rank),
                              "GROUP_RANK": str(group_rank), "ROLE_RANK": str(w.role_rank), "ROLE_NAME": spec.role,
                              "LOCAL_WORLD_SIZE": str(spec.local_world_size), "WORLD_SIZE": str(w.world_size),
                              "GROUP_WORLD_SIZE": str(nnodes), "ROLE_WORLD_SIZE": str(w.role_world_size),
                              "TORCHELASTIC_MAX_RESTARTS": str(spec.max_restarts)} for w in workers]

    threads = [threading.Thread(target=agent, args=(g,)) for g in range(nnodes)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return sorted((env for g in range(nnodes) for env in found[g]), key=lambda env: int(env["RANK"]))


@pytest.mark.parametrize(("hosts", "per_host", "max_restarts"), [(1, 1, 0), (1, 4, 3), (2, 2, 1), (3, 2, 0),
                                                                 (4, 1, 5)])
def test_each_instance_gets_what_torchrun_gives(hosts: int, per_host: int, max_restarts: int) -> None:
    """nnodes = hosts, nproc_per_node = instances per host: every compared variable is torchrun's value."""
    count = hosts * per_host
    argv = [f"--host={','.join(f'h{k}' for k in range(hosts))}", f"--num-instances={count}",
            f"--num-replicas={count}", f"--max-restarts={max_restarts}", "--backend=ssh", "python3", "train.py"]
    plan = solve(parse_flags(argv).spec, CTX).plan
    ours = [{name: i.env.get(name) for name in COMPARED} for i in plan.instances]

    assert torchrun_environments(hosts, per_host, max_restarts) == ours


def test_the_names_live_in_popdist() -> None:
    """The planner writes torchrun's names from popdist's contract, with the restart count's among them."""
    assert ("GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "default") == (
        names.TORCH_GROUP_RANK, names.TORCH_GROUP_WORLD_SIZE, names.TORCH_ROLE_RANK, names.TORCH_ROLE_WORLD_SIZE,
        names.TORCH_ROLE_NAME, names.DEFAULT_ROLE_NAME)
    assert ("POPRUN_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
            "TORCHELASTIC_RUN_ID") == (names.RESTART_COUNT, names.TORCHELASTIC_RESTART_COUNT,
                                       names.TORCHELASTIC_MAX_RESTARTS, names.TORCHELASTIC_RUN_ID)
