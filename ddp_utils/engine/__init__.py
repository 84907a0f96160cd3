"""What a training loop needs beyond the data and the model.

What lives where:

- ``loop.py``: :func:`train_one_epoch` and :class:`TrainStep` (accumulation without needless
  all-reduces, AMP, timing without host waits).
- ``ema.py``: :class:`ModelEMA`, updated with multi-tensor kernels.
- ``checkpoint/``: the checkpoint file: its format, atomic (and background) writes, pickle-free
  reads of ours or YOLOv5's (``load_pretrained``), ``strip_optimizer``, and :class:`Checkpointer`
  (a run's last/best/epochN, periodic saves).
- ``resume.py``: continuing a run: :class:`TrainState` (where it stands, to the batch),
  ``find_resume`` (find and check, before any write), ``restore_training``, ``latest_checkpoint``.
- ``optim.py``: the optimizer's parameter groups, LR schedules (``one_cycle``), warm-up, accumulation.
  ``optim_setup.py``: :func:`optimizer_from_hyp`, all of them built from a hyperparameter yaml.
- ``options.py``: train.py's options and their checks (a bad one is an :class:`OptionError`, a ``ValueError``
  naming the option), user mistakes as one line; ``run.py``: one training run: the settled options
  (:class:`Run`), the run directory, what its epochs work with (:class:`~ddp_utils.engine.run.Training`);
  ``run_report.py``: the epoch line and its parser, the first batches' plots, the finished run's last words.
  ``run_saves.py``: a run's saves (:class:`RunSaves`); ``run_records.py``: ``open_records``, what a run keeps
  while it trains (results.csv, trackers, early stopping, checkpoints, the stall watchdog, its StepControl).
- ``control.py``: :class:`StepControl`, per step go on / save / stop, the same on every rank (signals, the save
  clock, non-finite steps); ``guard.py``: :class:`NonFiniteGuard` (a non-finite step skipped on the device).
- ``early_stop.py``: :class:`EarlyStopping`, :func:`is_new_best` (never a diverging epoch's state);
  ``signals.py``: :class:`PreemptionHandler` (SIGTERM -> a flag).
- ``loggers.py``: the run directory, results.csv, TensorBoard; ``plots.py``: labels, batches, results.
- ``autobatch.py``: the largest batch that fits a share of the GPU (``--batch-size -1``).
- ``amp.py``: :func:`train_mode`, how a run computes (fp16/bf16/fp32 autocast, channels_last), the CPU's by its
  flags; ``memory_format.py``: channels_last where it pays; ``cudnn.py``: cuDNN's heuristics or autotuning
  (``--cudnn-benchmark``), and a warm-up that tunes the training shape while the workers start.
- ``wrap.py``: ``wrap_model`` (SyncBatchNorm, DDP, then compile).

Writers act on the main process only and return at once elsewhere, so every call can run on
every rank, except ``increment_path`` (rank 0, then broadcast the directory). ``train.py`` shows
them composed into a run.
"""

from ..distributed.parallel import de_parallel, is_parallel
from .amp import AMP_DTYPES, TrainMode, resolve_amp, train_mode
from .autobatch import autobatch, check_train_batch_size, fit_batch_size
from .checkpoint import (
    CHECKPOINT_KEYS,
    BackgroundWriter,
    Checkpointer,
    CheckpointError,
    CheckpointWriteError,
    DamagedCheckpointError,
    UnsafeCheckpointError,
    atomic_torch_save,
    atomic_write_bytes,
    build_checkpoint,
    check_integrity,
    check_plain,
    load_checkpoint,
    load_pretrained,
    save_checkpoint,
    strip_optimizer,
    to_plain,
)
from .control import Action, StepControl
from .cudnn import CUDNN_MODES, set_cudnn_tuning, warm_up_convolutions
from .early_stop import EarlyStopping, is_new_best
from .ema import ModelEMA
from .guard import NonFiniteGuard, TrainingDiverged
from .loggers import RESULTS_COLUMNS, ResultsLogger, increment_path, results_values, tensorboard_writer, yaml_save
from .loop import EpochStats, TrainStep, train_one_epoch
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
from .options import OptionError
from .plots import class_color, plot_images, plot_labels, plot_results
from .resume import ResumeError, latest_checkpoint, restore_training
from .signals import PreemptionHandler
from .train_state import TrainState
from .wrap import wrap_model

__all__ = [
    "CUDNN_MODES",
    "set_cudnn_tuning",
    "warm_up_convolutions",
    "AMP_DTYPES",
    "Action",
    "NonFiniteGuard",
    "StepControl",
    "TrainingDiverged",
    "EpochStats",
    "TrainMode",
    "TrainStep",
    "autobatch",
    "check_train_batch_size",
    "fit_batch_size",
    "resolve_amp",
    "to_channels_last",
    "train_mode",
    "train_one_epoch",
    "use_channels_last",
    "wrap_model",
    "CHECKPOINT_KEYS",
    "BackgroundWriter",
    "NBS",
    "OPTIMIZERS",
    "RESULTS_COLUMNS",
    "CheckpointError",
    "Checkpointer",
    "CheckpointWriteError",
    "DamagedCheckpointError",
    "EarlyStopping",
    "is_new_best",
    "ModelEMA",
    "OptionError",
    "PreemptionHandler",
    "ResultsLogger",
    "ResumeError",
    "TrainState",
    "UnsafeCheckpointError",
    "Warmup",
    "accumulate_steps",
    "atomic_torch_save",
    "atomic_write_bytes",
    "build_checkpoint",
    "check_integrity",
    "check_plain",
    "class_color",
    "cosine_lr",
    "de_parallel",
    "increment_path",
    "is_parallel",
    "latest_checkpoint",
    "linear_lr",
    "load_checkpoint",
    "load_pretrained",
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
    "smart_optimizer",
    "strip_optimizer",
    "tensorboard_writer",
    "to_plain",
    "yaml_save",
]
