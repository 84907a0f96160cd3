"""Which images each rank gets in an epoch: one class per guarantee (detectron2's habit).

- :class:`TrainSampler`: every rank runs the same number of batches, every epoch, and the
  ranks' batches of step ``k``, concatenated in rank order, are the batch ``k`` that one
  process with the whole global batch would load (so N processes train on what one does);
  a few repeats pad the last step when it does not divide by the world size.
- :class:`WeightedTrainSampler`: as :class:`TrainSampler`, but the epoch is ``n`` draws
  with replacement by per-image weights (YOLOv5's ``--image-weights``).
- :class:`EvalSampler`: every image exactly once over all ranks, no padding; a rank may
  run one batch fewer than another.

Each gives an epoch as lists of :class:`~ddp_utils.data.dataset.SampleKey`, a pure function
of (seed, epoch, global rank, world size), so a resume or a restarted worker gives the same
epoch again. A sample's slot (its place in the epoch's global order, which seeds its
augmentation) does not depend on the world size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..seed import derive_seed
from .dataset import SampleKey


class _ShardedSampler:
    """Shared machinery: an epoch's global order cut into per-rank shards, then into batches."""

    pad = True

    def __init__(self, n: int, batch_size: int, global_rank: int = -1, world_size: int = 1, seed: int = 0) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size}: must be at least 1")
        self.n, self.batch_size = n, batch_size
        self.rank, self.world_size = max(global_rank, 0), max(world_size, 1)
        self.seed, self.epoch = seed, 0
        self.shuffle = False

    @property
    def global_rank(self) -> int:
        return self.rank

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next pass over the loader gives."""
        self.epoch = int(epoch)

    def order(self, epoch: int) -> np.ndarray:
        """The epoch's global order of image indices (before sharding)."""
        return np.arange(self.n)

    def _shard_bounds(self) -> list[tuple[int, int]]:
        sizes = [len(a) for a in np.array_split(np.arange(self.n), self.world_size)]
        starts = np.concatenate([[0], np.cumsum(sizes)])
        return [(int(starts[r]), int(starts[r + 1])) for r in range(self.world_size)]

    def _batch_slots(self) -> list[list[range]]:
        """Per rank, its batches as ranges of slots (positions in the global order, padded past ``n``)."""
        if not self.pad:  # contiguous, unpadded shards
            return [
                [range(s, min(s + self.batch_size, end)) for s in range(start, end, self.batch_size)]
                for start, end in self._shard_bounds()
            ]
        # global step k takes the next batch_size * world_size slots; rank r its r-th equal part.
        # The last step is padded to a multiple of the world size (slots n, n+1, ... repeat the order's first).
        total = math.ceil(self.n / self.world_size) * self.world_size
        step = self.batch_size * self.world_size
        slots: list[list[range]] = [[] for _ in range(self.world_size)]
        for start in range(0, total, step):
            share = (min(start + step, total) - start) // self.world_size
            for r in range(self.world_size):
                slots[r].append(range(start + r * share, start + (r + 1) * share))
        return slots

    def rect_batches(self) -> list[list[int]]:
        """Every rank's batches of image indices without shuffling, numbered as :meth:`epoch_batches` numbers them."""
        return [[s % self.n for s in self._batch_slots()[r][j]] for r, j in self._batch_ids()]

    def _batch_ids(self) -> list[tuple[int, int]]:
        """(rank, j) of every batch in batch-id order: step-major for training, rank-major for evaluation."""
        per_rank = [len(b) for b in self._batch_slots()]
        if self.pad:
            return [(r, j) for j in range(per_rank[0]) for r in range(self.world_size)]
        return [(r, j) for r in range(self.world_size) for j in range(per_rank[r])]

    def epoch_batches(self, epoch: int) -> list[list[SampleKey]]:
        """This rank's batches of one epoch."""
        order = self.order(epoch)
        ids = {rank_j: b for b, rank_j in enumerate(self._batch_ids())}
        return [
            [SampleKey(epoch, s, int(order[s % self.n]), ids[(self.rank, j)]) for s in b]
            for j, b in enumerate(self._batch_slots()[self.rank])
        ]

    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        return len(self._batch_slots()[self.rank])


class TrainSampler(_ShardedSampler):
    """Training: equal, disjoint, covering shards, so every rank runs the same number of batches.

    Guarantee: for any ``n`` and world size, every rank gets ``ceil(n / world_size)`` slots
    in the same number of batches (so no rank waits at a collective the others never reach);
    the slots are disjoint and cover every image, the shortfall filled with the order's
    first images (at most ``world_size - 1`` repeats). Step ``k`` of every rank together is
    the global batch ``k``: slots ``k * batch_size * world_size`` onwards, rank ``r`` taking the
    ``r``-th equal part, so the ranks' batches concatenated in rank order are what one process
    with ``batch_size * world_size`` images per batch loads at step ``k``, whatever the world
    size. Only the last step can differ: when its images do not divide by the world size it is
    padded with repeats (it then holds up to ``world_size - 1`` images more than one process's).
    The order is a permutation seeded by (seed, epoch) when shuffling, else ``0..n-1``.

    Args:
        n: images in the dataset.
        batch_size: per-rank batch size.
        global_rank: this process's rank in the job (-1 or 0 for a single process).
        world_size: processes in the job.
        shuffle: a new permutation every epoch.
        seed: seeds the permutations.

    Examples:
        >>> s = TrainSampler(10, batch_size=4, global_rank=1, world_size=2)
        >>> [[k.index for k in b] for b in s.epoch_batches(0)]  # rank 0 gets [0, 1, 2, 3], [8]
        [[4, 5, 6, 7], [9]]
    """

    def __init__(
        self,
        n: int,
        batch_size: int,
        global_rank: int = -1,
        world_size: int = 1,
        shuffle: bool = False,
        seed: int = 0,
    ) -> None:
        super().__init__(n, batch_size, global_rank, world_size, seed)
        self.shuffle = shuffle

    def order(self, epoch: int) -> np.ndarray:
        if self.shuffle:
            return np.random.default_rng(derive_seed(self.seed, epoch)).permutation(self.n)
        return np.arange(self.n)


class WeightedTrainSampler(TrainSampler):
    """Training by image weights: each epoch is ``n`` draws with replacement, ``p ~ weights``.

    Guarantee: the shards as :class:`TrainSampler`'s (equal length on every rank); the draws
    are a function of (seed, epoch) alone, so every rank computes the same global draw and
    takes its own disjoint part of it. Weights can change between epochs
    (:meth:`set_weights`); they apply from the next epoch the loader starts.

    Args:
        n: images in the dataset.
        batch_size: per-rank batch size.
        weights: [n] finite non-negative weights with a positive sum; None: all equal.
        global_rank: this process's rank in the job.
        world_size: processes in the job.
        seed: seeds the draws.
    """

    def __init__(
        self,
        n: int,
        batch_size: int,
        weights: Sequence[float] | np.ndarray | None = None,
        global_rank: int = -1,
        world_size: int = 1,
        seed: int = 0,
    ) -> None:
        super().__init__(n, batch_size, global_rank, world_size, shuffle=True, seed=seed)
        self.weights = np.ones(n) if weights is None else self._checked(weights)

    def _checked(self, weights: Sequence[float] | np.ndarray) -> np.ndarray:
        weights = np.asarray(weights, dtype=np.float64)
        if weights.shape != (self.n,) or not np.isfinite(weights).all() or (weights < 0).any() or weights.sum() <= 0:
            raise ValueError(f"image weights: need {self.n} finite non-negative values with a positive sum")
        return weights

    def set_weights(self, weights: Sequence[float] | np.ndarray) -> None:
        """Draw the next epochs by these weights."""
        self.weights = self._checked(weights)

    def order(self, epoch: int) -> np.ndarray:
        rng = np.random.default_rng(derive_seed(self.seed, epoch, 1))
        return rng.choice(self.n, size=self.n, replace=True, p=self.weights / self.weights.sum())


class EvalSampler(_ShardedSampler):
    """Evaluation: every image exactly once over all ranks.

    Guarantee: contiguous, unpadded shards of ``0..n-1`` whose sizes differ by at most one
    image, so gathering every rank's results gives each image once, in order of rank. A rank
    may run one batch fewer than another (or none when there are fewer images than ranks):
    collectives after evaluation must not count batches.

    Args:
        n: images in the dataset.
        batch_size: per-rank batch size.
        global_rank: this process's rank in the job.
        world_size: processes in the job.

    Examples:
        >>> [len(EvalSampler(9, 2, r, 2)) for r in range(2)]
        [3, 2]
    """

    pad = False

    def __init__(self, n: int, batch_size: int, global_rank: int = -1, world_size: int = 1, seed: int = 0) -> None:
        super().__init__(n, batch_size, global_rank, world_size, seed)


__all__ = ["EvalSampler", "TrainSampler", "WeightedTrainSampler"]
