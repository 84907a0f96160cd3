"""The run: everything around the step that makes one training run, from its options to its last words.

:mod:`ddp_utils.engine` computes a step; this room decides what the steps are for and keeps what they did.
It imports the step, never the other way round; :mod:`ddp_utils.evolve` (many runs) stands on it.

What lives where, in the order a run meets it:

- ``options.py``: train.py's options; a user's mistake as one line. ``option_checks.py``: their values' checks (a
  bad one is an :class:`OptionError`, a ``ValueError`` naming the option), the defaults a data yaml may replace.
- ``start.py``: the settled options (:class:`Run`), the run directory (``make_run_dir``; its numbered name,
  ``increment_path``, is ``run_dir.py``'s), ``hyp.yaml`` and ``opt.yaml``.
- ``resume.py``: continuing a run: ``find_resume`` (find and check, before any write), ``restore_training``,
  ``latest_checkpoint``; ``train_state.py``: :class:`TrainState` (where a run stands, to the batch).
- ``checkpoint/``: the checkpoint file: its format, atomic (and background) writes, pickle-free reads of ours
  or YOLOv5's (``load_pretrained``), ``strip_optimizer``, and :class:`Checkpointer` (last/best/epochN, periodic).
- ``training.py``: :class:`Training`, what the epochs work with, and ``build_training``, which puts the step
  together in the one order that works (each rule a named function that says why).
- ``records.py``: :class:`Records`, what a run keeps while it trains, opened together (``open_records``):
  ``loggers.py`` (results.csv, TensorBoard), ``trackers.py`` (MLflow, Weights & Biases),
  ``early_stop.py`` (:class:`EarlyStopping`, :func:`is_new_best`), ``saves.py`` (``RunSaves``: the epoch's,
  the periodic and the stop's saves), ``control.py`` (:class:`StepControl`: per step go on / save / stop, the
  same on every rank, from ``signals.py``'s :class:`PreemptionHandler`, the save clock and the non-finite
  counts), and the stall watchdog; ``interrupt.py``: Ctrl-C, owned by train.py to the process's end.
- ``epochs.py``: an epoch's end (step the schedule, judge, record, report, save, in that order) and the
  run's (``finish_training``).
- ``report.py``: the epoch line and its parser, the first batches' plots, the finished run's last words;
  ``plots.py``: labels, batches, results.

Writers act on the main process only and return at once elsewhere, so every call can run on every rank,
except ``increment_path`` (rank 0, then broadcast the directory: ``start.make_run_dir``). ``train.py`` shows
them composed into a run.
"""

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
from .control import StepControl
from .early_stop import EarlyStopping, is_new_best
from .epochs import end_epoch, finish_training
from .loggers import RESULTS_COLUMNS, ResultsLogger, results_values, tensorboard_writer, yaml_save
from .options import OptionError
from .plots import class_color, plot_images, plot_labels, plot_results
from .records import Records, open_records
from .resume import ResumeError, find_resume, latest_checkpoint, restore_training
from .run_dir import increment_path
from .signals import PreemptionHandler
from .start import Run, make_run_dir, record_run, start_run
from .train_state import TrainState
from .training import Training, build_training

__all__ = [
    "CHECKPOINT_KEYS",
    "BackgroundWriter",
    "Checkpointer",
    "CheckpointError",
    "CheckpointWriteError",
    "DamagedCheckpointError",
    "UnsafeCheckpointError",
    "atomic_torch_save",
    "atomic_write_bytes",
    "build_checkpoint",
    "check_integrity",
    "check_plain",
    "load_checkpoint",
    "load_pretrained",
    "save_checkpoint",
    "strip_optimizer",
    "to_plain",
    "StepControl",
    "EarlyStopping",
    "is_new_best",
    "end_epoch",
    "finish_training",
    "RESULTS_COLUMNS",
    "ResultsLogger",
    "increment_path",
    "results_values",
    "tensorboard_writer",
    "yaml_save",
    "OptionError",
    "class_color",
    "plot_images",
    "plot_labels",
    "plot_results",
    "Records",
    "open_records",
    "ResumeError",
    "find_resume",
    "latest_checkpoint",
    "restore_training",
    "PreemptionHandler",
    "Run",
    "make_run_dir",
    "record_run",
    "start_run",
    "TrainState",
    "Training",
    "build_training",
]
