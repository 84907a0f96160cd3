"""One trial of an evolution: its options (one train.py run), its pruning, what it reports to the study."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

import optuna

from ..log import LOGGER
from ..run.early_stop import EarlyStopping

TRIALS_DIR = "trials"  # each trial's run: <evolve dir>/trials/<number>


@dataclasses.dataclass(frozen=True)
class TrialPlan:
    """What every rank needs to run a trial (rank 0 claims it, then broadcasts this).

    Attributes:
        number: the study's trial number.
        hyp: every hyperparameter the trial trains with.
        run_dir: its run directory; a ``weights/last.pt`` there is continued (a stopped or retried trial).
        resume: that ``last.pt``, or None for a new run.
    """

    number: int
    hyp: dict[str, Any]
    run_dir: str
    resume: str | None = None

    def options(self, opt: argparse.Namespace, prune: bool) -> argparse.Namespace:
        """train.py's options for this trial's run.

        Each trial is a plain run of ``--hyp`` (its values) in its own directory, with no plots (as YOLOv5's
        trials); validated every epoch when pruning (the pruner reads each epoch's fitness), else only after the
        last (``--noval``, as YOLOv5's). A stopped or retried trial resumes its ``last.pt``.
        """
        run_dir = Path(self.run_dir)
        changes = dict(evolve=None, hyp=dict(self.hyp), project=str(run_dir.parent), name=run_dir.name,
                       exist_ok=True, resume=self.resume or False, noplots=True, noval=not prune)  # fmt: skip
        return argparse.Namespace(**{**vars(opt), **changes})


def plan_trial(trial: optuna.Trial, base: dict[str, Any], space: dict[str, Any], evolve_dir: Path) -> TrialPlan:
    """The plan of a claimed trial: its values (sampled now, or those it already has) and its run directory.

    A trial that ran before (stopped by a signal, or the retry of a lost worker's trial, which keeps the
    original's attributes) continues in the directory it trained in, from its ``last.pt`` when there is one.
    """
    values = {name: trial.suggest_float(name, bound.low, bound.high) for name, bound in space.items()}
    run_dir = trial.user_attrs.get("dir") or str(Path(evolve_dir) / TRIALS_DIR / str(trial.number))
    trial.set_user_attr("dir", run_dir)
    last = Path(run_dir) / "weights" / "last.pt"
    resume = str(last) if last.is_file() else None
    if resume:
        LOGGER.info(f"evolve: trial {trial.number} continues its run {run_dir}")
    elif trial.user_attrs.get("epochs_reported"):
        LOGGER.warning(f"evolve: trial {trial.number} trained elsewhere before (on {trial.user_attrs.get('host')}), "
                       f"and {last} is not here: it starts again")  # fmt: skip
    return TrialPlan(trial.number, {**base, **values}, run_dir, resume)


PRUNE_DECIMALS = 3  # the precision of the fitness the pruner compares (YOLOv5 prints mAP to 3 decimals)


class TrialStopper(EarlyStopping):
    """A trial's early stopping: ``--patience`` as in any run, and the study's pruner on the rank that holds the trial.

    train.py calls it after every validation on every rank and stops when any rank says stop, so rank 0's pruner
    decides for all. With pruning, each epoch's fitness is reported to the study at step ``epoch + 1`` (epochs
    trained), rounded to :data:`PRUNE_DECIMALS` decimals; the last epoch is never pruned (the trial is complete then).
    Without (``--evolve-prune off``, YOLOv5's way), only the last epoch is validated, and nothing is reported.

    The rounding is what lets the early epochs through: while no trial has learned anything yet (warm-up, or a
    detector before its take-off: mAP 0.0001 against 0.0002), the pruners would rank trials by noise and cut the
    ones that learn later; rounded, those values tie, and both pruners let a tie go on (a trial is cut only below
    the median, or outside the best third, of its rung).

    Nor is a trial judged on an epoch that began inside its warm-up (the first epoch judged is the first to start
    after it; train.py gives the warm-up's length as the training has it, longer than the hyp's ``warmup_epochs``
    where ``warmup_min_iters`` outlasts it on a dataset of few batches): the warm-up's values are among those
    evolved, and while they act (a bias lr of 0.1 falling, momentum rising) the fitness measures how hard the warm-up
    shakes the model, not where the trial is going. Fine-tuning from a model at fitness 0.675, trials fell to
    0.49-0.68 in a warm-up epoch, and the median pruner cut 23 of 32 there (docs/evolve.md). Such epochs are still
    reported, for the others' medians.

    Args:
        patience: ``--patience``.
        epochs: the trial's epochs.
        trial: the study's trial (rank 0), or None (other ranks; or no pruning).
        prune: whether the pruner may stop the trial (``--evolve-prune`` not ``off``).
        warmup_epochs: the trial's warm-up in epochs (train.py sets the length the training's warm-up has,
            ``warmup_min_iters`` counted): no pruning on an epoch that starts before it ends.

    Attributes:
        pruned_at: epochs trained when the pruner stopped the trial, or None.
        requeues_on_stop: True: a trial stopped by a signal goes back to its study's queue, and the evolve line
            says how to continue it; the run's own stop line gives no ``--resume`` command (that would train
            the trial outside the study).

    Examples:
        >>> import optuna
        >>> optuna.logging.set_verbosity(optuna.logging.WARNING)
        >>> study = optuna.create_study(direction="maximize", pruner=optuna.pruners.ThresholdPruner(lower=0.5))
        >>> stopper = TrialStopper(patience=100, epochs=5, trial=study.ask(), prune=True)
        >>> [stopper(epoch, fit) for epoch, fit in enumerate([0.6, 0.4])], stopper.pruned_at
        ([False, True], 2)
    """

    requeues_on_stop = True

    def __init__(
        self,
        patience: int,
        epochs: int,
        trial: optuna.Trial | None = None,
        prune: bool = True,
        warmup_epochs: float = 0.0,
    ) -> None:
        super().__init__(patience=patience)
        self.epochs, self.trial, self.prune, self.warmup_epochs = int(epochs), trial, prune, float(warmup_epochs)
        self.pruned_at: int | None = None

    def __call__(self, epoch: int, fitness: Any) -> bool:
        stop = super().__call__(epoch, fitness)
        if self.trial is None or fitness is None or not self.prune:  # without pruning, epochs but the last repeat it
            return stop
        value = round(float(fitness), PRUNE_DECIMALS)
        self.trial.report(value, step=epoch + 1)
        self.trial.set_user_attr("epochs_reported", epoch + 1)
        if self.warmup_epochs <= epoch < self.epochs - 1 and self.trial.should_prune():
            self.pruned_at = epoch + 1
            LOGGER.info(f"evolve: trial {self.trial.number} pruned after epoch {epoch + 1}: fitness {value:.4g} is "
                        "hopeless against the finished trials")  # fmt: skip
            return True
        return stop


__all__ = ["PRUNE_DECIMALS", "TRIALS_DIR", "TrialPlan", "TrialStopper", "plan_trial"]
