"""benchmarks/evolve/evolve_ranking.py: its rank correlation and its replay of train.py's median pruner (the runs it
analyses are measurements); benchmarks/evolve/evolve_odds.py: its odds against cases worked out by hand."""

from __future__ import annotations

import pytest

from ddp_utils.hyp import load_hyp

from .benchmark_scripts import load_benchmark

ranking = load_benchmark("evolve_ranking")
odds = load_benchmark("evolve_odds")
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


def test_the_odds_where_the_budget_holds_only_the_start_are_the_start_s_chance_to_be_best():
    # T = 3: a third of 3 x E is E, the start's own training; ours meets the goal only if the start is the serial best
    assert odds.goal_odds(3, 10, 2, samples=40_000) == pytest.approx(1 / 3, abs=0.01)
    # T = 2: the start alone spends more than a third of the budget
    assert odds.goal_odds(2, 10, 2, samples=1_000) == 0.0


def test_the_odds_of_a_case_worked_out_by_hand():
    # T = 6, E = 3, a cut after 1 epoch, budget 6: after the start (3), the first new trial either completes as the
    # best so far (6) or is cut (4), after which no record fits. Met if the start is the best of the serial six (1/6)
    # or the first new trial is the best of all seven (1/7), less both (1/42): 2/7
    assert odds.goal_odds(6, 3, 1, samples=100_000) == pytest.approx(2 / 7, abs=0.006)


def test_the_odds_grow_with_cheaper_cuts_and_more_trials_and_refuse_nonsense():
    assert odds.goal_odds(12, 10, 1) > odds.goal_odds(12, 10, 2) > odds.goal_odds(12, 10, 5)
    assert odds.goal_odds(30, 10, 2) > odds.goal_odds(12, 10, 2)
    with pytest.raises(ValueError, match="judged_after"):
        odds.goal_odds(12, 10, 10)


def test_the_replay_waits_for_the_warm_up_as_train_py_has_it(tmp_path):
    shapes = load_hyp("hyp.shapes.yaml")
    assert shapes["warmup_epochs"] == 1.0 and shapes["warmup_min_iters"] == 20
    yolov5 = {k: v for k, v in shapes.items() if k != "warmup_min_iters"}  # YOLOv5's: 100, train.py's default
    assert ranking.warmup_epochs(shapes, 32) == 1.0
    assert ranking.warmup_epochs(yolov5 | {"warmup_epochs": 3.0}, 8) == 12.5  # 100 iterations of coco128's 8 batches
    assert ranking.warmup_epochs(shapes | {"warmup_epochs": 0.0}, 8) == 0.0
    (tmp_path / "images" / "train").mkdir(parents=True)
    (tmp_path / "images" / "val").mkdir()
    for i in range(33):
        (tmp_path / "images" / "train" / f"{i}.jpg").touch()
    (tmp_path / "notes.txt").touch()
    data = tmp_path / "data.yaml"
    data.write_text(f"path: {tmp_path}\ntrain: images/train\nval: images/val\nnames: {{0: a}}\n")
    assert ranking.batches(str(data), 16) == 3  # 33 images: two full batches and one of 1
