"""--multi-scale: the size of a step follows from (seed, epoch, step), the same on every rank."""

from __future__ import annotations

import math
import random

import numpy as np
import torch

from ddp_utils.data.multiscale import multi_scale_resize, multi_scale_size


def test_size_is_a_function_of_seed_epoch_and_step_not_of_a_random_state():
    first = []
    for rank_seed in (0, 1):  # what train.py seeds per rank must not matter
        random.seed(rank_seed), np.random.seed(rank_seed), torch.manual_seed(rank_seed)
        first.append([multi_scale_size(128, 32, seed=3, epoch=e, step=k) for e in range(2) for k in range(20)])
    assert first[0] == first[1]
    assert set(first[0]) <= set(range(64, 193, 32)) and len(set(first[0])) > 2
    others = [multi_scale_size(128, 32, seed=4, epoch=e, step=k) for e in range(2) for k in range(20)]
    assert others != first[0]  # the seed matters
    assert [multi_scale_size(128, 32, 3, 1, k) for k in range(20)] != first[0][:20]  # and the epoch


def test_resize_to_the_drawn_size_on_the_grid():
    imgs = torch.rand(2, 3, 64, 96)
    for k in range(10):
        size = multi_scale_size(96, 32, 0, 0, k)
        out = multi_scale_resize(imgs, 96, 32, 0, 0, k)
        assert out.shape[-1] == size and out.shape[-2] % 32 == 0
        assert out.shape[-2] == math.ceil(64 * (size / 96) / 32) * 32
