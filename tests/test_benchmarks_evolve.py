"""benchmarks/evolve_ranking.py: its rank correlation and its replay of train.py's median pruner (the runs it
analyses are measurements)."""

from __future__ import annotations

import pytest

from .test_benchmarks_cpu_speed import load

ranking = load("evolve_ranking")
EPOCHS = 4


def trial(number: int, curve: list[float], warmup: float = 0.0) -> dict:
    return {"trial": number, "curve": curve, "final": curve[-1], "warmup": warmup}


def test_rank_correlation_reads_order_not_values():
    assert ranking.spearman([0.1, 0.2, 0.3], [5.0, 7.0, 90.0]) == pytest.approx(1.0)
    assert ranking.spearman([0.1, 0.2, 0.3], [3.0, 2.0, 1.0]) == pytest.approx(-1.0)


def test_the_replay_cuts_what_train_py_s_pruner_cuts():
    trials = [
        trial(0, [0.5, 0.6, 0.7, 0.8]),
        trial(1, [0.4, 0.5, 0.6, 0.7]),
        trial(2, [0.3, 0.3, 0.9, 0.9]),  # below both at epoch 1: cut there, though it would end best
        trial(3, [0.1, 0.2, 0.3, 0.4], warmup=1.0),  # its first epoch is warm-up: judged from the second
        trial(4, [0.7, 0.2, 0.2, 0.2]),  # its best so far carries it past epochs 2 and 3; the last is never cut
        trial(5, [0.45, 0.55, 0.65, 0.75]),  # the median of 0.5, 0.4 and 0.7 at epoch 1 is 0.5
    ]
    replay = ranking.replay_median(trials, EPOCHS)
    assert replay["pruned_after_epoch"] == {2: 1, 3: 2, 5: 1}
    assert replay["trial_epochs"] == 4 + 4 + 1 + 2 + 4 + 1
    assert replay["best"] == 2 and not replay["best_kept"]
