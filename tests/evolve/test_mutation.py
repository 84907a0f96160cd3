"""YOLOv5's mutation: the parents it draws from, the factors it multiplies by, the sampler over a study."""

from __future__ import annotations

import numpy as np
import optuna
import pytest

from ddp_utils.evolve import mutation as mutation_module
from ddp_utils.evolve.mutation import (
    FACTOR_LIMITS,
    MUTATION_PROBABILITY,
    SIGMA,
    YOLOv5Sampler,
    mutate,
    mutation_factors,
    pick_parent,
)
from ddp_utils.evolve.space import Bound

optuna.logging.set_verbosity(optuna.logging.WARNING)


def test_factors_move_about_eighty_percent_of_hyperparameters_within_the_limits():
    rng = np.random.default_rng(0)
    gains = np.ones(30)
    factors = np.stack([mutation_factors(gains, rng) for _ in range(2000)])
    moved = (factors != 1).mean()
    assert moved == pytest.approx(MUTATION_PROBABILITY, abs=0.02)  # the coin per hyperparameter
    assert factors.min() >= FACTOR_LIMITS[0] and factors.max() <= FACTOR_LIMITS[1]
    assert np.median(factors) == pytest.approx(1.0, abs=0.01)  # as likely up as down
    # one uniform draw scales a whole generation: some move far, some barely (sigma 0.2 at most)
    spread = np.abs(np.log(factors)).mean(1)
    assert spread.min() < 0.01 and spread.max() > 0.1


def test_a_gain_scales_the_step_and_gain_zero_never_moves():
    rng = np.random.default_rng(1)
    factors = np.stack([mutation_factors(np.array([1.0, 0.3, 0.0]), rng) for _ in range(3000)])
    assert (factors[:, 2] == 1).all()
    steps = np.abs(factors - 1).mean(0)
    assert steps[1] == pytest.approx(0.3 * steps[0], rel=0.15)


def test_a_mutation_always_changes_something():
    rng = np.random.default_rng(2)
    assert all((mutation_factors(np.array([1.0]), rng) != 1).any() for _ in range(500))


def test_parents_are_the_five_fittest_drawn_by_fitness_above_the_worst_of_them():
    rows = np.arange(7, dtype=float).reshape(7, 1)
    fitness = [0.9, 0.1, 0.5, 0.2, 0.0, 0.3, 0.05]  # top five: rows 0, 2, 5, 3, 1
    rng = np.random.default_rng(3)
    drawn = np.array([pick_parent(rows, fitness, rng)[0] for _ in range(4000)])
    counts = {int(i): int((drawn == i).sum()) for i in range(7)}
    assert counts[4] == counts[6] == 0  # outside the five
    assert counts[1] < 5  # the worst of the five: weight 1e-6
    weights = np.array([0.9, 0.5, 0.3, 0.2]) - 0.1
    expected = weights / weights.sum() * 4000
    assert [counts[i] for i in (0, 2, 5, 3)] == pytest.approx(expected, rel=0.1)


def test_a_child_is_its_parent_times_the_factors_held_to_the_limits():
    space = {"lr0": Bound(1.0, 1e-5, 0.1), "mosaic": Bound(1.0, 0.0, 1.0)}
    children = [mutate([{"lr0": 0.09, "mosaic": 1.0}], [0.5], space, np.random.default_rng(s)) for s in range(200)]
    assert all(1e-5 <= c["lr0"] <= 0.1 and 0 <= c["mosaic"] <= 1 for c in children)
    assert any(c["lr0"] == 0.1 for c in children) and any(c["lr0"] < 0.09 for c in children)
    assert all(round(c["lr0"], 5) == c["lr0"] for c in children)


def _study(seed: int, history: list[tuple[float, float]]) -> optuna.Study:
    space = {"lr0": Bound(1.0, 1e-5, 0.1), "mosaic": Bound(1.0, 0.0, 1.0)}
    study = optuna.create_study(direction="maximize", sampler=YOLOv5Sampler(space, {"lr0": 0.01, "mosaic": 1.0}, seed))
    dists = {k: optuna.distributions.FloatDistribution(b.low, b.high) for k, b in space.items()}
    for lr0, value in history:
        study.add_trial(optuna.create_trial(params={"lr0": lr0, "mosaic": 0.5}, distributions=dists, value=value))
    return study


def test_the_sampler_mutates_the_studys_fittest_trials_and_replays_from_the_same_history():
    history = [(0.001, 0.1), (0.05, 0.9), (0.002, 0.2)]
    drawn = []
    for _ in range(2):
        trial = _study(7, history).ask()
        drawn.append((trial.suggest_float("lr0", 1e-5, 0.1), trial.suggest_float("mosaic", 0.0, 1.0)))
    assert drawn[0] == drawn[1]  # seeded by (seed, trial number): the same history, the same child
    children = []
    for seed in range(60):
        trial = _study(seed, history).ask()
        children.append(trial.suggest_float("lr0", 1e-5, 0.1))
    # mostly children of the fittest (lr0 0.05): weights 0.8, 0.1 and 1e-6 above the worst of the three
    assert np.mean([c > 0.015 for c in children]) > 0.7


def test_with_nothing_finished_the_sampler_mutates_the_starting_values_exactly_as_seeded():
    """Trial 0 of seed 0 draws from default_rng([0, 0]): the parent (the starting values, the only one), then
    coins [True, True], normals [0.1049, -0.5357] and u 0.9128, so factors 1 + normal * u * 0.2 = [1.01915,
    0.90221]: lr0 0.01 -> 0.01019 and mosaic 1.0 -> 0.90221, rounded to 5 decimals."""
    rng = np.random.default_rng([0, 0])
    rng.choice(1, p=[1.0])  # the parent draw
    coins, normals, u = rng.random(2) < MUTATION_PROBABILITY, rng.standard_normal(2), rng.random()
    factors = 1 + coins * normals * u * SIGMA
    assert factors.round(5).tolist() == [1.01915, 0.90221]
    trial = _study(0, []).ask()
    assert trial.suggest_float("lr0", 1e-5, 0.1) == 0.01019 == round(0.01 * factors[0], 5)
    assert trial.suggest_float("mosaic", 0.0, 1.0) == 0.90221 == round(1.0 * factors[1], 5)


def lr0_steps(trials: int) -> np.ndarray:
    """lr0's relative step (child / 0.01 - 1) of the first trial of ``trials`` studies (seeds 0...), none done."""
    return np.array([_study(seed, []).ask().suggest_float("lr0", 1e-5, 0.1) / 0.01 - 1 for seed in range(trials)])


def steps_match_sigma(steps: np.ndarray, sigma: float) -> bool:
    """Whether the steps' spread is YOLOv5's for ``sigma``: a step is coin x N(0, 1) x u x sigma (u uniform), drawn
    again when no coin of the two hyperparameters came up, so E[step^2] = P(coin | any) x sigma^2 / 3, with
    P(coin | any) = 0.8 / (1 - 0.2^2); within 10% (2000 draws: about 4 standard errors)."""
    moved = MUTATION_PROBABILITY / (1 - (1 - MUTATION_PROBABILITY) ** 2)
    return abs(np.sqrt(np.mean(steps**2)) / (sigma * np.sqrt(moved / 3)) - 1) < 0.1


def test_the_samplers_steps_have_yolov5s_spread_and_a_wrong_sigma_would_fail(monkeypatch):
    steps = lr0_steps(2000)
    assert steps_match_sigma(steps, 0.2)  # YOLOv5's sigma
    assert np.mean(steps != 0) == pytest.approx(0.8 / 0.96, abs=0.03)  # the coin, given that something moved
    assert np.median(steps) == pytest.approx(0.0, abs=0.01)  # as likely up as down
    for wrong in (0.15, 0.25):  # positive control: the sampler with another sigma fails the check
        monkeypatch.setattr(mutation_module, "SIGMA", wrong)
        assert not steps_match_sigma(lr0_steps(2000), 0.2), wrong
