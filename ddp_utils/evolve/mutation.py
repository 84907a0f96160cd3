"""YOLOv5's hyperparameter mutation, as an Optuna sampler: :class:`YOLOv5Sampler`.

The scheme YOLOv5 v7.0 runs between generations (``train.py --evolve``), restated from its behaviour:

1. Parents: the (at most) 5 fittest finished results; one of them is drawn with weights
   ``fitness - min(fitness) + 1e-6`` (the worst of the five still has a small chance).
2. Mutation: every hyperparameter is multiplied by a factor ``1 + gain * coin * normal * u * sigma``, where
   ``coin`` is 1 with probability 0.8, ``normal`` is a standard normal draw per hyperparameter and ``u`` one
   uniform draw for the whole generation (so some generations move far, some barely), sigma 0.2; each factor is
   clipped to [0.3, 3], and the draw is repeated until some factor differs from 1.
3. The result is clipped to the limits of the search space and rounded to 5 decimals (:mod:`.space`).

Here the parents are the study's finished trials (whichever worker ran them), and each trial draws from a
generator seeded by (seed, trial number), so a study replays the same way from the same history. YOLOv5 seeds
from the clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import optuna
from optuna.distributions import BaseDistribution, FloatDistribution
from optuna.trial import FrozenTrial, TrialState

from .space import Bound, constrain

PARENTS = 5  # the fittest results a parent is drawn from
MUTATION_PROBABILITY = 0.8
SIGMA = 0.2
FACTOR_LIMITS = (0.3, 3.0)


def pick_parent(values: np.ndarray, fitness: Sequence[float], rng: np.random.Generator) -> np.ndarray:
    """One parent row of ``values`` [n, k], drawn from the fittest :data:`PARENTS` by their fitness above the worst.

    Examples:
        >>> rows = np.array([[1.0], [2.0], [3.0]])
        >>> pick_parent(rows, [0.0, 0.5, 0.1], np.random.default_rng(0)).tolist()  # 0.5 and 0.1 carry the weight
        [2.0]
    """
    fitness = np.asarray(fitness, dtype=np.float64)
    order = np.argsort(-fitness, kind="stable")[:PARENTS]
    weights = fitness[order] - fitness[order].min() + 1e-6
    return values[order[rng.choice(len(order), p=weights / weights.sum())]]


def mutation_factors(gains: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The per-hyperparameter factors of one mutation; never all 1 while any gain is above 0.

    Examples:
        >>> factors = mutation_factors(np.array([1.0, 0.0, 0.3]), np.random.default_rng(1))
        >>> bool(factors[1] == 1.0), bool(((factors >= 0.3) & (factors <= 3.0)).all()), bool((factors != 1).any())
        (True, True, True)
    """
    gains = np.asarray(gains, dtype=np.float64)
    factors = np.ones(len(gains))
    while (gains > 0).any() and (factors == 1).all():
        coins = rng.random(len(gains)) < MUTATION_PROBABILITY
        step = gains * coins * rng.standard_normal(len(gains)) * rng.random() * SIGMA
        factors = (1 + step).clip(*FACTOR_LIMITS)
    return factors


def mutate(
    parents: Sequence[Mapping[str, float]],
    fitness: Sequence[float],
    space: Mapping[str, Bound],
    rng: np.random.Generator,
) -> dict[str, float]:
    """A child of ``parents`` (their evolved values, with their fitness), mutated and constrained to ``space``.

    Examples:
        >>> space = {"lr0": Bound(1.0, 1e-5, 0.1), "momentum": Bound(0.3, 0.6, 0.98)}
        >>> child = mutate([{"lr0": 0.01, "momentum": 0.9}], [0.3], space, np.random.default_rng(0))
        >>> sorted(child), all(space[k].low <= v <= space[k].high for k, v in child.items())
        (['lr0', 'momentum'], True)
    """
    names = list(space)
    rows = np.array([[float(p[k]) for k in names] for p in parents], dtype=np.float64)
    parent = pick_parent(rows, fitness, rng)
    child = parent * mutation_factors(np.array([space[k].gain for k in names]), rng)
    return constrain(dict(zip(names, child.tolist())), space)


class YOLOv5Sampler(optuna.samplers.BaseSampler):
    """YOLOv5's mutation over a study: each new trial is a mutated copy of one of the fittest finished trials.

    Trials the study holds with fixed values (the first trial, the unchanged ``--hyp``; a retried trial) keep them:
    Optuna gives fixed values precedence over any sampler's.

    Args:
        space: the evolved hyperparameters (:func:`~ddp_utils.evolve.space.search_space`).
        base: the starting values (the ``--hyp`` yaml's), the parent while no trial has finished.
        seed: with the trial number, seeds each trial's draws.

    Examples:
        >>> import optuna
        >>> optuna.logging.set_verbosity(optuna.logging.WARNING)
        >>> space = {"lr0": Bound(1.0, 1e-5, 0.1)}
        >>> study = optuna.create_study(direction="maximize", sampler=YOLOv5Sampler(space, {"lr0": 0.01}))
        >>> study.enqueue_trial({"lr0": 0.01})
        >>> study.optimize(lambda t: -abs(t.suggest_float("lr0", 1e-5, 0.1) - 0.02), n_trials=6)
        >>> study.trials[0].params, len({t.params["lr0"] for t in study.trials}) > 1
        ({'lr0': 0.01}, True)
    """

    def __init__(self, space: Mapping[str, Bound], base: Mapping[str, float], seed: int = 0) -> None:
        self.space = dict(space)
        self.base = {k: float(base[k]) for k in self.space}
        self.seed = int(seed)
        self._fallback = optuna.samplers.RandomSampler(seed=seed)

    def infer_relative_search_space(self, study: optuna.Study, trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return {k: FloatDistribution(b.low, b.high) for k, b in self.space.items()}

    def sample_relative(
        self, study: optuna.Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if not search_space:
            return {}
        done = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if t.value is not None]
        parents = [{**self.base, **{k: v for k, v in t.params.items() if k in self.space}} for t in done]
        fitness = [float(t.value) for t in done]
        if not parents:  # the first trials run while nothing has finished: mutate the starting values
            parents, fitness = [self.base], [0.0]
        rng = np.random.default_rng([self.seed, trial.number])
        child = mutate(parents, fitness, self.space, rng)
        return {k: v for k, v in child.items() if k in search_space}

    def sample_independent(
        self, study: optuna.Study, trial: FrozenTrial, param_name: str, param_distribution: BaseDistribution
    ) -> Any:
        # a name outside the space (none in train.py's use): no mutation scheme covers it
        return self._fallback.sample_independent(study, trial, param_name, param_distribution)


__all__ = ["YOLOv5Sampler", "mutate", "mutation_factors", "pick_parent"]
