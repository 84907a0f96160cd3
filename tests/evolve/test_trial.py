"""One trial: its pruning (against the finished trials, never at the last epoch, on rank 0 only) and its options."""

from __future__ import annotations

import argparse
from pathlib import Path

import optuna
import pytest

from ddp_utils.distributed import DistInfo
from ddp_utils.engine import TrainingDiverged
from ddp_utils.evolve.settings import EvolveSettings
from ddp_utils.evolve.study import run_trial
from ddp_utils.evolve.trial import TrialPlan, TrialStopper
from ddp_utils.run.options import raising_user_errors, user_errors
from ddp_utils.run.saves import SaveFailed

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture
def pruner(request) -> optuna.pruners.BasePruner:
    """train.py's pruner for ``--evolve-prune median|halving``, made by EvolveSettings."""
    settings = EvolveSettings(1, Path("runs/evolve/exp"), "sqlite://", "exp", {}, {}, {}, 3, prune=request.param)
    return settings.make_pruner()


def study_with_good_trials(pruner: optuna.pruners.BasePruner) -> optuna.Study:
    """Two trials run to their end through the stopper (the pruner records its rungs on the way)."""
    study = optuna.create_study(direction="maximize", pruner=pruner)
    for value in (0.5, 0.6):
        trial = study.ask()
        stopper = TrialStopper(patience=100, epochs=3, trial=trial)
        assert [stopper(epoch, value - 0.1 * (2 - epoch)) for epoch in range(3)] == [False] * 3
        study.tell(trial, value)
    return study


@pytest.mark.parametrize("pruner", ["median", "halving"], indirect=True)
def test_a_hopeless_trial_is_pruned_after_its_first_epoch(pruner):
    study = study_with_good_trials(pruner)
    trial = study.ask()
    stopper = TrialStopper(patience=100, epochs=3, trial=trial)
    assert stopper(0, 0.01) is True and stopper.pruned_at == 1
    assert study.trials[-1].intermediate_values == {1: 0.01}


@pytest.mark.parametrize("pruner", ["median", "halving"], indirect=True)
def test_before_any_trial_has_learned_the_pruner_sees_ties_and_lets_them_go_on(pruner):
    """Fitness 0.0002 and 0.0001 after a first epoch is noise, not a ranking: at 3 decimals all are 0.0."""
    study = optuna.create_study(direction="maximize", pruner=pruner)
    for first in (0.0002, 0.0001):
        trial = study.ask()
        stopper = TrialStopper(patience=100, epochs=4, trial=trial)
        assert [stopper(e, f) for e, f in enumerate([first, 0.3, 0.5, 0.6])] == [False] * 4
        study.tell(trial, 0.6)
    late = study.ask()
    stopper = TrialStopper(patience=100, epochs=4, trial=late)
    assert stopper(0, 0.00004) is False  # unrounded, both pruners cut it: below the median, not the best at rung 1
    assert study.trials[-1].intermediate_values == {1: 0.0}
    assert stopper(1, 0.3) is False  # a tie again
    assert stopper(2, 0.01) is True and stopper.pruned_at == 3  # once the others had learned, it is ranked


@pytest.mark.parametrize("pruner", ["median", "halving"], indirect=True)
@pytest.mark.parametrize(("warmup_epochs", "first_judged"), [(1.0, 1), (1.5, 2), (0.5, 1)])
def test_no_epoch_that_began_in_the_trial_s_warm_up_is_judged(pruner, warmup_epochs, first_judged):
    """A warm-up of 1 epoch: epoch 1 (index 0) is reported but not judged, epoch 2 (index 1) is; of 1.5, the
    first judged starts at 2; of 0.5, epoch 1 began in it."""
    study = study_with_good_trials(pruner)
    stopper = TrialStopper(patience=100, epochs=4, trial=study.ask(), warmup_epochs=warmup_epochs)
    assert [stopper(epoch, 0.01) for epoch in range(first_judged)] == [False] * first_judged
    assert study.trials[-1].intermediate_values == {e + 1: 0.01 for e in range(first_judged)}  # reported all the same
    assert stopper(first_judged, 0.01) is True and stopper.pruned_at == first_judged + 1


def test_a_good_trial_goes_on_and_the_last_epoch_is_never_pruned():
    study = study_with_good_trials(optuna.pruners.MedianPruner(n_startup_trials=2, n_min_trials=2))
    stopper = TrialStopper(patience=100, epochs=3, trial=study.ask())
    assert [stopper(e, f) for e, f in enumerate([0.45, 0.52])] == [False, False]
    assert stopper(2, 0.0) is False and stopper.pruned_at is None  # the end: complete, whatever it scored


def test_patience_still_stops_and_other_ranks_or_off_never_prune():
    study = study_with_good_trials(optuna.pruners.MedianPruner(n_startup_trials=2, n_min_trials=2))
    assert TrialStopper(patience=100, epochs=3, trial=None)(0, 0.0) is False  # ranks other than 0
    off = TrialStopper(patience=100, epochs=3, trial=study.ask(), prune=False)
    assert off(0, 0.0) is False and study.trials[-1].intermediate_values == {}  # neither pruned nor reported
    patient = TrialStopper(patience=1, epochs=5)
    assert [patient(e, f) for e, f in enumerate([0.3, 0.2, 0.1])] == [False, True, True]


def test_a_trial_is_one_run_of_its_values_in_its_own_directory():
    opt = argparse.Namespace(evolve=4, hyp=None, project="runs/evolve", name="exp", exist_ok=False, resume=False,
                             noplots=False, noval=False, epochs=3)  # fmt: skip
    plan = TrialPlan(2, {"lr0": 0.02}, "runs/evolve/exp/trials/2", "runs/evolve/exp/trials/2/weights/last.pt")
    run = plan.options(opt, prune=True)
    assert (run.evolve, run.hyp, run.project, run.name, run.exist_ok) == (None, {"lr0": 0.02}, "runs/evolve/exp/trials",
                                                                           "2", True)  # fmt: skip
    assert run.resume == plan.resume and run.noplots and not run.noval and run.epochs == 3
    assert plan.options(opt, prune=False).noval  # YOLOv5's: only the last epoch validated


class RecordingEvolution:
    """What run_trial asks of the study (rank 0's Evolution): the calls, in order."""

    def __init__(self) -> None:
        self.storage, self.settings, self.calls = None, argparse.Namespace(heartbeat=0), []

    def fail(self, trial: object, reason: str) -> None:
        self.calls.append(("fail", reason))

    def pause(self, trial: object, saved: bool = True) -> None:
        self.calls.append(("pause",) if saved else ("pause", "not saved"))


def diverges() -> None:
    raise TrainingDiverged("training diverged at epoch 1, batch 2/4")


def errs() -> None:
    raise OSError("disk full")


@pytest.mark.parametrize(
    ("train", "outcome", "calls"),
    [
        (lambda: None, "trained", []),  # to its end or pruned: the loop records its results
        (lambda: "signal", "stopped", [("pause",)]),  # back to the queue, this worker stops
        (diverges, "failed", [("fail", "diverged: training diverged at epoch 1, batch 2/4")]),
        (errs, "failed", [("fail", "OSError: disk full")]),  # in a single process the study goes on
    ],
)
def test_run_trial_says_what_became_of_the_trial_and_records_a_failure_once(train, outcome, calls):
    evolution = RecordingEvolution()
    assert run_trial(evolution, object(), train, DistInfo()) == outcome  # "failed": never recorded as a result too
    assert evolution.calls == calls


def test_under_train_run_a_mistake_in_the_inputs_fails_the_trial_and_ends_the_evolution():
    """From Python (train.run) a missing file is raised, not SystemExit: every trial would meet it, so it is
    recorded once and raised to the caller, not met again by each of the N trials."""

    def missing_cfg() -> None:
        with raising_user_errors(), user_errors():
            raise FileNotFoundError("/nowhere/model.yaml: no such file")

    evolution = RecordingEvolution()
    with pytest.raises(FileNotFoundError, match="/nowhere/model.yaml"):
        run_trial(evolution, object(), missing_cfg, DistInfo())
    assert evolution.calls == [("fail", "FileNotFoundError: /nowhere/model.yaml: no such file")]


def test_a_trial_whose_save_failed_goes_back_to_the_queue_and_ends_the_study_naming_it():
    """A full disk: run_trial's ``except Exception`` recorded the trial failed, printed its traceback, and the study
    went on to fail every trial the same way, then exited 0."""

    def full_disk() -> None:
        raise SaveFailed(
            "training ended after epoch 2 but could not save trials/3/weights/last.pt (the warning above says why); "
            "the trials/3/weights/last.pt on disk is from epoch 2, batch 3/8, not from here"
        )

    evolution = RecordingEvolution()
    with pytest.raises(SaveFailed) as raised:
        run_trial(evolution, object(), full_disk, DistInfo(), number=3)
    assert evolution.calls == [("pause", "not saved")]  # no "stopped and saved" line: the last line says it all
    assert str(raised.value) == (
        "evolve: trial 3: training ended after epoch 2 but could not save trials/3/weights/last.pt (the warning above "
        "says why); the trials/3/weights/last.pt on disk is from epoch 2, batch 3/8, not from here; the study stops "
        "here, trial 3 back in its queue: free the disk, then start the same command again"
    )


def test_python_s_own_ctrl_c_in_train_run_puts_the_trial_back_in_the_queue():
    """train.py owns Ctrl-C (a second press exits at once and never raises), but a host program calling
    train.run(evolve=N) keeps Python's: KeyboardInterrupt reaches run_trial, which queues the trial again."""

    def pressed() -> None:
        raise KeyboardInterrupt

    evolution = RecordingEvolution()
    with pytest.raises(KeyboardInterrupt):
        run_trial(evolution, object(), pressed, DistInfo())
    assert evolution.calls == [("pause",)]
