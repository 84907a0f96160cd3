"""The end of an epoch and the end of the epochs: what a run does, in which order, once an epoch has trained.

:func:`end_epoch` follows a trained and validated epoch. Its order keeps a stop anywhere resumable and a
resume bit-identical:

1. the LR schedule steps and the stopper judges the epoch, every rank agreeing (``any_rank``);
2. the state records the finished epoch (what ``last.pt`` holds: a resume continues at the next one), with
   whether its fitness is a new best (never a diverging epoch's: :func:`~ddp_utils.run.early_stop.is_new_best`);
3. results.csv, the trackers and the epoch line report it;
4. a stop signal that came while it was validated joins the stopper's verdict, so both save the same way;
5. last.pt (and best.pt) is written last, from the state of step 2: a stop right after costs nothing.

:func:`finish_training` follows the epochs: a run that was not stopped strips the optimizer from its
checkpoints and draws its curves (rank 0), the trackers get the weights, and the logger closes.
"""

from __future__ import annotations

from typing import Any

from ..distributed import DistInfo, any_rank, reduce_tensor
from ..log import LOGGER
from ..yolo.metrics import class_maps, fitness
from .early_stop import is_new_best
from .interrupt import ctrl_c_owner
from .loggers import results_values
from .records import Records
from .report import epoch_line, epoch_notes, epoch_speed, finish_run
from .saves import SaveFailed
from .start import Run
from .training import Training


def end_epoch(
    run: Run, fit: Training, records: Records, epoch: int, stats: Any, validated: tuple, info: DistInfo
) -> bool:
    """After epoch ``epoch`` trained (``stats``, its :class:`~ddp_utils.engine.EpochStats`) and was validated
    (``validated``: ``(metrics, val_loss)``): step, judge, record, report and save, in the module's order.

    Every rank calls it (the train loss and the stop are agreed by collectives); rank 0 writes.

    Returns:
        True when the run stops after this epoch (an early stop, or a signal during validation).
    """
    metrics, val_loss = validated
    step, control = fit.step, records.control
    lrs = [group["lr"] for group in step.optimizer.param_groups]  # the epoch's, before the schedule steps
    train_loss = reduce_tensor(stats.loss, op="mean").cpu()  # the host waits for the GPU here, once an epoch
    fit.scheduler.step()
    score = fitness(metrics)
    stop = any_rank(bool(records.stopper(epoch, score)))
    best = is_new_best(score, fit.state.best_fitness, control.epoch_skipped)
    fit.state = fit.state.epoch_done(
        step.last_opt_step, records.stopper, metrics, val_loss, _class_maps(run, fit, metrics), control.skipped
    )
    records.logger.log(epoch, results_values(train_loss, metrics, val_loss, lrs, control.epoch_skipped))
    line = epoch_line(epoch, run.epochs, train_loss, metrics, epoch_speed(stats, info.world_size))
    LOGGER.info(line + epoch_notes(epoch, stats, control.epoch_skipped))
    stop = control.stop_anywhere() or stop  # a signal during the validation's last moments
    final = fit.state.epoch == run.epochs or stop  # no save follows this one
    if not run.opt.nosave or final:
        records.saves.save(fit, best=best, final=final)
    return stop


def _class_maps(run: Run, fit: Training, metrics: Any) -> Any:
    """Each class's mAP@0.5:0.95 from this validation (``--image-weights`` draws by it), else the last one's
    (``--noval`` repeats the last metrics, which carry no per-class table)."""
    return class_maps(metrics, run.nc) if hasattr(metrics, "classes") else fit.state.last_val.get("maps")


def finish_training(run: Run, fit: Training, records: Records, info: DistInfo) -> str | None:
    """After the epochs, outside ``with records``: a finished run's last words (rank 0 strips the optimizer from
    best.pt and last.pt and draws the curves; the trackers get the weights), then the logger closes, its runs
    FINISHED or, for a stopped run or one whose last save failed, left to be resumed; the loaders' workers end.

    A finished run's exit window opens first (:meth:`~ddp_utils.run.interrupt.CtrlC.finished`, where train.py owns
    the signals): from here to the process's end a stop signal (SIGTERM, the requeue signal, Ctrl-C) ends the
    process at once with exit code 0 and one line naming the checkpoints on disk; the last words it cuts short are
    optional ones (the stripped best.pt, results.png, the trackers' closing).

    Returns:
        why the run stopped early (``"signal"``, ...: :attr:`~ddp_utils.run.control.StepControl.reason`), or None.

    Raises:
        SaveFailed: the final or stop save did not reach the disk (every rank alike); the message says which
            checkpoint is on disk and where ``--resume`` continues. Nothing says "done".
    """
    stopped, failed = records.control.reason is not None, records.saves.failed
    owner = ctrl_c_owner()
    if owner is not None:  # a finished run's exit window (records handed it the signals): a stop signal exits 0
        owner.finished()
    if info.is_main and not stopped and failed is None:
        metrics, plots = fit.state.metrics()[0], not run.opt.noplots
        finish_run(run.save_dir, metrics, epochs_done=fit.state.epoch, plots=plots, optional=records.optional)
        records.logger.log_weights([records.saves.checkpoints.best, records.saves.checkpoints.last])
    records.logger.close(finished=not stopped and failed is None)
    for loader in (fit.train_loader, fit.val_loader):  # now, while Ctrl-C still says what the run left
        getattr(loader, "close", lambda: None)()
    if failed is not None:
        raise SaveFailed(failed)
    return records.control.reason


__all__ = ["end_epoch", "finish_training"]
