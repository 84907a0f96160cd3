"""What a run keeps while it trains, opened together at its start: :func:`open_records`.

results.csv and the trackers (rank 0 writes), the early stopping (--patience, or an evolve trial's pruning),
the checkpoints behind :class:`~ddp_utils.engine.run_saves.RunSaves`, the stall watchdog, and the
:class:`~ddp_utils.engine.control.StepControl` that every rank consults after each step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..distributed import DistInfo, StallWatchdog
from ..log import LOGGER
from . import options
from .amp import compute_words
from .checkpoint import Checkpointer
from .control import StepControl
from .early_stop import EarlyStopping
from .loggers import ResultsLogger
from .plots import plot_labels
from .run import Run, Training
from .run_saves import RunSaves
from .trackers import Trackers


def summary_line(run: Run, world_size: int, accumulate: int, images: int) -> str:
    """The run's one line of what it trains: the size, the processes, the batches, how it computes (as the
    compute line says it: ``fp32, channels_last``, not ``amp off``), the data and where it logs."""
    return (
        f"image size {run.imgsz}, {world_size} process(es) x {run.batch_size // world_size} images, accumulate "
        f"{accumulate}, {compute_words(run.amp, run.channels_last)}, {images} training images, {run.epochs} epochs, "
        f"logging to {run.save_dir}"
    )


def open_records(run: Run, fit: Training, info: DistInfo, stopper: Any = None) -> tuple:
    """Open a run's records and say in one line what it trains.

    Args:
        run: the run (its options, hyperparameters, directory, and what it resumes).
        fit: what it trains (its state: a resumed run counts its patience from its best epoch).
        info: this process's place in the group: rank 0 logs, plots and writes.
        stopper: what decides an early stop after each validated epoch (an evolve trial's pruning);
            default: :class:`~ddp_utils.engine.early_stop.EarlyStopping` with ``--patience``.

    Returns:
        ``(logger, stopper, saves, control, watchdog)``: a
        :class:`~ddp_utils.engine.loggers.ResultsLogger`, the stopper, a
        :class:`~ddp_utils.engine.run_saves.RunSaves`, a :class:`~ddp_utils.engine.control.StepControl`
        and a :class:`~ddp_utils.distributed.StallWatchdog` (``DDP_UTILS_STALL_TIMEOUT``).
    """
    params = {"opt": run.options(), "hyp": run.hyp}
    trackers = Trackers(run.opt.trackers if info.is_main else [], run.save_dir, Path(run.opt.project), params)
    logger = ResultsLogger(run.save_dir, fit.state.epoch, trackers=trackers, enabled=info.is_main)
    if run.resume is None and info.is_main and not run.opt.noplots:
        plot_labels(fit.labels, run.names, run.save_dir)
    stopper = stopper or EarlyStopping(patience=run.opt.patience)
    if fit.state.best_epoch >= 0:
        stopper.best_fitness, stopper.best_epoch = fit.state.best_fitness, fit.state.best_epoch
    checkpoints = Checkpointer(run.save_dir, run.options(), run.hyp, run.opt.save_period, background=True)
    watchdog = StallWatchdog()  # its timeout was checked with the options
    control = StepControl(
        **options.control_settings(run.opt, info.is_main), watchdog=watchdog, skipped=fit.state.skipped
    )
    LOGGER.info(summary_line(run, info.world_size, fit.step.accumulate, len(fit.train_loader.dataset)))
    saves = RunSaves(checkpoints, control, info, watchdog, says_resume=not getattr(stopper, "requeues_on_stop", False))
    return logger, stopper, saves, control, watchdog
