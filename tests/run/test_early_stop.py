"""EarlyStopping: when it stops, that it says why once, and patience 0 / None."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from ddp_utils.run import EarlyStopping


def run(stopper, fitnesses):
    return [stopper(epoch, fitness) for epoch, fitness in enumerate(fitnesses)]


def test_stops_after_patience_epochs_without_improvement():
    stopper = EarlyStopping(patience=3)
    decisions = run(stopper, [0.1, 0.2, 0.5, 0.4, 0.45, 0.49, 0.3])
    assert decisions == [False, False, False, False, False, True, True]
    assert (stopper.best_epoch, stopper.best_fitness) == (2, 0.5)


def test_improvement_resets_the_count_and_ties_count_as_improvement():
    stopper = EarlyStopping(patience=2)
    assert run(stopper, [0.5, 0.4, 0.5, 0.4, 0.6, 0.1]) == [False] * 6
    assert stopper.best_epoch == 4


@pytest.mark.parametrize("patience", [0, None])
def test_zero_or_none_never_stops(patience):
    assert not any(run(EarlyStopping(patience), [1.0] + [0.0] * 200))


def test_none_fitness_changes_nothing():
    stopper = EarlyStopping(patience=2)
    assert run(stopper, [None, 0.3, None, None]) == [False, False, False, True]
    assert stopper.best_epoch == 1


def test_logs_the_reason_once(caplog):
    stopper = EarlyStopping(patience=1)
    with caplog.at_level(logging.INFO, logger="ddp_utils"):
        run(stopper, [0.9, 0.1, 0.1, 0.1])
    lines = [r.getMessage() for r in caplog.records if "Stopping early" in r.getMessage()]
    assert len(lines) == 1
    assert "1 epochs" in lines[0] and "epoch 0" in lines[0] and "0.9" in lines[0]


def test_negative_patience_is_refused():
    with pytest.raises(ValueError, match="patience=-1"):
        EarlyStopping(-1)


def test_possible_stop_says_the_next_epoch_may_stop():
    stopper = EarlyStopping(patience=3)
    seen = []
    for epoch, fit in enumerate([0.5, 0.4, 0.4, 0.4, 0.4]):
        stop = stopper(epoch, fit)
        seen.append((stopper.possible_stop, stop))
    # best at epoch 0: epoch 2 is 2 = patience - 1 epochs without improvement, so epoch 3 may stop, and does
    assert seen == [(False, False), (False, False), (True, False), (True, True), (True, True)]
    stopper(5, 0.9)  # an improvement: no stop in sight
    assert stopper.possible_stop is False


@pytest.mark.parametrize("patience", [0, None])
def test_possible_stop_never_without_patience(patience):
    stopper = EarlyStopping(patience=patience)
    for epoch in range(50):
        assert stopper(epoch, 0.0 if epoch else 1.0) is False and stopper.possible_stop is False


def test_yolov5s_keyword_call_with_its_one_element_array():
    stopper = EarlyStopping(patience=1)
    assert stopper(epoch=0, fitness=np.array([0.3])) is False
    assert stopper(epoch=1, fitness=np.array([0.2])) is True
    assert stopper.best_fitness == 0.3 and isinstance(stopper.best_fitness, float)
    with pytest.raises(ValueError, match="one number"):
        stopper(epoch=2, fitness=np.array([0.1, 0.2]))
