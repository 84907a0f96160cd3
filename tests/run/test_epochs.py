"""An epoch's end in its order (ddp_utils/run/epochs.py): the schedule steps and the stopper judges, the state
records the epoch, the logs report it, and last.pt is written last, from that state; in one process on the CPU."""

from __future__ import annotations

import argparse
import logging

import pytest
import torch

from ddp_utils.engine import EpochStats
from ddp_utils.log import LOGGER
from ddp_utils.run.epochs import end_epoch, finish_training
from ddp_utils.run.records import Records
from ddp_utils.run.train_state import TrainState
from ddp_utils.run.training import Training

METRICS = {"precision": 0.5, "recall": 0.4, "map50": 0.3, "map": 0.2}
INFO = argparse.Namespace(world_size=1, is_main=True)


class Journal(list):
    def part(self, name: str, returns=None):
        return lambda *args, **kwargs: self.append((name, args, kwargs)) or returns


def an_epoch(journal: Journal, *, stop_early=False, signal=False, nosave=False, epoch=0):
    groups = [{"params": [torch.nn.Parameter(torch.zeros(1))]} for _ in range(3)]  # YOLOv5's three groups
    optimizer = torch.optim.SGD(groups, lr=0.1)
    step = argparse.Namespace(optimizer=optimizer, last_opt_step=11)
    scheduler = argparse.Namespace(step=journal.part("schedule"))
    fit = Training(step, scheduler, [], [], [], TrainState(epoch=epoch))

    def stopper(e, fitness):
        journal.append(("judge", e, round(float(fitness), 3)))
        stopper.best_fitness = float(fitness)
        return stop_early

    stopper.best_fitness, stopper.best_epoch = None, -1
    control = argparse.Namespace(epoch_skipped=0, skipped=0, stop_anywhere=journal.part("stop anywhere?", signal))
    saves = argparse.Namespace(
        save=lambda fit, best, final=None: journal.append(("save", fit.state.epoch, best, final))
    )
    logger = argparse.Namespace(log=lambda e, values: journal.append(("log", e)))
    records = Records(logger=logger, stopper=stopper, saves=saves, control=control, watchdog=None)
    run = argparse.Namespace(epochs=3, nc=2, opt=argparse.Namespace(nosave=nosave))
    stats = EpochStats(loss=torch.tensor([0.1, 0.2, 0.3]), batch=4, images=16, seconds=1.0)
    return run, fit, records, stats


def test_the_epoch_is_judged_recorded_reported_and_saved_in_that_order():
    journal = Journal()
    run, fit, records, stats = an_epoch(journal)
    assert end_epoch(run, fit, records, 0, stats, (METRICS, torch.zeros(3)), INFO) is False
    assert [entry[0] for entry in journal] == ["schedule", "judge", "log", "stop anywhere?", "save"]
    assert journal[-1] == ("save", 1, True, False)  # the finished epoch's state (resume at epoch 1), a new best
    assert fit.state.epoch == 1 and fit.state.last_opt_step == 11 and fit.state.last_val["metrics"]["map"] == 0.2


@pytest.mark.parametrize("stop_early, signal", [(True, False), (False, True)])
def test_an_early_stop_or_a_signal_during_validation_saves_even_under_nosave_and_stops(stop_early, signal):
    journal = Journal()
    run, fit, records, stats = an_epoch(journal, stop_early=stop_early, signal=signal, nosave=True)
    assert end_epoch(run, fit, records, 0, stats, (METRICS, torch.zeros(3)), INFO) is True
    assert journal[-1][0] == "save" and journal[-1][3] is True  # the final save: no next one is promised


def test_nosave_saves_only_the_last_epoch():
    for epoch, saved in ((0, False), (2, True)):
        journal = Journal()
        run, fit, records, stats = an_epoch(journal, nosave=True, epoch=epoch)
        end_epoch(run, fit, records, epoch, stats, (METRICS, torch.zeros(3)), INFO)
        assert (journal[-1][0] == "save") is saved
        assert not saved or journal[-1][3] is True  # the last epoch's save is the final one


@pytest.mark.parametrize("reason", [None, "signal"])
def test_a_finished_run_says_its_last_words_and_a_stopped_one_leaves_its_trackers_open(reason, monkeypatch, tmp_path):
    journal = Journal()
    monkeypatch.setattr("ddp_utils.run.epochs.finish_run", journal.part("last words"))
    logger = argparse.Namespace(log_weights=journal.part("weights"), close=journal.part("close"))
    checkpoints = argparse.Namespace(best=tmp_path / "best.pt", last=tmp_path / "last.pt")
    saves, control = argparse.Namespace(checkpoints=checkpoints, failed=None), argparse.Namespace(reason=reason)
    records = Records(logger, None, saves, control, None)
    run = argparse.Namespace(save_dir=tmp_path, opt=argparse.Namespace(noplots=True))
    loaders = [argparse.Namespace(close=journal.part(f"close {kind} loader")) for kind in ("train", "val")]
    fit = Training(None, None, *loaders, [], TrainState(epoch=3))
    assert finish_training(run, fit, records, INFO) == reason
    ends = ["close", "close train loader", "close val loader"]  # the workers end while Ctrl-C still says what is left
    assert [entry[0] for entry in journal] == (ends if reason else ["last words", "weights", *ends])
    assert journal[-3][2] == {"finished": reason is None}


@pytest.mark.parametrize("reason", [None, "signal"])
def test_a_run_whose_final_or_stop_save_failed_says_no_last_words_and_raises_the_line(reason, monkeypatch, tmp_path):
    from ddp_utils.run.saves import SaveFailed

    journal = Journal()
    monkeypatch.setattr("ddp_utils.run.epochs.finish_run", journal.part("last words"))  # "3 epochs done; ..."
    logger = argparse.Namespace(log_weights=journal.part("weights"), close=journal.part("close"))
    line = "training ended after epoch 3 but could not save last.pt (the warning above says why); ..."
    saves, control = argparse.Namespace(failed=line), argparse.Namespace(reason=reason)
    records = Records(logger, None, saves, control, None)
    run = argparse.Namespace(save_dir=tmp_path, opt=argparse.Namespace(noplots=True))
    fit = Training(None, None, [], [], [], TrainState(epoch=3))
    with pytest.raises(SaveFailed, match="^training ended after epoch 3 but could not save last.pt"):
        finish_training(run, fit, records, INFO)
    assert journal == [("close", (), {"finished": False})]  # the trackers' runs left to resume, nothing said "done"


def test_a_resumed_epoch_trained_before_its_stop_has_no_speed_of_its_own():
    # stopped while it validated, resumed: every batch was trained before the stop; it said "0.0 img/s, data wait 0.0%"
    journal = Journal()
    run, fit, records, _ = an_epoch(journal, epoch=1)
    fit.state.batch = fit.state.batches = 4
    logged = []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())
    LOGGER.addHandler(handler)
    try:
        stats = EpochStats(loss=torch.tensor([0.1, 0.2, 0.3]), batch=4, start=4)  # nothing trained in this call
        end_epoch(run, fit, records, 1, stats, (METRICS, torch.zeros(3)), INFO)
    finally:
        LOGGER.removeHandler(handler)
    (line,) = [line for line in logged if line.startswith("epoch 2/3: ")]
    assert "img/s" not in line and "data wait" not in line, line
    assert line.endswith("mAP@0.5:0.95 0.200, every batch trained before the stop; resumed at epoch 2, batch 4/4")
