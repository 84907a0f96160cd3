"""ddp_utils: distributed-training helpers for object-detection projects."""

from .data import check_dataset, create_dataloader, create_val_dataloader, load_hyp, make_shapes_dataset
from .detect import ComputeLoss, Model, evaluate, fitness, non_max_suppression, scale_boxes
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
from .profiling import FlopsReport, flops, format_table, model_info, profile
from .seed import init_seeds, init_torch_seeds, loader_generator, rank_seed, seed_worker, worker_seed

__version__ = "0.1.0"

__all__ = [
    "ComputeLoss",
    "DistEnvError",
    "DistInfo",
    "FlopsReport",
    "LOGGER",
    "Model",
    "RankFailedError",
    "__version__",
    "all_gather_object",
    "barrier",
    "broadcast_object",
    "check_dataset",
    "cleanup",
    "create_dataloader",
    "create_val_dataloader",
    "dist_info",
    "evaluate",
    "fitness",
    "flops",
    "format_table",
    "get_rank",
    "get_world_size",
    "init_distributed",
    "init_seeds",
    "init_torch_seeds",
    "is_dist_initialized",
    "is_main_process",
    "load_hyp",
    "loader_generator",
    "make_shapes_dataset",
    "model_info",
    "non_max_suppression",
    "profile",
    "rank_seed",
    "rank_zero_only",
    "reduce_dict",
    "reduce_tensor",
    "scale_boxes",
    "seed_worker",
    "select_device",
    "set_logging",
    "synchronize",
    "time_synchronized",
    "torch_distributed_rank_zero_first",
    "torch_distributed_zero_first",
    "worker_seed",
]
