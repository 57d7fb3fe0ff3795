"""
popdist's two contracts: the environment the launcher writes, and what a popdist backend is.

Standalone: standard library only; never imports ``poprun``, nor any other popdist module,
so that every popdist module can import it without a circle.

- The environment contract between the launcher (which writes it) and applications (which
  read it): the variables' names, and the readers through which popdist reads them, each with
  the documented default of the PopDist API when its variable is unset. Every popdist module
  reads the environment through here; the launcher imports the names from
  :mod:`popdist.env`, which re-exports them (with :mod:`popdist.config`'s values, on use).
- The backend contract: the ``Backend`` protocol and the errors of :func:`popdist.init` and
  the barriers. The backends (:mod:`popdist._mpi`, :mod:`popdist._tcp` through
  :mod:`popdist._rendezvous`) import them from here, and :mod:`popdist._backend`, above them
  all, chooses which one ``init`` opens.

Imported by ``import popdist``, so it stays light (one module, not one per contract): no
``dataclasses``, no ``typing`` at run time.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Protocol

    class Backend(Protocol):
        """What ``init`` opens: barriers among groups of instances, and a collective close."""

        name: str

        def barrier(self, group: frozenset[int], timeout_s: float | None) -> None:
            """Return once every instance of ``group`` (which holds this one) has called it."""

        def close(self) -> None:
            """Wait for every instance to close, then release the connections."""


class BackendError(RuntimeError):
    """The instances could not meet: one left, could not be reached, or a barrier timed out."""


class PopdistWarning(RuntimeWarning):
    """popdist did less than asked, e.g. no synchronisation because ``popdist.init()`` was not called."""


# What popdist.env re-exports: the names and readers (a name added here is public there too).
__all__ = [
    "ALWAYS_FORWARDED",
    "AUTOREPORT_DIRECTORY",
    "DEFAULT_MASTER_ADDR",
    "DEFAULT_MASTER_PORT",
    "DEFAULT_ROLE_NAME",
    "DEVICES",
    "EXECUTABLE_CACHE_PATH",
    "INSTANCE_INDEX",
    "IPUOF_CONFIG_PATH",
    "IPUOF_LOG_LEVEL",
    "LOCAL_INSTANCE_INDEX",
    "MPI_RUNTIME_MARKERS",
    "NUM_INSTANCES",
    "NUM_IPUS_PER_REPLICA",
    "NUM_LOCAL_REPLICAS",
    "NUM_TOTAL_REPLICAS",
    "OMPI_LOCAL_RANK",
    "OMPI_LOCAL_SIZE",
    "OMPI_RANK",
    "OMPI_SIZE",
    "POPLAR_ENGINE_OPTIONS",
    "POPLAR_TARGET_OPTIONS",
    "PROGRESS",
    "PROGRESS_TOKEN",
    "PYTHON_FAULT_HANDLER",
    "REPLICA_INDEX_OFFSET",
    "RESTART_COUNT",
    "RUN_ID",
    "TORCHELASTIC_ERROR_FILE",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_SIGNALS_TO_HANDLE",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCH_GROUP_RANK",
    "TORCH_GROUP_WORLD_SIZE",
    "TORCH_LOCAL_RANK",
    "TORCH_LOCAL_WORLD_SIZE",
    "TORCH_MASTER_ADDR",
    "TORCH_MASTER_PORT",
    "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "TORCH_RANK",
    "TORCH_ROLE_NAME",
    "TORCH_ROLE_RANK",
    "TORCH_ROLE_WORLD_SIZE",
    "TORCH_WORLD_SIZE",
    "UNIFORM_REPLICAS_PER_INSTANCE",
    "VIPU_API_GCD_ID",
    "VIPU_API_HOST",
    "VIPU_API_PARTITION_ID",
    "VIPU_API_PORT",
    "VIPU_API_TIMEOUT",
    "devices",
    "instance_index",
    "integer",
    "is_set",
    "launched_by_mpi",
    "local_instance_index",
    "master_address",
    "num_instances",
    "num_ipus_per_replica",
    "num_local_replicas",
    "num_total_replicas",
    "replica_index_offset",
    "restart_count",
    "uniform_replicas_per_instance",
]

# Set by real poprun for every instance (names and formats as it wrote them).
NUM_TOTAL_REPLICAS = "POPDIST_NUM_TOTAL_REPLICAS"
NUM_IPUS_PER_REPLICA = "POPDIST_NUM_IPUS_PER_REPLICA"
NUM_LOCAL_REPLICAS = "POPDIST_NUM_LOCAL_REPLICAS"
UNIFORM_REPLICAS_PER_INSTANCE = "POPDIST_UNIFORM_REPLICAS_PER_INSTANCE"
REPLICA_INDEX_OFFSET = "POPDIST_REPLICA_INDEX_OFFSET"
LOCAL_INSTANCE_INDEX = "POPDIST_LOCAL_INSTANCE_INDEX"
EXECUTABLE_CACHE_PATH = "POPDIST_EXECUTABLE_CACHE_PATH"
AUTOREPORT_DIRECTORY = "POPDIST_AUTOREPORT_DIRECTORY"
VIPU_API_HOST = "IPUOF_VIPU_API_HOST"
VIPU_API_PORT = "IPUOF_VIPU_API_PORT"
VIPU_API_PARTITION_ID = "IPUOF_VIPU_API_PARTITION_ID"
VIPU_API_TIMEOUT = "IPUOF_VIPU_API_TIMEOUT"
VIPU_API_GCD_ID = "IPUOF_VIPU_API_GCD_ID"
IPUOF_LOG_LEVEL = "IPUOF_LOG_LEVEL"
IPUOF_CONFIG_PATH = "IPUOF_CONFIG_PATH"
POPLAR_TARGET_OPTIONS = "POPLAR_TARGET_OPTIONS"
POPLAR_ENGINE_OPTIONS = "POPLAR_ENGINE_OPTIONS"

# Real poprun left the instance index and count to MPI; PopTorch reads these.
OMPI_RANK = "OMPI_COMM_WORLD_RANK"
OMPI_SIZE = "OMPI_COMM_WORLD_SIZE"
OMPI_LOCAL_RANK = "OMPI_COMM_WORLD_LOCAL_RANK"
OMPI_LOCAL_SIZE = "OMPI_COMM_WORLD_LOCAL_SIZE"

# Beyond poprun: explicit instance variables, and torchrun's, so its programs run unchanged.
INSTANCE_INDEX = "POPDIST_INSTANCE_INDEX"
NUM_INSTANCES = "POPDIST_NUM_INSTANCES"
TORCH_RANK = "RANK"
TORCH_WORLD_SIZE = "WORLD_SIZE"
TORCH_LOCAL_RANK = "LOCAL_RANK"
TORCH_LOCAL_WORLD_SIZE = "LOCAL_WORLD_SIZE"
TORCH_MASTER_ADDR = "MASTER_ADDR"
TORCH_MASTER_PORT = "MASTER_PORT"
# The rest of torchrun's contract (its elastic agent's names; one role, "default"): the host's
# index among the hosts and their number, the rank and size within the role, and the role's name.
TORCH_GROUP_RANK = "GROUP_RANK"
TORCH_GROUP_WORLD_SIZE = "GROUP_WORLD_SIZE"
TORCH_ROLE_RANK = "ROLE_RANK"
TORCH_ROLE_WORLD_SIZE = "ROLE_WORLD_SIZE"
TORCH_ROLE_NAME = "ROLE_NAME"
DEFAULT_ROLE_NAME = "default"
TORCHELASTIC_MAX_RESTARTS = "TORCHELASTIC_MAX_RESTARTS"

# Set by the launcher for each attempt (values decided at apply time, never in a saved plan):
# how many restarts came before this attempt (0 for the first), as poprun and as torchrun name
# it, and the run's id in torchrun's name.
RESTART_COUNT = "POPRUN_RESTART_COUNT"
# Where an instance sends its progress datagrams (HOST:PORT, [ADDR]:PORT, or :PORT when the launcher
# could not know its own address as the instance's host reaches it) and the run's token that each
# datagram carries: set for each attempt only when the launcher listens (docs/progress.md).
PROGRESS = "POPRUN_PROGRESS"
PROGRESS_TOKEN = "POPRUN_PROGRESS_TOKEN"  # noqa: S105 - the name of the variable, not its value
TORCHELASTIC_RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"
TORCHELASTIC_RUN_ID = "TORCHELASTIC_RUN_ID"
# The run's id as poprun names it (with a run record or a time limit: how poprun finds its instances' processes).
RUN_ID = "POPRUN_RUN_ID"
# Where torch's ``@record`` writes an instance's uncaught exception: a file of the instance's own for
# each attempt, in a directory the launcher made (on this machine), which its failure report reads.
TORCHELASTIC_ERROR_FILE = "TORCHELASTIC_ERROR_FILE"
# torchrun's default for NCCL's watchdog: a collective that fails or hangs ends the process (unless the user set it).
TORCH_NCCL_ASYNC_ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
# torchrun's signals that torch's own process launcher (elastic multiprocessing) passes on to its children.
TORCHELASTIC_SIGNALS_TO_HANDLE = "TORCHELASTIC_SIGNALS_TO_HANDLE"
# Whether a torchrun agent holds the store at MASTER_PORT: never under a launcher without one (instance 0 holds it).
TORCHELASTIC_USE_AGENT_STORE = "TORCHELASTIC_USE_AGENT_STORE"

# The instance's accelerators (poprun --devices-per-instance), as the program numbers them: "0,1" (the
# devices CUDA_VISIBLE_DEVICES / ROCR_VISIBLE_DEVICES leave it, from 0), or their indices among every
# device of the host under --device-visibility all ("2,3"). Unset: no devices were assigned.
DEVICES = "POPDIST_DEVICES"

# Set to 1 under a time limit (unless the user set it), so that a hung Python instance can say where it was.
PYTHON_FAULT_HANDLER = "PYTHONFAULTHANDLER"

# Variables that real poprun always forwarded from the launching shell.
ALWAYS_FORWARDED = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH")

# Set by a real MPI launcher (OpenMPI's PMIx, MPICH's PMI), never by poprun's own backends, which
# set the OMPI_COMM_WORLD_* variables for compatibility without starting an MPI runtime.
MPI_RUNTIME_MARKERS = ("PMIX_RANK", "PMI_RANK", "OMPI_COMM_WORLD_NODE_RANK")

# The defaults when nothing is set: torchrun's, for a launch on one machine.
DEFAULT_MASTER_ADDR = "localhost"
DEFAULT_MASTER_PORT = 29500


def devices(env: Mapping[str, str]) -> tuple[int, ...]:
    """Return the instance's devices of ``POPDIST_DEVICES`` (``"0,1"``), in order; () when unset or not a list of distinct indices."""
    raw = env.get(DEVICES, "").strip()
    words = [w.strip() for w in raw.split(",")] if raw else []
    # ASCII digits only: str.isdigit() also says yes to '\u00b2' (int() refuses it) and '\u0663' (int() reads 3)
    if not words or len(words) > 4096 or not all(w.isascii() and w.isdigit() and len(w) <= 6 for w in words):  # noqa: PLR2004
        return ()
    if len(set(words)) != len(words):  # poprun names each device once
        return ()
    return tuple(int(w) for w in words)


def integer(env: Mapping[str, str], name: str, default: int) -> int:
    """Return variable ``name`` as an integer, or ``default`` when it is unset or not a number."""
    raw = env.get(name, "").strip()
    try:
        return int(raw)
    except ValueError:
        return default


def is_set(env: Mapping[str, str]) -> bool:
    """Return whether the process was launched by poprun (its total replica count is set)."""
    return NUM_TOTAL_REPLICAS in env


def num_total_replicas(env: Mapping[str, str]) -> int:
    """Return the total number of replicas (1 when unset)."""
    return max(integer(env, NUM_TOTAL_REPLICAS, 1), 1)


def num_local_replicas(env: Mapping[str, str]) -> int:
    """Return the number of replicas this instance controls (1 when unset)."""
    return max(integer(env, NUM_LOCAL_REPLICAS, 1), 1)


def num_ipus_per_replica(env: Mapping[str, str]) -> int:
    """Return the number of IPUs per replica (1 when unset)."""
    return max(integer(env, NUM_IPUS_PER_REPLICA, 1), 1)


def replica_index_offset(env: Mapping[str, str]) -> int:
    """Return the global index of this instance's first replica (0 when unset)."""
    return max(integer(env, REPLICA_INDEX_OFFSET, 0), 0)


def local_instance_index(env: Mapping[str, str]) -> int:
    """Return this instance's index among the instances of its host (0 when unset)."""
    return max(integer(env, LOCAL_INSTANCE_INDEX, 0), 0)


def instance_index(env: Mapping[str, str]) -> int:
    """
    Return this instance's index (0 when unset).

    ``POPDIST_INSTANCE_INDEX`` first, then MPI's rank (real poprun left the index to MPI),
    then the replica arithmetic third-party readers used: offset // local replicas.
    """
    derived = replica_index_offset(env) // num_local_replicas(env)
    return integer(env, INSTANCE_INDEX, integer(env, OMPI_RANK, derived))


def num_instances(env: Mapping[str, str]) -> int:
    """Return the number of instances (1 when unset), found as :func:`instance_index` is."""
    derived = max(num_total_replicas(env) // num_local_replicas(env), 1)
    return max(integer(env, NUM_INSTANCES, integer(env, OMPI_SIZE, derived)), 1)


def uniform_replicas_per_instance(env: Mapping[str, str]) -> bool:
    """Return whether every instance controls the same number of replicas (True when unset)."""
    return env.get(UNIFORM_REPLICAS_PER_INSTANCE, "1").strip() != "0"


def master_address(env: Mapping[str, str]) -> tuple[str, int]:
    """Return ``(MASTER_ADDR, MASTER_PORT)``: where instance 0 can be reached (torchrun's defaults)."""
    host = env.get(TORCH_MASTER_ADDR, "").strip() or DEFAULT_MASTER_ADDR
    return host, integer(env, TORCH_MASTER_PORT, DEFAULT_MASTER_PORT)


def restart_count(env: Mapping[str, str]) -> int:
    """Return how many restarts came before this attempt: POPRUN_RESTART_COUNT, then torchrun's (0 when unset)."""
    return max(integer(env, RESTART_COUNT, integer(env, TORCHELASTIC_RESTART_COUNT, 0)), 0)


def launched_by_mpi(env: Mapping[str, str]) -> bool:
    """Return whether a real MPI launcher (mpirun, mpiexec) started this process."""
    return any(name in env for name in MPI_RUNTIME_MARKERS)
