"""A run's saves and what they say: every rank calls :class:`RunSaves`' methods, rank 0 writes, in the background.

- :meth:`RunSaves.save`: ``last.pt`` (``best.pt``, ``epochN.pt`` when due) of where training stands; at a batch of
  the epoch when given the epoch's stats so far (the ranks' running losses are gathered: a collective);
- :meth:`RunSaves.periodic`: the mid-epoch save the run's :class:`~ddp_utils.engine.control.StepControl`
  agreed on, and its log line;
- :meth:`RunSaves.stop`: the stop's save, waited for until it is on disk, then one line saying where training
  stopped, how long the write took and how to continue; steps that stayed non-finite raise
  :class:`~ddp_utils.engine.guard.TrainingDiverged` instead; a requeue signal requeues the SLURM job.
"""

from __future__ import annotations

import contextlib
from typing import Any

from ..distributed import DistInfo
from ..log import LOGGER
from .checkpoint import Checkpointer
from .control import StepControl
from .guard import TrainingDiverged
from .run import Training
from .signals import requeue_job
from .train_state import TrainState

SAVE_PHASE_S = 600.0  # how long rank 0 may take over a save (a slow or remote disk) before it counts as stalled


class RunSaves:
    """Save a run where it stands, at an epoch's end, in the middle of one, or when it stops.

    Args:
        checkpoints: the run's :class:`~ddp_utils.engine.checkpoint.Checkpointer` (used on rank 0 only).
        control: the run's control; every save restarts its clock.
        info: this process in the job.
        watchdog: the run's :class:`~ddp_utils.distributed.StallWatchdog`: rank 0's saves are a phase of their own
            (:data:`SAVE_PHASE_S`), while the other ranks wait for it; or None.
    """

    def __init__(self, checkpoints: Checkpointer, control: StepControl, info: DistInfo, watchdog: Any = None) -> None:
        self.checkpoints, self.control, self.info, self.watchdog = checkpoints, control, info, watchdog

    def _saving(self) -> contextlib.AbstractContextManager:
        return self.watchdog.phase("save", SAVE_PHASE_S) if self.watchdog is not None else contextlib.nullcontext()

    def save(self, fit: Training, stats: Any = None, best: bool = False) -> TrainState:
        """Every rank: last.pt of ``fit``'s state, at ``stats``' batch when given; returns the state saved."""
        state = fit.state_at(stats, self.info.world_size, self.control.skipped)
        if self.info.is_main:
            with self._saving():  # the snapshot (and the write, unless in the background)
                self.checkpoints.save(state, fit.step, best=best)
        self.control.saved()
        return state

    def periodic(self, fit: Training, stats: Any) -> None:
        """Every rank: the mid-epoch save agreed on (written in the background while training goes on)."""
        state = self.save(fit, stats)
        held = self.checkpoints.blocked_seconds
        LOGGER.info(f"saved {self.checkpoints.last} at {state.where()} (training waited {held:.2f} s)")

    def wait(self) -> bool:
        """Every rank, at the end: wait until rank 0's writes are on disk, bounded as a save (the other ranks wait
        for rank 0 at the end of the watched work); False when the last write failed."""
        with self._saving():
            return self.checkpoints.wait()

    def stop(self, fit: Training, stats: Any = None) -> None:
        """Every rank, when the control stopped the run: save where it stands (at ``stats``' batch when the epoch
        was not validated), wait until the file is on disk, and say so.

        Raises:
            TrainingDiverged: the run stopped because its steps stayed non-finite (last.pt: the last finite state).
        """
        state = self.save(fit, stats) if stats is not None else fit.state
        with self._saving():
            written, last = self.checkpoints.wait(), self.checkpoints.last
        took = self.checkpoints.write_seconds
        saved = f"saved {last} in {took:.1f} s" if written else f"could not save {last} (the warning above says why)"
        control = self.control
        if control.reason == "diverged":
            raise TrainingDiverged(
                f"training diverged at {state.where()}: {control.in_a_row} optimizer steps in a row had non-finite "
                f"gradients ({control.skipped} skipped in all); {saved}, the last finite state; lower the learning "
                "rate (hyp lr0) or look for bad labels"
            )
        if self.info.is_main:
            LOGGER.warning(f"stopped at {state.where()}: {saved}; continue with: python train.py --resume {last}")
        if control.requeue_anywhere():  # after rank 0 saved: the requeued job resumes from it
            requeue_job()


__all__ = ["RunSaves"]
