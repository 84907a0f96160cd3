"""ddp_utils: distributed-training helpers for object-detection projects."""

from .device import select_device, synchronize, time_synchronized
from .dist import (
    DistEnvError,
    DistInfo,
    RankFailedError,
    all_gather_object,
    barrier,
    broadcast_object,
    cleanup,
    dist_info,
    get_rank,
    get_world_size,
    init_distributed,
    is_dist_initialized,
    is_main_process,
    rank_zero_only,
    reduce_dict,
    reduce_tensor,
    torch_distributed_rank_zero_first,
    torch_distributed_zero_first,
)
from .log import LOGGER, set_logging
from .profiling import FlopsReport, flops, format_table, model_info
from .seed import init_seeds, init_torch_seeds, loader_generator, rank_seed, seed_worker, worker_seed

__version__ = "0.1.0"

__all__ = [
    "LOGGER",
    "DistEnvError",
    "DistInfo",
    "FlopsReport",
    "RankFailedError",
    "__version__",
    "all_gather_object",
    "barrier",
    "broadcast_object",
    "cleanup",
    "dist_info",
    "flops",
    "format_table",
    "get_rank",
    "get_world_size",
    "init_distributed",
    "init_seeds",
    "init_torch_seeds",
    "is_dist_initialized",
    "is_main_process",
    "loader_generator",
    "model_info",
    "rank_seed",
    "rank_zero_only",
    "reduce_dict",
    "reduce_tensor",
    "seed_worker",
    "select_device",
    "set_logging",
    "synchronize",
    "time_synchronized",
    "torch_distributed_rank_zero_first",
    "torch_distributed_zero_first",
    "worker_seed",
]
