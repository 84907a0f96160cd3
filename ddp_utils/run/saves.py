"""A run's saves and what they say: every rank calls :class:`RunSaves`' methods, rank 0 writes, in the background.

- :meth:`RunSaves.save`: ``last.pt`` (``best.pt``, ``epochN.pt`` when due) of where training stands; at a batch of
  the epoch when given the epoch's stats so far (the ranks' running losses are gathered: a collective);
- :meth:`RunSaves.periodic`: the mid-epoch save the run's :class:`~ddp_utils.run.control.StepControl`
  agreed on; its line ("saved ... at epoch E, batch B/N") comes from the writer once the file is whole on disk,
  never before (a write that fails says so instead, and no "saved");
- :meth:`RunSaves.stop`: the stop's save, waited for until it is on disk, then one line saying where training
  stopped, how long the write took and how to continue; a requeue signal then requeues the SLURM job. Steps that
  stayed non-finite raise :class:`~ddp_utils.engine.guard.TrainingDiverged` instead;
- :meth:`RunSaves.finish`: a run that ends without a stop waits for its final save.

A final or stop save that did not reach the disk is :attr:`RunSaves.failed`: the run's last line (the
:class:`SaveFailed` that :func:`~ddp_utils.run.epochs.finish_training` raises, exit code
:data:`SAVE_FAILED_EXIT_CODE`) says where ``--resume`` will really continue: the state of the file on disk. Such a
run never says "done", nor requeues its job.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch

from ..distributed import DistInfo, any_rank, broadcast_object
from ..engine.guard import TrainingDiverged
from ..log import LOGGER
from .checkpoint import Checkpointer
from .control import StepControl
from .signals import requeue_job
from .train_state import TrainState
from .training import Training

SAVE_PHASE_S = 600.0  # how long rank 0 may take over a save (a slow or remote disk) before it counts as stalled
SAVE_FAILED_EXIT_CODE = 74  # EX_IOERR in sysexits.h: the final or stop save did not reach the disk


class SaveFailed(RuntimeError):
    """A run's final or stop save did not reach the disk (or, at its start, its ``opt.yaml``); the message says which
    checkpoint is on disk and where ``--resume`` continues (train.py: that line, exit code
    :data:`SAVE_FAILED_EXIT_CODE`)."""


class RunSaves:
    """Save a run where it stands, at an epoch's end, in the middle of one, or when it stops.

    Args:
        checkpoints: the run's :class:`~ddp_utils.run.checkpoint.Checkpointer` (used on rank 0 only).
        control: the run's control; every save restarts its clock.
        info: this process in the job.
        watchdog: the run's :class:`~ddp_utils.distributed.StallWatchdog`: rank 0's saves are a phase of their own
            (:data:`SAVE_PHASE_S`), while the other ranks wait for it; or None.
        says_resume: whether the stop line ends with how to continue (``python train.py --resume``); False for an
            evolve trial, whose study continues it (its own line says how: start the same command again).
    """

    def __init__(
        self,
        checkpoints: Checkpointer,
        control: StepControl,
        info: DistInfo,
        watchdog: Any = None,
        says_resume: bool = True,
    ) -> None:
        self.checkpoints, self.control, self.info, self.watchdog = checkpoints, control, info, watchdog
        self.says_resume = says_resume
        self.failed: str | None = None  # the final or stop save did not land: what the run's last line says

    def _saving(self) -> contextlib.AbstractContextManager:
        return self.watchdog.phase("save", SAVE_PHASE_S) if self.watchdog is not None else contextlib.nullcontext()

    def save(
        self, fit: Training, stats: Any = None, best: bool = False, say: bool = False, final: bool = False
    ) -> TrainState:
        """Every rank: last.pt of ``fit``'s state, at ``stats``' batch when given; returns the state saved.

        With ``say``, rank 0 logs ``saved <last.pt> at <where> (...)`` once the file is whole on disk. ``final``:
        no save follows (the run's last epoch, a stop): a write that fails does not promise a next one.
        """
        state = fit.state_at(stats, self.info.world_size, self.control.skipped)
        if self.info.is_main:
            last, where = self.checkpoints.last, state.where()

            def landed(held: float, took: float) -> None:  # in the writer's thread, once the file is on disk
                LOGGER.info(f"saved {last} at {where} (training waited {held:.2f} s, written in {took:.1f} s)")

            with self._saving():  # the snapshot (and the write, unless in the background)
                self.checkpoints.save(state, fit.step, best=best, landed=landed if say else None, goes_on=not final)
        self.control.saved()
        return state

    def periodic(self, fit: Training, stats: Any) -> None:
        """Every rank: the mid-epoch save agreed on (written in the background while training goes on); its line
        comes once the file is on disk."""
        self.save(fit, stats, say=True)

    def _diverged(self, state: TrainState, amp: str, written: bool, took: float) -> str:
        """The one line of a run that stopped as diverged: why, what last.pt holds, what to do."""
        control, last = self.control, self.checkpoints.last
        if control.in_a_row >= control.nonfinite_limit:
            overflows = f", {control.overflows} of them the GradScaler's fp16 overflows" if control.overflows else ""
            why = (
                f"{control.in_a_row} optimizer steps in a row had non-finite gradients or losses "
                f"({control.skipped} skipped in all{overflows})"
            )
            holds = "the last finite state"
        else:
            faults = control.epoch_skipped - control.epoch_overflows
            why = (
                f"{faults} of the epoch's {control.epoch_steps} optimizer steps were skipped (non-finite gradients "
                "or losses): it is not training (the epoch was not validated; best.pt, if any, is an earlier one's)"
            )
            holds = "where it stopped"
        saved = f"saved {last} in {took:.1f} s, {holds}" if written else _not_saved(last, self.says_resume)
        return f"training diverged at {state.where()}: {why}; {saved}; {diverged_advice(amp)}"

    def wait(self) -> bool:
        """Every rank, at the end: wait until rank 0's writes are on disk, bounded as a save (the other ranks wait
        for rank 0 at the end of the watched work); True on every rank when rank 0's last write landed (a
        collective: every rank calls it)."""
        with self._saving():
            landed = self.checkpoints.wait()
        return not any_rank(not landed)

    def finish(self, fit: Training) -> None:
        """Every rank, when the run ended without a stop: wait for the final save; one that did not land is
        :attr:`failed`, saying where ``--resume`` will really continue."""
        if not self.wait():
            self.failed = self._failure(f"training ended after epoch {fit.state.epoch} but ")

    def stop(self, fit: Training, stats: Any = None) -> None:
        """Every rank, when the control stopped the run: save where it stands (at ``stats``' batch when the epoch
        was not validated), wait until the file is on disk, say so, and requeue the job when a requeue signal
        asked for it. A save that did not land is :attr:`failed` instead: no "saved", no requeue.

        Raises:
            TrainingDiverged: the run stopped because its steps stayed non-finite, or an epoch skipped most of them
                (:attr:`~ddp_utils.run.control.StepControl.diverging`); the message says what last.pt holds.
        """
        state = self.save(fit, stats, final=True) if stats is not None else fit.state
        written, last = self.wait(), self.checkpoints.last
        took = self.checkpoints.write_seconds
        control = self.control
        if control.reason == "diverged":
            raise TrainingDiverged(self._diverged(state, fit.step.amp, written, took))
        if not written:  # the run's last line says it (finish_training), and where --resume really continues
            self.failed = self._failure(f"stopped at {state.where()}: ")
            return
        if self.info.is_main:
            how = f"; continue with: python train.py --resume {last}" if self.says_resume else ""
            LOGGER.warning(f"stopped at {state.where()}: saved {last} in {took:.1f} s{how}")
        if control.requeue_anywhere():  # after rank 0 saved: the requeued job resumes from it
            requeue_job(restarts_from=f"{last} ({state.where()})")

    def _failure(self, head: str) -> str:
        """Every rank: rank 0's words for a save that did not land (it reads the file it writes: another node may
        not see it), after ``head``."""
        return broadcast_object(
            f"{head}{_not_saved(self.checkpoints.last, self.says_resume)}" if self.info.is_main else ""
        )

    def finished_words(self) -> str:
        """Rank 0: the checkpoints a finished run has on disk, where each stands (``runs/exp/weights/last.pt (the end
        of epoch 3) and runs/exp/weights/best.pt (the end of epoch 2)``); empty on the other ranks."""
        if not self.info.is_main:
            return ""
        paths = [path for path in (self.checkpoints.last, self.checkpoints.best) if path.is_file()]
        return " and ".join(f"{path} ({on_disk(path)})" for path in paths)

    def at_once_words(self) -> str:
        """What the writes leave when the process stops at once (a second Ctrl-C): a save still being written is
        not finished; which checkpoint is on disk, and where ``--resume`` continues. Empty on the other ranks."""
        if not self.info.is_main:
            return ""
        last, writer = self.checkpoints.last, self.checkpoints.writer
        unfinished = f"the save of {last} being written is not finished, " if writer is not None and writer.busy else ""
        return unfinished + _on_disk_words(last, self.says_resume)


def diverged_advice(amp: str) -> str:
    """What to do about a run that diverged, under ``--amp`` ``amp``.

    Examples:
        >>> diverged_advice("bf16")
        'lower the learning rate (hyp lr0), try --amp off (now bf16), or look for bad labels'
    """
    amp_off = f", try --amp off (now {amp})" if amp != "off" else ""
    return f"lower the learning rate (hyp lr0){amp_off}, or look for bad labels"


def on_disk(path: Path) -> str | None:
    """Where the checkpoint at ``path`` stands (``"epoch 2, batch 3/12"``, ``"the end of epoch 1"``), read from
    the file; None: no file.

    Only its small values are read: the tensors are memory-mapped, not loaded.
    """
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except FileNotFoundError:
        return None
    except Exception as exc:  # damaged or foreign: --resume would say so itself
        return f"unreadable ({type(exc).__name__})"
    state = TrainState.from_checkpoint(ckpt)
    return state.where() if state.batch else f"the end of epoch {state.epoch}"


def _on_disk_words(last: Path, says_resume: bool = True) -> str:
    """Which checkpoint is on disk at ``last`` and where ``python train.py --resume`` continues from it."""
    held = on_disk(last)
    if held is None:
        return f"no {last} is on disk: nothing to resume from"
    if held.startswith("unreadable"):
        return f"the {last} on disk is {held}"
    resume = f": python train.py --resume {last} continues from {held}" if says_resume else ""
    return f"the {last} on disk is from {held}{resume}"


def _not_saved(last: Path, says_resume: bool = True) -> str:
    """What a failed final or stop save leaves: where ``--resume`` really continues, from the file on disk."""
    held = on_disk(last)
    if held is None:
        return f"could not save {last} (the warning above says why), and none is on disk: nothing to resume from"
    if held.startswith("unreadable"):
        return f"could not save {last} (the warning above says why), and the one on disk is {held}"
    return f"could not save {last} (the warning above says why); {_on_disk_words(last, says_resume)}, not from here"


__all__ = ["SAVE_FAILED_EXIT_CODE", "RunSaves", "SaveFailed", "diverged_advice", "on_disk"]
