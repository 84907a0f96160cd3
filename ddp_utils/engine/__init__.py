"""What a training loop needs beyond the data and the model.

EMA weights, atomic checkpoints, early stopping, the optimizer with its schedule and
warm-up, the run directory and its results (csv, plots, TensorBoard), and a SIGTERM flag
so a preempted run saves and stops cleanly. Writers act on the main process only.
"""

from .checkpoint import (
    CHECKPOINT_KEYS,
    CheckpointError,
    CheckpointWriteError,
    UnsafeCheckpointError,
    atomic_torch_save,
    build_checkpoint,
    check_plain,
    load_checkpoint,
    restore_training,
    save_checkpoint,
    strip_optimizer,
    to_plain,
)
from .early_stop import EarlyStopping, should_stop_everywhere
from .ema import ModelEMA
from .loggers import RESULTS_COLUMNS, ResultsLogger, increment_path, results_values, tensorboard_writer, yaml_save
from .modules import de_parallel, is_parallel
from .optim import (
    NBS,
    OPTIMIZERS,
    Warmup,
    accumulate_steps,
    cosine_lr,
    linear_lr,
    lr_lambda,
    one_cycle,
    param_groups,
    scaled_weight_decay,
    smart_optimizer,
)
from .plots import class_color, plot_images, plot_labels, plot_results
from .signals import PreemptionHandler

__all__ = [
    "CHECKPOINT_KEYS",
    "NBS",
    "OPTIMIZERS",
    "RESULTS_COLUMNS",
    "CheckpointError",
    "CheckpointWriteError",
    "EarlyStopping",
    "ModelEMA",
    "PreemptionHandler",
    "ResultsLogger",
    "UnsafeCheckpointError",
    "Warmup",
    "accumulate_steps",
    "atomic_torch_save",
    "build_checkpoint",
    "check_plain",
    "class_color",
    "cosine_lr",
    "de_parallel",
    "increment_path",
    "is_parallel",
    "linear_lr",
    "load_checkpoint",
    "lr_lambda",
    "one_cycle",
    "param_groups",
    "plot_images",
    "plot_labels",
    "plot_results",
    "restore_training",
    "results_values",
    "save_checkpoint",
    "scaled_weight_decay",
    "should_stop_everywhere",
    "smart_optimizer",
    "strip_optimizer",
    "tensorboard_writer",
    "to_plain",
    "yaml_save",
]
