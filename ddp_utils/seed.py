"""Seeding that respects rank, data-loader worker and epoch.

Seeds for ranks, workers and epochs are derived through ``numpy.random.SeedSequence``,
which hashes its inputs, never by adding small integers (where rank 1's worker 0 and
rank 0's worker 1 would draw the same augmentations).
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch

from .distributed import dist_info


def init_torch_seeds(seed: int = 0, deterministic: bool = False) -> None:
    """Seed torch and set cuDNN from the seed, as YOLOv5's ``init_torch_seeds(seed)`` does.

    ``seed == 0`` makes cuDNN deterministic (slower, reproducible); any other seed
    lets cuDNN benchmark its kernels (faster). ``deterministic=True`` also turns on
    torch's deterministic algorithms, warning where an op has none. A training script
    whose ranks seed differently should use :func:`init_seeds` and :func:`set_cudnn_mode`,
    so that every rank runs cuDNN the same way.

    Examples:
        >>> init_torch_seeds(0)
        >>> a = torch.rand(2); init_torch_seeds(0); bool((a == torch.rand(2)).all())
        True
    """
    _seed_torch(seed)
    set_cudnn_mode(deterministic or seed == 0)
    if deterministic:
        _deterministic_algorithms()


def init_seeds(seed: int = 0, deterministic: bool = False) -> None:
    """Seed Python's ``random``, NumPy's global generator and torch, as YOLOv5's ``init_seeds`` does.

    The seed does not touch ``cudnn.benchmark`` (YOLOv5 leaves it alone too); ``deterministic=True``
    makes cuDNN deterministic and turns on torch's deterministic algorithms (warning where an op
    has none). So a rank-dependent seed gives every rank the same cuDNN mode.

    Examples:
        >>> init_seeds(1); a = np.random.rand(); init_seeds(1); a == np.random.rand()
        True
    """
    random.seed(seed)
    np.random.seed(seed % 2**32)
    os.environ["PYTHONHASHSEED"] = str(seed)  # for subprocesses; this one's hash seed is fixed
    _seed_torch(seed)
    if deterministic:
        torch.backends.cudnn.deterministic = True
        _deterministic_algorithms()


def set_cudnn_mode(deterministic: bool) -> None:
    """cuDNN deterministic and un-tuned (``deterministic``), or autotuned (``benchmark``) and free.

    A training script calls it with its ``--deterministic`` flag alone, on every rank, so that
    all ranks run at the same pace (a DDP job waits for its slowest rank).

    Examples:
        >>> set_cudnn_mode(False); torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic
        (True, False)
        >>> set_cudnn_mode(True); torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic
        (False, True)
    """
    torch.backends.cudnn.benchmark = not deterministic
    torch.backends.cudnn.deterministic = deterministic


def _seed_torch(seed: int) -> None:
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)


def _deterministic_algorithms() -> None:
    torch.use_deterministic_algorithms(True, warn_only=True)
    # cuBLAS needs a fixed workspace to be deterministic; it reads this at first use
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


def rank_seed(seed: int, rank: int | None = None) -> int:
    """The seed a rank uses for its own global generators: ``seed + rank``.

    Each rank then draws differently (dropout, random init of extra heads), while the
    model weights stay identical because DDP broadcasts rank 0's at wrap time.

    Examples:
        >>> rank_seed(6, 2)
        8
        >>> rank_seed(6, -1)
        6
    """
    if rank is None:
        rank = dist_info().rank
    return seed + max(rank, 0)


def derive_seed(*entropy: int) -> int:
    """A 32-bit seed hashed from integers with ``SeedSequence``; order matters.

    Examples:
        >>> derive_seed(0, 1, 2) == derive_seed(0, 1, 2) != derive_seed(0, 2, 1)
        True
    """
    return int(np.random.SeedSequence([int(e) % 2**63 for e in entropy]).generate_state(1)[0])


def worker_seed(base_seed: int, worker_id: int, rank: int = 0, epoch: int = 0) -> int:
    """The seed of one data-loader worker for one epoch on one rank.

    Examples:
        >>> seeds = {worker_seed(0, w, r, e) for w in range(2) for r in range(2) for e in range(2)}
        >>> len(seeds)
        8
    """
    return derive_seed(base_seed, max(rank, 0), epoch, worker_id)


def loader_generator(seed: int, rank: int | None = None, epoch: int = 0) -> torch.Generator:
    """A ``torch.Generator`` for a DataLoader, seeded per (seed, rank, epoch).

    The DataLoader draws its workers' base seed from this generator each time an
    iterator is made, so re-seeding it per epoch (or making a new one) gives every
    epoch fresh worker seeds; :func:`seed_worker` then mixes in the worker id.

    Examples:
        >>> g = loader_generator(0, rank=1, epoch=3)
        >>> g.initial_seed() == loader_generator(0, rank=1, epoch=3).initial_seed()
        True
    """
    if rank is None:
        rank = dist_info().rank
    generator = torch.Generator()
    generator.manual_seed(derive_seed(seed, max(rank, 0), epoch))
    return generator


def seed_worker(worker_id: int) -> None:
    """``worker_init_fn`` for DataLoader: seed ``random``, NumPy and torch in a worker.

    The DataLoader gives worker ``w`` the torch seed ``base + w``, where ``base`` comes
    from the loader's generator (see :func:`loader_generator`). This hashes the base,
    the worker id and the global rank into independent seeds for the other libraries.

    Examples:
        >>> loader = torch.utils.data.DataLoader(range(4), num_workers=0,
        ...     worker_init_fn=seed_worker, generator=loader_generator(0))
    """
    base = torch.initial_seed() - worker_id
    seed = worker_seed(base, worker_id, dist_info().rank)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
