"""ddp_utils: distributed-training helpers for object-detection projects.

The names a detection project calls, YOLOv5's among them, from every room: ``ddp_utils.engine`` (the step),
``ddp_utils.run`` (the run around it), ``ddp_utils.data``, ``ddp_utils.yolo`` and the rest hold them all.
"""

from .data import check_dataset, create_dataloader, create_val_dataloader, load_hyp, make_shapes_dataset
from .device import DeviceError, select_device, synchronize, time_sync, time_synchronized
from .distributed import (
    DistEnvError,
    DistInfo,
    RankFailedError,
    all_gather_object,
    any_rank,
    barrier,
    broadcast_object,
    cleanup,
    de_parallel,
    dist_info,
    get_rank,
    get_world_size,
    init_distributed,
    is_dist_initialized,
    is_main_process,
    launch_key,
    rank_zero_only,
    reduce_dict,
    reduce_tensor,
    torch_distributed_rank_zero_first,
    torch_distributed_zero_first,
)
from .engine import ModelEMA, is_parallel, one_cycle, smart_optimizer
from .log import LOGGER, set_logging
from .profiling import FlopsReport, flops, format_table, model_info, profile
from .run import EarlyStopping, increment_path, strip_optimizer, yaml_save
from .seed import init_seeds, init_torch_seeds, loader_generator, rank_seed, seed_worker, set_cudnn_mode, worker_seed
from .yolo import ComputeLoss, Model, evaluate, fitness, non_max_suppression, scale_boxes

__version__ = "0.1.0"  # the one place the version is written: pyproject.toml reads it; CHANGELOG.md

__all__ = [
    "EarlyStopping",
    "ModelEMA",
    "increment_path",
    "is_parallel",
    "one_cycle",
    "smart_optimizer",
    "strip_optimizer",
    "yaml_save",
    "launch_key",
    "de_parallel",
    "any_rank",
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
    "set_cudnn_mode",
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
    "DeviceError",
    "set_logging",
    "synchronize",
    "time_sync",
    "time_synchronized",
    "torch_distributed_rank_zero_first",
    "torch_distributed_zero_first",
    "worker_seed",
]
