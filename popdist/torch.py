"""
PopDist for PyTorch: data-parallel training on the instances of a poprun launch, on CPU or CUDA.

Standalone: PyTorch (imported by this module, which ``import popdist`` never imports), the
standard library, and mpi4py under a real MPI launcher; never imports ``poprun``.

- :func:`init_process_group` opens popdist's host-side backend (``popdist.init()``) and
  torch.distributed's process group from the launch's environment: rank = instance index,
  world size = instances, ``gloo`` on CPU, ``nccl`` with CUDA, at ``MASTER_ADDR:MASTER_PORT``
  (loopback when ``MASTER_ADDR`` does not resolve, as in a multi-host offline launch). One
  instance needs no process group, and gets none.
- The collectives here (:func:`broadcast_parameters`, :func:`all_reduce`,
  :func:`all_reduce_gradients`, :func:`all_reduce_metrics`) go through mpi4py when
  ``popdist.init()`` chose MPI (a real ``mpirun`` started the instances: the role Horovod had
  under real poprun), through the process group otherwise, and do nothing with one instance.
- :class:`DistributedSampler` and :func:`data_loader` share a map-style dataset out the way
  ``poptorch.DataLoader`` does under popdist: one permutation from the same seed on every
  instance, and only whole batches (drop-last). Each step reads one *global batch* of
  ``batch_size * getNumTotalReplicas()`` consecutive items of the permutation, split among the
  replicas in replica order, so the items of a step do not depend on how many instances share it.
- :func:`execute_on_instances` is ``popdist.execute_on_instances``: after
  :func:`init_process_group`, every instance waits for it (checkpoint on instance 0 only).
- Progress (``popdist.progress``; no-ops without poprun): :func:`data_loader`'s batches report
  ``progress(batches done, batches per epoch, epoch=E)`` as each next batch is taken (and at
  the epoch's end), until the program calls ``popdist.progress`` itself: from then on its own
  steps win and the loader only beats ``popdist.heartbeat()``. :func:`all_reduce_gradients`
  beats ``popdist.heartbeat()`` after each reduction (a step's collective is behind it).

Not thread-safe: call these from one thread, in the same order on every instance.
"""

from __future__ import annotations

import importlib
import os
import socket
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, cast

from popdist import _framework

_framework.require("torch", user="popdist.torch", package="PyTorch (the 'torch' package)")

import torch  # noqa: E402 - after the check that names what is missing
import torch.distributed as dist  # noqa: E402
from torch.utils.data import DataLoader, Dataset, Sampler  # noqa: E402

import popdist  # noqa: E402
from popdist import _contract as env  # noqa: E402
from popdist import _progress  # noqa: E402
from popdist._backend import DEFAULT_TIMEOUT_S, execute_on_instances  # noqa: E402
from popdist._rendezvous import LOOPBACK  # noqa: E402

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator, Mapping, Sized

T = TypeVar("T")
ReduceOp = Literal["mean", "sum", "max", "min"]

__all__ = [
    "DistributedSampler",
    "all_reduce",
    "all_reduce_gradients",
    "all_reduce_metrics",
    "broadcast_parameters",
    "collective_backend",
    "data_loader",
    "default_backend",
    "destroy_process_group",
    "device",
    "execute_on_instances",
    "init_process_group",
    "is_initialized",
]


class _Collectives(Protocol):
    """How the collectives of this module reach the other instances."""

    name: str

    def all_reduce(self, flat: torch.Tensor, op: ReduceOp) -> None:
        """Reduce ``flat`` in place across every instance (``mean`` is done by the caller as a sum)."""

    def broadcast(self, flat: torch.Tensor, root: int) -> None:
        """Overwrite ``flat`` everywhere with instance ``root``'s."""


class _Single:
    """One instance: every collective is the identity."""

    name = "single"

    def all_reduce(self, flat: torch.Tensor, op: ReduceOp) -> None:
        """Leave ``flat`` as it is."""

    def broadcast(self, flat: torch.Tensor, root: int) -> None:
        """Leave ``flat`` as it is."""


class _ProcessGroup:
    """torch.distributed's default process group (gloo or nccl)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._ops = {"mean": dist.ReduceOp.SUM, "sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
                     "min": dist.ReduceOp.MIN}

    def all_reduce(self, flat: torch.Tensor, op: ReduceOp) -> None:
        """Reduce ``flat`` in place with ``dist.all_reduce`` (on the GPU first with nccl)."""
        with self._on_device(flat) as moved:
            dist.all_reduce(moved, op=self._ops[op])

    def broadcast(self, flat: torch.Tensor, root: int) -> None:
        """Overwrite ``flat`` with instance ``root``'s through ``dist.broadcast``."""
        with self._on_device(flat) as moved:
            dist.broadcast(moved, src=root)

    def _on_device(self, flat: torch.Tensor) -> _Staged:
        """Return ``flat`` staged where the backend can reduce it: nccl needs CUDA tensors."""
        if self.name == "nccl" and not flat.is_cuda:
            return _Staged(flat, device())
        return _Staged(flat, None)


class _Staged:
    """A context manager: a tensor copied to ``target`` on entry, and copied back on exit."""

    def __init__(self, tensor: torch.Tensor, target: torch.device | None) -> None:
        self._tensor = tensor
        self._moved = tensor if target is None else tensor.to(target)

    def __enter__(self) -> torch.Tensor:
        return self._moved

    def __exit__(self, *exc: object) -> None:
        if self._moved is not self._tensor:
            self._tensor.copy_(self._moved)


class _Mpi:
    """mpi4py on ``MPI.COMM_WORLD``, whose ranks popdist checked against the instance indices."""

    name = "mpi"

    def __init__(self) -> None:
        self._mpi: Any = importlib.import_module("mpi4py.MPI")
        self._ops = {"mean": self._mpi.SUM, "sum": self._mpi.SUM, "max": self._mpi.MAX, "min": self._mpi.MIN}

    def all_reduce(self, flat: torch.Tensor, op: ReduceOp) -> None:
        """Reduce ``flat`` in place with ``Allreduce`` on a host copy."""
        host = flat.detach().cpu().contiguous()
        self._mpi.COMM_WORLD.Allreduce(self._mpi.IN_PLACE, host.numpy(), op=self._ops[op])
        flat.copy_(host)

    def broadcast(self, flat: torch.Tensor, root: int) -> None:
        """Overwrite ``flat`` with instance ``root``'s through ``Bcast`` on a host copy."""
        host = flat.detach().cpu().contiguous()
        self._mpi.COMM_WORLD.Bcast(host.numpy(), root=root)
        flat.copy_(host)


class _State:
    """What :func:`init_process_group` opened."""

    collectives: _Collectives | None = None
    owns_group: bool = False


_STATE = _State()


def default_backend() -> str:
    """Return the process group backend for this machine: ``"nccl"`` with CUDA, else ``"gloo"``."""
    return "nccl" if torch.cuda.is_available() else "gloo"


def device() -> torch.device:
    """
    Return this instance's device: its first accelerator with CUDA, else the CPU.

    With ``poprun --devices-per-instance``: the first of ``POPDIST_DEVICES`` (``cuda:0`` when the
    instance sees only its own devices; its own index among the host's under ``--device-visibility
    all``). Without: ``cuda:<local instance index modulo the GPUs>``.
    """
    if not torch.cuda.is_available():
        return torch.device("cpu")
    own = env.devices(os.environ)
    if own and own[0] < torch.cuda.device_count():
        return torch.device("cuda", own[0])
    return torch.device("cuda", env.local_instance_index(os.environ) % torch.cuda.device_count())


def init_process_group(backend: str | None = None, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
    """
    Open popdist's host-side backend and torch.distributed's process group; collective.

    Every instance calls it, and it returns when all have. Calling it again does nothing until
    :func:`destroy_process_group`. A process group that the program opened itself is kept.

    Args:
        backend: the process group's backend; ``None`` for :func:`default_backend`.
        timeout_s: how long the instances may take to meet, and a collective to finish.

    Raises:
        popdist.BackendError: when the instances cannot meet within ``timeout_s``.
    """
    if _STATE.collectives is not None:
        return
    popdist.init(timeout_s=timeout_s)
    count = env.num_instances(os.environ)
    if count > 1 and not dist.is_initialized():
        _open_group(backend or default_backend(), count, timeout_s)
        _STATE.owns_group = True
    _STATE.collectives = _choose(count)


def _open_group(backend: str, count: int, timeout_s: float) -> None:
    """Open the default process group of ``count`` instances at ``MASTER_ADDR:MASTER_PORT``."""
    if backend == "nccl":
        torch.cuda.set_device(device())
    host, port = env.master_address(os.environ)
    dist.init_process_group(backend, init_method=f"tcp://{_reachable(host)}:{port}",
                            rank=env.instance_index(os.environ), world_size=count,
                            timeout=timedelta(seconds=timeout_s))


def _reachable(host: str) -> str:
    """Return ``host`` as an IPv4 address, or loopback when it does not resolve (an offline multi-host launch)."""
    try:
        return socket.gethostbyname(host)
    except OSError:
        return LOOPBACK


def _choose(count: int) -> _Collectives:
    """Return the collectives for ``count`` instances under the backend ``popdist.init()`` opened."""
    if count == 1:
        return _Single()
    if popdist.backend_name() == "mpi":
        return _Mpi()
    return _ProcessGroup(str(dist.get_backend()))


def is_initialized() -> bool:
    """Return whether :func:`init_process_group` was called (and :func:`destroy_process_group` not since)."""
    return _STATE.collectives is not None


def collective_backend() -> str | None:
    """Return what the collectives use: ``"single"``, ``"mpi"``, ``"gloo"`` or ``"nccl"``; ``None`` before init."""
    return None if _STATE.collectives is None else _STATE.collectives.name


def destroy_process_group() -> None:
    """
    Close the process group opened by :func:`init_process_group`, then popdist's backend; collective.

    The instances meet first (a barrier): an instance that tore its gloo connections down while
    another still had a collective in flight on them could make that one abort at exit
    ("terminate called without an active exception", status 134).
    """
    if _STATE.owns_group and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    _STATE.collectives, _STATE.owns_group = None, False
    popdist.finalize()


def _collectives() -> _Collectives:
    """Return the open collectives; with one instance they need no :func:`init_process_group`."""
    if _STATE.collectives is not None:
        return _STATE.collectives
    if env.num_instances(os.environ) == 1:
        return _Single()
    raise RuntimeError("popdist.torch collectives need popdist.torch.init_process_group() first: "
                       f"this launch has {env.num_instances(os.environ)} instances")


def _apply_flat(tensors: Iterable[torch.Tensor], action: Any) -> None:
    """Call ``action`` on one flat copy of ``tensors`` per dtype and device, then write the results back."""
    groups: dict[tuple[torch.dtype, torch.device], list[torch.Tensor]] = {}
    for tensor in tensors:
        groups.setdefault((tensor.dtype, tensor.device), []).append(tensor)
    with torch.no_grad():
        for members in groups.values():
            flat = torch.cat([t.detach().reshape(-1) for t in members])
            action(flat)
            for tensor, part in zip(members, torch.split(flat, [t.numel() for t in members]), strict=True):
                tensor.copy_(part.view_as(tensor))


def broadcast_parameters(module: torch.nn.Module, *, root: int = 0) -> None:
    """
    Give every instance instance ``root``'s parameters and buffers, so that all start alike.

    Call it after building the model and before building the optimizer.
    """
    collectives = _collectives()
    _apply_flat([*module.parameters(), *module.buffers()], lambda flat: collectives.broadcast(flat, root))


def all_reduce(tensor: torch.Tensor, *, op: ReduceOp = "mean") -> torch.Tensor:
    """
    Reduce ``tensor`` across the instances, in place, and return it.

    ``"mean"`` divides the sum by the number of instances; ``"sum"``, ``"max"`` and ``"min"``
    are what they say.
    """
    collectives = _collectives()
    _apply_flat([tensor], lambda flat: collectives.all_reduce(flat, op))
    if op == "mean":
        with torch.no_grad():
            tensor.div_(env.num_instances(os.environ))
    return tensor


def all_reduce_gradients(module: torch.nn.Module) -> None:
    """
    Replace each gradient of ``module`` by the mean over every replica of the launch.

    An instance's gradient is the mean over its replicas' items, so it weighs ``local
    replicas / total replicas`` in the sum: the result equals the gradient of one process that
    read the whole global batch, also when instances hold different numbers of replicas. Call
    it between ``loss.backward()`` and ``optimizer.step()``, on every instance; every parameter
    must have a gradient on all of them or on none. Then beats ``popdist.heartbeat()``.
    """
    collectives = _collectives()
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    if not isinstance(collectives, _Single) and grads:
        weight = env.num_local_replicas(os.environ) / env.num_total_replicas(os.environ)

        def reduce(flat: torch.Tensor) -> None:
            flat.mul_(weight)
            collectives.all_reduce(flat, "sum")

        _apply_flat(grads, reduce)
    _progress.heartbeat()  # this step's collective is behind this instance: alive (poprun's --heartbeat-timeout)


def all_reduce_metrics(metrics: Mapping[str, float], *, op: ReduceOp = "mean") -> dict[str, float]:
    """Return ``metrics`` (names to numbers) reduced across the instances, in one collective, as floats."""
    names = sorted(metrics)
    values = torch.tensor([float(metrics[name]) for name in names], dtype=torch.float64)
    all_reduce(values, op=op)
    return dict(zip(names, values.tolist(), strict=True))


class DistributedSampler(Sampler[int]):
    """
    The indices of a map-style dataset that this instance's replicas read, step by step.

    Every instance draws the same permutation of ``range(len(dataset))`` (from ``seed`` and the
    epoch; ``shuffle=False`` keeps the order). Step ``s`` reads the global batch
    ``order[s * G:(s + 1) * G]`` with ``G = batch_size * getNumTotalReplicas()``; global replica
    ``r`` gets its ``r``-th slice of ``batch_size`` items, and this instance yields its replicas'
    slices, one *local batch* of ``batch_size * getNumLocalReplicas()`` indices per step.

    With ``drop_last=True`` (the default, as in ``poptorch.DataLoader``) the items after the last
    whole global batch are left out, so every instance takes the same number of steps. With
    ``drop_last=False`` the last, partial global batch is shared out as evenly as possible; an
    instance may then get fewer items than the others, or none, in that step.

    Each iteration is one epoch; the next iteration draws the next epoch's permutation
    (as ``poptorch.DataLoader`` reshuffles on every iteration). :meth:`set_epoch` sets it.
    """

    def __init__(
        self,
        dataset: Sized | int,
        *,
        batch_size: int,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = True,
        replica: int | None = None,
    ) -> None:
        """
        Share ``dataset`` out among the replicas of the launch.

        Args:
            dataset: the dataset (or its length).
            batch_size: items per replica and step (poptorch's micro-batch size).
            shuffle: draw a new permutation every epoch.
            seed: the permutation's seed, the same on every instance.
            drop_last: leave out the items after the last whole global batch.
            replica: a global replica index, to yield that replica's slices only;
                ``None`` for all of this instance's replicas.

        Raises:
            ValueError: for a batch size below 1 or a replica out of range.
        """
        super().__init__()
        self.size = dataset if isinstance(dataset, int) else len(dataset)
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, not {batch_size}")
        total = env.num_total_replicas(os.environ)
        if replica is not None and not 0 <= replica < total:
            raise ValueError(f"replica {replica} is out of range: there are {total} replicas")
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.drop_last = drop_last
        self.replica = replica
        self.epoch = 0
        self.global_batch_size = batch_size * total
        self.local_batch_size = batch_size * (1 if replica is not None else env.num_local_replicas(os.environ))

    def set_epoch(self, epoch: int) -> None:
        """Make the next iteration epoch ``epoch`` (its permutation)."""
        self.epoch = epoch

    @property
    def num_steps(self) -> int:
        """Return the steps of an epoch: the global batches, the partial one counted unless ``drop_last``."""
        whole, rest = divmod(self.size, self.global_batch_size)
        return whole + (1 if rest and not self.drop_last else 0)

    def __len__(self) -> int:
        """Return how many indices one epoch yields on this instance."""
        whole = self.size // self.global_batch_size
        rest = self.size - whole * self.global_batch_size
        last = len(self._part(rest)) if rest and not self.drop_last else 0
        return whole * self.local_batch_size + last

    def __iter__(self) -> Iterator[int]:
        """Yield this epoch's indices, local batch after local batch, and move on to the next epoch."""
        order = self._order(self.epoch)
        self.epoch += 1
        for step in range(self.num_steps):
            batch = order[step * self.global_batch_size:(step + 1) * self.global_batch_size]
            yield from (batch[i] for i in self._part(len(batch)))

    def _order(self, epoch: int) -> list[int]:
        """Return epoch ``epoch``'s order of the items: the same on every instance."""
        if not self.shuffle:
            return list(range(self.size))
        generator = torch.Generator()
        generator.manual_seed(self.seed + epoch)
        return cast("list[int]", torch.randperm(self.size, generator=generator).tolist())

    def _part(self, n: int) -> range:
        """Return the positions, in a global batch of ``n`` items, that this instance (or ``replica``) reads."""
        return popdist.shard_range(n, by="replica", index=self.replica, drop_last=False)


def data_loader(
    dataset: Dataset[T],
    *,
    batch_size: int,
    shuffle: bool = True,
    seed: int = 0,
    drop_last: bool = True,
    **kwargs: Any,
) -> DataLoader[T]:
    """
    Return a ``DataLoader`` whose batches are this instance's local batches, one per step.

    As ``poptorch.DataLoader`` under popdist: ``batch_size`` is per replica, and a batch holds
    ``batch_size * getNumLocalReplicas()`` items (see :class:`DistributedSampler`). ``kwargs``
    go to ``DataLoader`` (``num_workers``, ``collate_fn`` ...), except ``sampler`` and ``shuffle``.

    Taking each batch reports the batches done so far in this epoch to poprun
    (``popdist.progress(done, batches per epoch, epoch=E)``; the ETA is then the epoch's), and
    so does the end of the epoch, until the program calls ``popdist.progress`` itself (with the
    run's own steps and total): from then on the loader only beats ``popdist.heartbeat()``.
    """
    sampler = DistributedSampler(cast("Sized", dataset), batch_size=batch_size, shuffle=shuffle, seed=seed,
                                 drop_last=drop_last)
    return _ReportingLoader(dataset, batch_size=sampler.local_batch_size, sampler=sampler, drop_last=False, **kwargs)


class _ReportingLoader(DataLoader[T]):
    """A ``DataLoader`` over a :class:`DistributedSampler` that reports its batches as steps (see :func:`data_loader`)."""

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override] # a generator over torch's iterator
        """Yield the epoch's batches; before each, and at the end, report the batches done."""
        epoch = cast("DistributedSampler", self.sampler).epoch  # the epoch this iteration draws
        batches = len(self)
        done = 0
        for batch in super().__iter__():
            _progress.report(done, batches, epoch=epoch)
            yield batch
            done += 1
        _progress.report(done, batches, epoch=epoch)
