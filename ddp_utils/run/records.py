"""What a run keeps while it trains (:class:`Records`), opened together at its start: :func:`open_records`.

results.csv and the trackers (rank 0 writes), the early stopping (--patience, or an evolve trial's pruning),
the checkpoints behind :class:`~ddp_utils.run.saves.RunSaves`, the stall watchdog, and the
:class:`~ddp_utils.run.control.StepControl` that every rank consults after each step.
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from typing import Any

from ..distributed import DistInfo, StallWatchdog
from ..engine.amp import compute_words
from ..log import LOGGER
from .checkpoint import Checkpointer
from .control import StepControl
from .early_stop import EarlyStopping
from .interrupt import ctrl_c_owner
from .loggers import ResultsLogger
from .optional_files import OptionalFiles
from .options import control_settings
from .plots import plot_labels
from .saves import RunSaves
from .start import Run
from .trackers import Trackers
from .training import Training


@dataclasses.dataclass
class Records:
    """A run's records, and the order they open and close in.

    Use it as a context manager around the epochs: it enters the stall watchdog, the results logger and the
    step control, in that order, and leaves them in the reverse one: an error marks the trackers' runs FAILED,
    a rank that stalls ends every rank with its name, and the control's last all-reduce finishes while the
    process group is still there.

    Attributes:
        logger: results.csv and the trackers (:class:`~ddp_utils.run.loggers.ResultsLogger`).
        stopper: decides an early stop after each validated epoch (``--patience``, or an evolve trial's pruning).
        saves: the run's checkpoints (:class:`~ddp_utils.run.saves.RunSaves`).
        control: go on, save or stop after each step, the same on every rank
            (:class:`~ddp_utils.run.control.StepControl`).
        watchdog: the :class:`~ddp_utils.distributed.StallWatchdog` (``DDP_UTILS_STALL_TIMEOUT``).
        optional: the run's optional writes (plots, results.csv rows, TensorBoard events): one that fails (a full
            disk) is one warning, the first time, and the run goes on
            (:class:`~ddp_utils.run.optional_files.OptionalFiles`).
        ends_process: the process ends after this run (not an evolve trial, one of many): once its final save is on
            disk, its stop signals are the process's Ctrl-C owner's (the exit window, :mod:`~ddp_utils.run.interrupt`).
    """

    logger: ResultsLogger
    stopper: Any
    saves: RunSaves
    control: StepControl
    watchdog: StallWatchdog
    optional: OptionalFiles = dataclasses.field(default_factory=OptionalFiles)
    ends_process: bool = True
    _open: contextlib.ExitStack | None = dataclasses.field(default=None, init=False, repr=False)

    def __enter__(self) -> Records:
        with contextlib.ExitStack() as stack:  # one that fails to open closes those opened before it
            for part in (self.watchdog, self.logger, self.control):
                stack.enter_context(part)
            self._open = stack.pop_all()
        owner = ctrl_c_owner()
        if owner is not None:  # a Ctrl-C that stops the process at once says what these saves left, to its end
            owner.describe_writes(self.saves.at_once_words)
        return self

    def __exit__(self, *exc: Any) -> bool:
        return bool(self._open.__exit__(*exc))

    def finish_writes(self, fit: Training, stats: Any) -> None:
        """At the end of the epochs, still inside ``with records``: where training stopped (a signal, steps that
        stayed non-finite) saved to last.pt with the batch it stopped at (``stats``: the unfinished epoch's, or
        None), then every write of rank 0 waited for, so nothing is lost when the process ends. A final or stop
        save that did not land is ``saves.failed``, the same on every rank.

        A run that finished (its final save on disk, no stop) hands its stop signals to the process's Ctrl-C owner,
        which holds what comes until :func:`~ddp_utils.run.epochs.finish_training` opens the exit window: the
        ranks' watchdogs still wait here for every rank to be done."""
        if self.control.reason is not None:
            self.saves.stop(fit, stats)
            return
        self.saves.finish(fit)
        owner = ctrl_c_owner()
        if owner is not None and self.ends_process and self.saves.failed is None:
            preemption = self.control.preemption  # a signal it received during the final save: held for the window
            owner.finishing(self.saves.finished_words(), preemption.signals, heard=preemption.received)


def summary_line(run: Run, world_size: int, accumulate: int, images: int) -> str:
    """The run's one line of what it trains: the size, the processes, the batches, how it computes (as the
    compute line says it: ``fp32, channels_last``, not ``amp off``), the data and where it logs."""
    return (
        f"image size {run.imgsz}, {world_size} process(es) x {run.batch_size // world_size} images, accumulate "
        f"{accumulate}, {compute_words(run.amp, run.channels_last)}, {images} training images, {run.epochs} epochs, "
        f"logging to {run.save_dir}"
    )


def open_records(run: Run, fit: Training, info: DistInfo, stopper: Any = None) -> Records:
    """Open a run's records and say in one line what it trains.

    Args:
        run: the run (its options, hyperparameters, directory, and what it resumes).
        fit: what it trains (its state: a resumed run counts its patience from its best epoch).
        info: this process's place in the group: rank 0 logs, plots and writes.
        stopper: what decides an early stop after each validated epoch (an evolve trial's pruning);
            default: :class:`~ddp_utils.run.early_stop.EarlyStopping` with ``--patience``.

    Returns:
        the run's :class:`Records`, not yet entered.
    """
    params, optional = {"opt": run.options(), "hyp": run.hyp}, OptionalFiles()
    trackers = Trackers(run.opt.trackers if info.is_main else [], run.save_dir, Path(run.opt.project), params)
    logger = ResultsLogger(run.save_dir, fit.state.epoch, trackers=trackers, enabled=info.is_main, optional=optional)
    if run.resume is None and info.is_main and not run.opt.noplots:
        optional.write(run.save_dir / "labels.jpg", lambda: plot_labels(fit.labels, run.names, run.save_dir))
    stopper = stopper or EarlyStopping(patience=run.opt.patience)
    if fit.state.best_epoch >= 0:
        stopper.best_fitness, stopper.best_epoch = fit.state.best_fitness, fit.state.best_epoch
    checkpoints = Checkpointer(run.save_dir, run.options(), run.hyp, run.opt.save_period, background=True)
    watchdog = StallWatchdog()  # its timeout was checked with the options
    control = StepControl(**control_settings(run.opt, info.is_main), watchdog=watchdog, skipped=fit.state.skipped)
    LOGGER.info(summary_line(run, info.world_size, fit.step.accumulate, len(fit.train_loader.dataset)))
    in_study = getattr(stopper, "requeues_on_stop", False)  # an evolve trial: its study goes on after it
    saves = RunSaves(checkpoints, control, info, watchdog, says_resume=not in_study)
    return Records(logger, stopper, saves, control, watchdog, optional, ends_process=not in_study)


__all__ = ["Records", "open_records", "summary_line"]
