"""``train.py --evolve [N]``: YOLOv5's hyperparameter evolution, its trials in a study store, run by any workers.

:func:`evolve` is the loop one worker runs (one process, or one torchrun job whose ranks train each trial
together): rank 0 takes the next trial from the study (:mod:`.store`), every rank trains it as one train.py run
(the ``train_run`` it is given), rank 0 records how it ended, and on to the next until no trial is left to start.
How a trial ends:

- its last epoch, or ``--patience``: complete, with the fitness of its last validation;
- the pruner (:class:`~ddp_utils.evolve.trial.TrialStopper`): pruned, after the epochs it trained;
- a stop signal: its ``last.pt`` saved mid-epoch as in any run; the trial goes back to the queue and this worker
  ends; the next start of the same command continues it, to the same bits;
- non-finite steps (``TrainingDiverged``) or an error: failed, with its reason, never a result; the study goes on
  (under torchrun an error other than divergence ends the worker, since the ranks may no longer agree);
- its final or stop save did not reach the disk (:class:`~ddp_utils.run.saves.SaveFailed`: a full disk, which every
  trial would meet): the trial goes back to the queue, its ``last.pt`` on disk kept, and the study ends there with
  train.py's exit code for it (74) and one line naming the trial and the checkpoint it has on disk.

The worker's evolve directory then holds ``evolve.csv``, ``hyp_evolve.yaml`` and ``evolve.png``
(:mod:`.records`), rewritten from the study after every trial.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from ..distributed import DistInfo, broadcast_object, launch_key
from ..engine.guard import TrainingDiverged
from ..log import LOGGER
from ..run.options import is_user_error, user_errors
from ..run.saves import SaveFailed
from .heartbeat import heartbeat
from .records import TrialResult, best_words, trial_line, trial_metrics, trial_results, write_records
from .settings import EvolveSettings
from .store import (
    STUDY_FILE,
    StoreError,
    claim,
    open_storage,
    open_study,
    pause,
    results_count,
    shown_url,
)
from .trial import TrialPlan, TrialStopper, plan_trial

TrainRun = Callable[[argparse.Namespace, DistInfo, Any, Any], "str | None"]


class Evolution:
    """Rank 0's side of a worker: the store, the study, and what it records. :meth:`open` makes one."""

    def __init__(self, settings: EvolveSettings, storage: Any, study: optuna.Study, launch: str) -> None:
        self.settings, self.storage, self.study, self.launch = settings, storage, study, launch

    @classmethod
    def open(cls, settings: EvolveSettings, launch: str) -> Evolution:
        """Open the store and the study (made when new), checked before the evolve directory is made.

        Raises:
            StoreError: the store cannot be opened, or its study was made for another evolution (one line).
        """
        default = settings.storage_url.endswith(f"/{STUDY_FILE}") and settings.storage_url.startswith("sqlite:")
        if default and not (settings.evolve_dir / STUDY_FILE).is_file():
            settings.evolve_dir.mkdir(parents=True, exist_ok=True)  # a new study: its directory holds its store
        storage = open_storage(settings.storage_url, settings.heartbeat, settings.grace)
        study = open_study(storage, settings.study_name, settings.identity(), settings.first_values(),
                           settings.make_sampler(), settings.make_pruner())  # fmt: skip
        settings.evolve_dir.mkdir(parents=True, exist_ok=True)
        done, total = results_count(study)
        LOGGER.info(f"evolve: study {settings.study_name!r} in {shown_url(settings.storage_url)}: {done}/{total} "
                    f"trials finished; {settings.sampler} sampler, pruning {settings.prune}, {len(settings.space)} "
                    f"hyperparameters evolved, results in {settings.evolve_dir}")  # fmt: skip
        return cls(settings, storage, study, launch)

    def claim(self, restarted: bool) -> tuple[optuna.Trial, TrialPlan] | None:
        """The next trial and its plan, or None when none is left to start."""
        trial = claim(self.study, self.storage, self.launch, restarted)
        if trial is None:
            return None
        s = self.settings
        plan = plan_trial(trial, s.hyp, s.space, s.evolve_dir)
        LOGGER.info(f"evolve: trial {trial.number} of {s.generations} starts: "
                    + ", ".join(f"{k}={plan.hyp[k]:.5g}" for k in s.space))  # fmt: skip
        return trial, plan

    def finish(self, trial: optuna.Trial, plan: TrialPlan, stopper: TrialStopper) -> None:
        """Record a trial that ran to its end or was pruned: its metrics from its results.csv, then the files."""
        found = trial_metrics(Path(plan.run_dir))
        if found is None:
            self.fail(trial, f"its run left no results ({plan.run_dir}/results.csv)")
            return
        metrics, epochs = found
        trial.set_user_attr("metrics", list(metrics))
        trial.set_user_attr("epochs", epochs)
        result = TrialResult(trial.number, metrics, plan.hyp, epochs, stopper.pruned_at is not None)
        with quiet_tell():
            if result.pruned:
                self.study.tell(trial, state=TrialState.PRUNED)
            else:
                self.study.tell(trial, result.fitness)
        self.write(result, "complete")

    def fail(self, trial: optuna.Trial, reason: str) -> None:
        """Record a trial that failed, with its reason (never a result)."""
        trial.set_user_attr("fail_reason", reason[:2000])
        with quiet_tell():
            self.study.tell(trial, state=TrialState.FAIL)
        LOGGER.warning(f"evolve: trial {trial.number} failed: {reason}")
        self.write(None, "failed", trial.number)

    def pause(self, trial: optuna.Trial, saved: bool = True) -> None:
        """Put a trial back in the queue: the next start continues it from its last.pt. ``saved``: a signal stopped
        it, its last.pt saved (one line says so); else its save failed, and the study's last line says what it has."""
        pause(self.storage, trial)
        if saved:
            LOGGER.info(f"evolve: trial {trial.number} stopped and saved; start the same command again to continue it")

    def write(self, result: TrialResult | None, state: str, number: int | None = None) -> TrialResult | None:
        """evolve.csv, hyp_evolve.yaml and evolve.png from the study; the trial's line when one ended.

        One reading of the study serves the records, the best and the count: read twice, a trial another worker
        finished in between was counted and not among the results (``2/4 finished; best: trial 1`` while the
        better trial 0 had finished).
        """
        trials = self.study.get_trials(deepcopy=False)
        best = self._write_records(trials)
        if state:
            done, total = results_count(self.study, trials)
            LOGGER.info(trial_line(result, result.number if result else number, state, done, total, best))
        return best

    def _write_records(self, trials: list) -> TrialResult | None:
        s = self.settings
        results = trial_results(trials, s.hyp)
        return write_records(s.evolve_dir, results, list(s.hyp), list(s.space), s.generations)

    def summary(self) -> str:
        """The worker's last line: what the study holds, where the results are, and how to use them once the
        study is done; while trials still run elsewhere or wait (this worker was stopped: its stop line said how
        to continue), the best so far and no instruction."""
        s = self.settings
        trials = self.study.get_trials(deepcopy=False)
        best = self._write_records(trials)
        count = {state: sum(t.state == state for t in trials) for state in TrialState}
        done, total = results_count(self.study, trials)
        going_on = count[TrialState.RUNNING] + count[TrialState.WAITING]
        line = (f"evolve: {done}/{total} trials finished ({count[TrialState.PRUNED]} pruned, "
                f"{count[TrialState.FAIL]} failed"
                + (f", {count[TrialState.RUNNING]} running elsewhere" if count[TrialState.RUNNING] else "")
                + (f", {count[TrialState.WAITING]} waiting" if count[TrialState.WAITING] else "") + ")")  # fmt: skip
        if best is None:
            return line
        if going_on:  # not done: the results are rewritten as the other trials finish
            return line + f"; best so far: {best_words(best)}; results in {s.evolve_dir}"
        if best.pruned:  # every trial was pruned: settings judged at an early epoch are no result to train with
            return line + (f"; best: {best_words(best)}, and no trial trained to its last epoch: evolve on before "
                           f"training with them (more trials, or --evolve-prune off); results in "
                           f"{s.evolve_dir}")  # fmt: skip
        return line + (f"; best: {best_words(best)}; results in {s.evolve_dir}; train with them: python train.py "
                       f"--hyp {s.evolve_dir / 'hyp_evolve.yaml'}")  # fmt: skip


@contextlib.contextmanager
def quiet_tell() -> Iterator[None]:
    """Optuna warns that heartbeats belong to its own ``optimize`` loop; :mod:`.store` beats them for this one."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
        yield


def open_evolution(opt: argparse.Namespace, info: DistInfo) -> tuple[EvolveSettings, Evolution | None]:
    """Settle the options (every rank) and open the study (rank 0); every rank raises rank 0's error alike.

    Raises:
        ValueError: one line (an unknown hyperparameter name, an unknown or unreachable store, a study made for
            another evolution...), before anything is written.
    """
    settings = EvolveSettings.from_options(opt)
    evolution, error = None, None
    if info.is_main:
        try:
            evolution = Evolution.open(settings, launch_key(info))
        except StoreError as exc:
            error = str(exc)
    error = broadcast_object(error)
    if error is not None:
        raise StoreError(error)
    return settings, evolution


def evolve(opt: argparse.Namespace, info: DistInfo, device: Any, train_run: TrainRun) -> None:
    """Run trials of the study until none is left to start (or a signal stops this worker).

    A mistake in the evolution's inputs (:func:`open_evolution`) is one line and exit code 2 on every rank, before
    anything is written.

    Args:
        opt: train.py's options, with ``--evolve N`` and the ``--evolve-*`` ones.
        info: this process in the job.
        device: the device every trial trains on.
        train_run: ``train_run(opt, info, device, stopper)``, one train.py run, returning ``"signal"`` when a
            signal stopped it (its last.pt saved) and None when it ended otherwise.
    """
    with user_errors():
        settings, evolution = open_evolution(opt, info)
    trial_info = dataclasses.replace(info, restart_count=0)  # a trial resumes by its plan, never by the launch
    while True:
        claimed = evolution.claim(info.restart_count > 0) if evolution is not None else None
        plan = broadcast_object(claimed[1] if claimed else None)
        if plan is None:
            break
        trial = claimed[0] if claimed else None
        # the pruner waits for the trial's warm-up: train_run gives the stopper its length as the training has it
        stopper = TrialStopper(opt.patience, settings.epochs, trial, settings.prune != "off")
        run_opt = plan.options(opt, prune=settings.prune != "off")
        train = functools.partial(train_run, run_opt, trial_info, device, stopper)
        outcome = run_trial(evolution, trial, train, info, number=plan.number)
        if outcome == "stopped":
            break
        if outcome == "trained" and evolution is not None:  # a failed trial is recorded already, never a result
            evolution.finish(trial, plan, stopper)
    if evolution is not None:
        LOGGER.info(evolution.summary())


def run_trial(
    evolution: Evolution | None, trial: Any, train: Callable[[], Any], info: DistInfo, number: int | None = None
) -> str:
    """Train one trial: ``"trained"`` (to its end or pruned: its results to record), ``"failed"`` (recorded, with
    its reason) or ``"stopped"`` (a signal: the trial goes back to the queue and this worker stops).

    Divergence fails the trial and the study goes on; so does any other error in a single process (under torchrun
    it ends the worker, whose ranks may no longer agree). Only ``evolution`` (rank 0) writes to the store.

    Raises:
        SaveFailed: the trial's final or stop save did not reach the disk (every rank alike): the trial is back in
            the queue, and the message, the study's last line, names it (``number``) and what it has on disk.
    """
    try:
        with heartbeat(
            evolution.storage if evolution else None, trial, evolution.settings.heartbeat if evolution else 0
        ):
            stopped = train()
    except TrainingDiverged as exc:  # every rank alike, after last.pt was saved
        if evolution is not None:
            evolution.fail(trial, f"diverged: {exc}")
        return "failed"
    except SaveFailed as exc:  # a full disk: every trial would meet it; this one continues once the disk is freed
        if evolution is not None:
            evolution.pause(trial, saved=False)
        which = f"trial {number}" if number is not None else "the trial"
        raise SaveFailed(f"evolve: {which}: {exc}; the study stops here, {which} back in its queue: free the disk, "
                         "then start the same command again") from None  # fmt: skip
    except Exception as exc:
        if evolution is not None:
            evolution.fail(trial, f"{type(exc).__name__}: {exc}")
        if info.distributed or is_user_error(exc):  # train.run's mistake in the inputs: every trial would meet it
            raise
        LOGGER.warning("evolve: the trial's error; the study goes on", exc_info=True)
        return "failed"
    except KeyboardInterrupt:  # train.run's host program keeps Python's Ctrl-C (train.py's own never raises it)
        if evolution is not None:
            evolution.pause(trial)
        raise
    except SystemExit as exc:  # a mistake in the inputs, said in one line by the run: every trial would meet it
        if evolution is not None:
            evolution.fail(trial, f"the run exited with code {exc.code}")
        raise
    if stopped is None:
        return "trained"
    if evolution is not None:
        evolution.pause(trial)
    return "stopped"


__all__ = ["Evolution", "TrainRun", "evolve", "open_evolution", "run_trial"]
