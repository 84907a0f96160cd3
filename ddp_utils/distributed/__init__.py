"""Distributed helpers: where this process stands in a job, and what it does with the others.

Every helper is a no-op, or returns the single-process answer, without a process group,
so the same code runs under ``python`` and under ``torchrun``/``srun``.

- ``env.py``: :class:`DistInfo` and :func:`dist_info` from torchrun's or SLURM's variables,
  :func:`first_slurm_host`, :func:`slurm_job_id`, and the launch identity :func:`launch_key`
  (stable across elastic restarts and SLURM requeues). The only module of ddp_utils that reads
  launcher variables, and only when asked.
- ``debug.py``: :func:`enable_debug` (:class:`DistDebug`): PyTorch's collective checks and NCCL's
  flight recorder, turned on before the group forms, so a hang or a mismatch names the rank;
  :func:`ddp_process_group`, the group DDP can use under it.
- ``group.py``: :func:`init_distributed` (the one place a process is bound to its device;
  the device decides the backend), :func:`cleanup`, :func:`barrier`, and the rank queries.
- ``collectives.py``: :func:`all_reduce` (in place), :func:`reduce_tensor`, :func:`reduce_dict`, :func:`any_rank`,
  :func:`broadcast_object`, :func:`all_gather_object`, each over any ``group``, the tensor ones
  with ``async_op`` (a :class:`Pending` read later); :func:`rank_zero_only`.
- ``zero_first.py``: :func:`torch_distributed_zero_first` and its job-wide variant, over the
  group's store with a heartbeat instead of barriers.
- ``watchdog.py``: :class:`StallWatchdog`: a rank that stops making progress is named within
  minutes (its verdict rules in ``stall.py``), every rank's stack printed, and the job ended with
  :data:`STALL_EXIT_CODE` for the launcher to restart it (how ranks part in ``parting.py``).
- ``store.py``: the group's store (:func:`default_store`), and :class:`BoundedStore`: a private
  connection to it whose calls a thread waits for with a deadline.
- ``errors.py``: :func:`exit_usage_error` (a user's mistake: one line per node, named in
  torchrun's failure report through its error file, exit code 2), :func:`record_error_for_launcher`.
- ``parallel.py``: :func:`is_parallel`, :func:`de_parallel`.
- ``sync_batchnorm.py``: :func:`convert_sync_batchnorm` / :func:`revert_sync_batchnorm` and
  :class:`GroupBatchNorm`: BatchNorm over the whole group's batch on any backend (``--sync-bn``).
"""

from __future__ import annotations

from .collectives import (
    Pending,
    all_gather_object,
    all_reduce,
    any_rank,
    broadcast_object,
    rank_zero_only,
    reduce_dict,
    reduce_tensor,
)
from .debug import DistDebug, ddp_process_group, debug_env, enable_debug
from .env import DistEnvError, DistInfo, dist_info, env_rank, first_slurm_host, launch_key, slurm_job_id
from .errors import USAGE_EXIT_CODE, exit_usage_error, record_error_for_launcher
from .group import (
    DEFAULT_TIMEOUT_S,
    barrier,
    cleanup,
    collective_device,
    default_backend,
    default_device,
    get_rank,
    get_world_size,
    init_distributed,
    is_dist_initialized,
    is_main_process,
)
from .parallel import de_parallel, is_parallel
from .stall import DEFAULT_STALL_TIMEOUT_S, STALL_EXIT_CODE, stall_timeout_from_env
from .store import BoundedStore, StoreLostError, default_store
from .sync_batchnorm import GroupBatchNorm, convert_sync_batchnorm, revert_sync_batchnorm
from .watchdog import StallWatchdog
from .zero_first import (
    HEARTBEAT_S,
    RankFailedError,
    torch_distributed_rank_zero_first,
    torch_distributed_zero_first,
)

__all__ = [
    "USAGE_EXIT_CODE",
    "exit_usage_error",
    "record_error_for_launcher",
    "DEFAULT_TIMEOUT_S",
    "DEFAULT_STALL_TIMEOUT_S",
    "STALL_EXIT_CODE",
    "BoundedStore",
    "StallWatchdog",
    "StoreLostError",
    "default_store",
    "stall_timeout_from_env",
    "HEARTBEAT_S",
    "DistDebug",
    "DistEnvError",
    "DistInfo",
    "GroupBatchNorm",
    "Pending",
    "RankFailedError",
    "all_gather_object",
    "all_reduce",
    "any_rank",
    "barrier",
    "broadcast_object",
    "cleanup",
    "collective_device",
    "convert_sync_batchnorm",
    "ddp_process_group",
    "de_parallel",
    "debug_env",
    "default_backend",
    "default_device",
    "dist_info",
    "enable_debug",
    "env_rank",
    "first_slurm_host",
    "get_rank",
    "get_world_size",
    "init_distributed",
    "is_dist_initialized",
    "is_main_process",
    "is_parallel",
    "launch_key",
    "rank_zero_only",
    "slurm_job_id",
    "reduce_dict",
    "reduce_tensor",
    "revert_sync_batchnorm",
    "torch_distributed_rank_zero_first",
    "torch_distributed_zero_first",
]
