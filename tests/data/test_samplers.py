"""The three samplers, each held to the guarantee its docstring states."""

from __future__ import annotations

import numpy as np
import pytest

from ddp_utils.data import EvalSampler, TrainSampler, WeightedTrainSampler
from ddp_utils.data.samplers import _ShardedSampler


@pytest.mark.parametrize("n, world, batch", [(1, 3, 2), (10, 3, 4), (11, 4, 1), (24, 2, 5)])
def test_train_shards_equal_disjoint_covering(n, world, batch):
    samplers = [TrainSampler(n, batch, r, world, shuffle=True, seed=2) for r in range(world)]
    assert len({len(s) for s in samplers}) == 1
    keys = [k for s in samplers for b in s.epoch_batches(3) for k in b]
    assert len({k.slot for k in keys}) == len(keys) == world * -(-n // world)
    assert {k.index for k in keys} == set(range(n))
    other = [k.index for s in samplers for b in s.epoch_batches(4) for k in b]
    assert n < 5 or other != [k.index for k in keys]  # a new order each epoch


@pytest.mark.parametrize("n, world", [(1, 3), (9, 2), (10, 4), (24, 3)])
def test_eval_every_image_exactly_once(n, world):
    samplers = [EvalSampler(n, 2, r, world) for r in range(world)]
    indices = [k.index for s in samplers for b in s.epoch_batches(0) for k in b]
    assert indices == list(range(n))
    assert max(map(len, samplers)) - min(map(len, samplers)) <= 1


def test_weighted_draws_only_weighted_images_in_equal_shards():
    weights = np.zeros(10)
    weights[[2, 7]] = 1.0
    samplers = [WeightedTrainSampler(10, 3, weights, r, 3, seed=1) for r in range(3)]
    assert len({len(s) for s in samplers}) == 1
    drawn = {k.index for s in samplers for b in s.epoch_batches(0) for k in b}
    assert drawn <= {2, 7}
    again = WeightedTrainSampler(10, 3, weights, 1, 3, seed=1)
    assert again.epoch_batches(0) == samplers[1].epoch_batches(0)  # a function of (seed, epoch) alone


@pytest.mark.parametrize("bad", [np.ones(3), np.zeros(10), np.full(10, np.nan), -np.ones(10)])
def test_weighted_refuses_bad_weights(bad):
    with pytest.raises(ValueError, match="image weights"):
        WeightedTrainSampler(10, 2, bad)


def test_train_and_eval_samplers_are_separate_classes():
    assert issubclass(TrainSampler, _ShardedSampler) and not issubclass(EvalSampler, TrainSampler)
