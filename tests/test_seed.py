"""ddp_utils.seed."""

from __future__ import annotations

import random

import numpy as np
import torch

import ddp_utils as du
from ddp_utils.seed import derive_seed


def draw():
    return random.random(), float(np.random.rand()), float(torch.rand(1))


def test_same_seed_same_numbers():
    du.init_seeds(7)
    first = draw()
    du.init_seeds(7)
    assert draw() == first
    du.init_seeds(8)
    assert draw() != first


def test_cudnn_modes():
    du.init_torch_seeds(0)
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    du.init_torch_seeds(1)
    assert torch.backends.cudnn.benchmark and not torch.backends.cudnn.deterministic


def test_deterministic_algorithms():
    try:
        du.init_seeds(3, deterministic=True)
        assert torch.are_deterministic_algorithms_enabled()
    finally:
        torch.use_deterministic_algorithms(False)
        du.init_torch_seeds(0)


def test_rank_seed():
    assert [du.rank_seed(10, r) for r in (-1, 0, 1, 3)] == [10, 10, 11, 13]


def test_worker_seeds_distinct_across_rank_worker_epoch():
    seeds = [du.worker_seed(0, w, r, e) for r in range(2) for w in range(2) for e in range(2)]
    assert len(set(seeds)) == 8
    # the additive scheme would collide here: (rank 1, worker 0) vs (rank 0, worker 1)
    assert du.worker_seed(0, 0, 1) != du.worker_seed(0, 1, 0)
    assert derive_seed(1, 2) == derive_seed(1, 2)


def _worker_draws(rank: int, epoch: int, monkeypatch) -> list[float]:
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", "2")
    loader = torch.utils.data.DataLoader(
        _NumpyDraws(4),
        batch_size=1,
        num_workers=2,
        worker_init_fn=du.seed_worker,
        generator=du.loader_generator(0, rank=rank, epoch=epoch),
    )
    return [float(x) for x in loader]


class _NumpyDraws(torch.utils.data.Dataset):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return np.random.rand()


def test_real_workers_draw_differently_per_rank_worker_epoch(monkeypatch):
    draws = {(r, e): _worker_draws(r, e, monkeypatch) for r in range(2) for e in range(2)}
    # 2 workers each give 2 samples: 8 worker streams in all, all different
    streams = [tuple(v[i::2]) for v in draws.values() for i in range(2)]
    assert len(set(streams)) == 8
    assert _worker_draws(1, 1, monkeypatch) == draws[(1, 1)]  # and reproducible


def test_init_seeds_leaves_cudnn_to_the_deterministic_flag_on_every_rank():
    try:
        for rank in (-1, 0, 1, 3):  # train.py seeds each rank with rank_seed(seed, rank): 0 on rank 0
            du.set_cudnn_mode(False)
            du.init_seeds(du.rank_seed(0, rank))
            assert torch.backends.cudnn.benchmark and not torch.backends.cudnn.deterministic, rank
            du.set_cudnn_mode(True)
            du.init_seeds(du.rank_seed(5, rank))
            assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark, rank
        du.set_cudnn_mode(False)
        du.init_seeds(0, deterministic=True)  # YOLOv5's init_seeds: deterministic sets cuDNN deterministic
        assert torch.backends.cudnn.deterministic
    finally:
        torch.use_deterministic_algorithms(False)
        du.init_torch_seeds(0)


def test_autobatch_measures_with_benchmark_off_and_puts_it_back(monkeypatch):
    import importlib

    autobatch_module = importlib.import_module("ddp_utils.engine.autobatch")  # the module, not the function
    seen = []
    monkeypatch.setattr(autobatch_module, "autobatch", lambda *a, **k: seen.append(torch.backends.cudnn.benchmark) or 8)
    try:
        du.set_cudnn_mode(False)
        assert autobatch_module.check_train_batch_size(torch.nn.Conv2d(3, 4, 3), imgsz=32) == 8
        assert seen == [False] and torch.backends.cudnn.benchmark
    finally:
        du.init_torch_seeds(0)
