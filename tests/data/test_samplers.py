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


@pytest.mark.parametrize("n, world, batch", [(64, 2, 8), (64, 4, 4), (30, 2, 4), (29, 3, 2), (5, 4, 3)])
def test_ranks_together_load_what_one_process_loads(n, world, batch):
    """Step k of all ranks, concatenated in rank order, is one process's step k with the global batch."""
    one = TrainSampler(n, batch * world, shuffle=True, seed=7).epoch_batches(2)
    ranks = [TrainSampler(n, batch, r, world, shuffle=True, seed=7).epoch_batches(2) for r in range(world)]
    assert all(len(r) == len(one) for r in ranks)
    for k, want in enumerate(one):
        got = [key for r in ranks for key in r[k]]
        assert len({len(r[k]) for r in ranks}) == 1  # equal parts: the same per-rank batch size
        if k < len(one) - 1 or len(want) % world == 0:
            assert [(g.slot, g.index) for g in got] == [(w.slot, w.index) for w in want]
        else:  # the last step, padded to a multiple of the world size with the order's first images
            assert [(g.slot, g.index) for g in got][: len(want)] == [(w.slot, w.index) for w in want]
            pad = got[len(want) :]
            assert 0 < len(pad) < world and [k.index for k in pad] == [k.index for k in one[0][: len(pad)]]
