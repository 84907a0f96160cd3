"""The step: what one optimizer step, and one epoch of steps, compute.

Nothing here knows about files, signals or options: the run that drives the step (its options, checkpoints,
resume, saves, logs, stop and save decisions) is :mod:`ddp_utils.run`, one floor up.

What lives where:

- ``loop.py``: :class:`TrainStep` (accumulation without needless all-reduces, AMP, the non-finite guard) and
  :func:`train_one_epoch` (timing without host waits; after each step it asks the run's control for an
  :class:`Action`: go on, save, stop).
- ``guard.py``: :class:`NonFiniteGuard` (a non-finite step skipped on the device), :class:`TrainingDiverged`.
- ``amp.py``: :func:`train_mode`, how a run computes (fp16/bf16/fp32 autocast, channels_last), the CPU's by its
  flags; ``memory_format.py``: channels_last where it pays; ``cudnn.py``: cuDNN's heuristics or autotuning
  (``--cudnn-benchmark``), and a warm-up that tunes the training shape while the workers start.
- ``ema.py``: :class:`ModelEMA`, updated with multi-tensor kernels.
- ``optim.py``: the optimizer's parameter groups, LR schedules (``one_cycle``), warm-up, accumulation;
  ``optim_setup.py``: :func:`optimizer_from_hyp`, all of them built from a hyperparameter dict.
- ``wrap.py``: :func:`wrap_model` (SyncBatchNorm, DDP, then compile).
- ``autobatch.py``: the largest batch that fits a share of the GPU (``--batch-size -1``).

``train.py`` shows the step composed into a run.
"""

from ..distributed.parallel import de_parallel, is_parallel
from .amp import AMP_DTYPES, TrainMode, resolve_amp, train_mode
from .autobatch import autobatch, check_train_batch_size, fit_batch_size
from .cudnn import CUDNN_MODES, set_cudnn_tuning, warm_up_convolutions
from .ema import ModelEMA
from .guard import NonFiniteGuard, TrainingDiverged
from .loop import Action, EpochStats, TrainStep, train_one_epoch
from .memory_format import to_channels_last, use_channels_last
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
from .optim_setup import OptimizerSetup, optimizer_from_hyp
from .wrap import wrap_model

__all__ = [
    "de_parallel",
    "is_parallel",
    "AMP_DTYPES",
    "TrainMode",
    "resolve_amp",
    "train_mode",
    "autobatch",
    "check_train_batch_size",
    "fit_batch_size",
    "CUDNN_MODES",
    "set_cudnn_tuning",
    "warm_up_convolutions",
    "ModelEMA",
    "NonFiniteGuard",
    "TrainingDiverged",
    "Action",
    "EpochStats",
    "TrainStep",
    "train_one_epoch",
    "to_channels_last",
    "use_channels_last",
    "OptimizerSetup",
    "optimizer_from_hyp",
    "NBS",
    "OPTIMIZERS",
    "Warmup",
    "accumulate_steps",
    "cosine_lr",
    "linear_lr",
    "lr_lambda",
    "one_cycle",
    "param_groups",
    "scaled_weight_decay",
    "smart_optimizer",
    "wrap_model",
]
