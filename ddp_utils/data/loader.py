"""create_dataloader: the dataset built once per node, sharded per rank, fed by workers that stay.

Three small pieces:

- a sampler (``samplers.py``) decides an epoch: which images, in which order, in which
  batches, for this rank. Its output is a pure function of (seed, epoch, global rank, world size).
- :class:`EpochLoader` keeps ONE DataLoader iterator over an endless stream of epochs,
  so workers are started once, not every epoch, and prefetch across epoch boundaries.
- The samples carry their epoch (:class:`~ddp_utils.data.dataset.SampleKey`), so a batch
  the workers prefetched for epoch ``e + 1`` is already epoch ``e + 1``'s: when
  ``set_epoch`` asks for the epoch the stream holds next, nothing is restarted; when it
  asks for another (a resume, a skipped epoch, an epoch left half-way), the stream is
  restarted at that epoch. Either way epoch ``e`` gives epoch ``e``'s order and augmentation.
- ``set_epoch(e, start_batch=k)`` begins epoch ``e`` at its batch ``k``: a run resumed in the
  middle of an epoch loads exactly the batches it had not trained, the same ones (global batch
  ``k`` onwards) whatever the number of processes it resumes with.
"""

from __future__ import annotations

import atexit
import itertools
import time
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from ..distributed import dist_info, get_rank, get_world_size, is_dist_initialized, torch_distributed_zero_first
from ..host import disk_free, memory_room
from ..log import LOGGER
from ..seed import loader_generator
from .dataset import SampleKey, YoloDataset
from .device.recipes import RecipeCollate
from .labels import find_images, label_cache_path, load_labels
from .samplers import EvalSampler, TrainSampler, WeightedTrainSampler
from .transfer import BatchPool, BatchRequest, PooledCollate, PooledDataset, unpack
from .workers import default_workers, init_worker, usable_cores

Sampler = TrainSampler | WeightedTrainSampler | EvalSampler


class _EpochStream:
    """``batch_sampler`` for the DataLoader: epochs ``start, start + 1, ...`` back to back, forever.

    The first epoch begins at its batch ``first_batch`` (a run resumed mid-epoch); the next ones
    at their first. With a ``pool``, each batch is asked for together with a free slot of it.
    """

    def __init__(self, sampler: Sampler, start: int, pool: BatchPool | None, first_batch: int = 0) -> None:
        self.sampler, self.start, self.pool, self.first_batch = sampler, start, pool, first_batch

    def __iter__(self) -> Iterator[list[SampleKey]]:
        for epoch in itertools.count(self.start):
            skip = self.first_batch if epoch == self.start else 0
            for keys in self.sampler.epoch_batches(epoch)[skip:]:
                yield keys if self.pool is None else BatchRequest(keys, self.pool.acquire())

    def __len__(self) -> int:
        return len(self.sampler)


_RUNNING: weakref.WeakSet[EpochLoader] = weakref.WeakSet()  # loaders whose workers may be alive


@atexit.register
def _stop_running_loaders() -> None:
    # Before multiprocessing's own exit handler (registered earlier, so run later), which
    # would SIGTERM the workers and make torch report each as "killed by signal".
    for loader in list(_RUNNING):
        loader.close()


class EpochLoader:
    """A loader whose workers live across epochs; ``set_epoch(e)`` always gives epoch ``e``.

    ``len(loader)`` is the number of batches of one epoch on this rank; iterating yields
    them (from :attr:`start_batch` on), and the epoch then advances by itself (call ``set_epoch``
    anyway: it is free when the epoch is the expected one, and makes a resume or a skip correct).

    With workers, batches come back through a shared-memory :class:`BatchPool` made by
    ``pool_factory`` (default: sized for the dataset's largest batch; it may give None,
    then batches travel torch's usual way). Each start of the workers builds a fresh
    DataLoader around the pool, its batch stream and its collate function, all three
    handed the pool when they are made.

    Args:
        dataset: the dataset.
        sampler: decides each epoch's batches for this rank (``samplers.py``).
        collate_fn: the dataset's collate function.
        num_workers: worker processes (0: load in this process).
        pin_memory: copy batches into pinned memory.
        seed: seeds torch's generator of the loader (and through it the workers).
        global_rank: this process's rank in the job (-1 single process).
        pool_factory: ``(dataset, batch_size, num_workers, prefetch) -> BatchPool | None``.
    """

    prefetch_factor = 2  # batches in flight per worker (the DataLoader's default)

    def __init__(
        self,
        dataset: YoloDataset,
        sampler: Sampler,
        collate_fn,
        num_workers: int = 0,
        pin_memory: bool = False,
        seed: int = 0,
        global_rank: int = -1,
        pool_factory=None,
    ) -> None:
        self.dataset, self.sampler, self.collate_fn = dataset, sampler, collate_fn
        self._plain_sampler = sampler  # what set_image_weights(None) goes back to
        self.batch_size = sampler.batch_size
        self.num_workers, self.pin_memory = num_workers, pin_memory
        self.seed, self.global_rank = seed, global_rank
        self._pool_factory = pool_factory or _batch_pool
        self._pool: BatchPool | None = None
        self._loader: DataLoader | None = None
        self._iterator: Iterator | None = None
        self._position: tuple[int, int] | None = None  # (epoch, batches taken) of the running stream
        self.start_batch = 0  # where the next pass begins in its epoch (set_epoch's start_batch)
        self._stale = False
        self._indices_version = getattr(dataset, "indices_version", 0)

    def __len__(self) -> int:
        return len(self.sampler)

    @property
    def sends_recipes(self) -> bool:
        """Whether the batches carry recipes for the device to render (``augment_on="device"``), not images."""
        return bool(getattr(self.dataset, "recipes", False))

    def set_epoch(self, epoch: int, start_batch: int = 0) -> None:
        """Make the next pass over the loader epoch ``epoch`` (its order and augmentation), from batch ``start_batch``.

        Raises:
            ValueError: ``start_batch`` is not in ``[0, len(self)]``.
        """
        if not 0 <= start_batch <= len(self):
            raise ValueError(f"start_batch={start_batch}: an epoch has {len(self)} batches on this rank")
        self.sampler.set_epoch(epoch)
        self.start_batch = int(start_batch)

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def set_image_weights(self, weights: Sequence[float] | np.ndarray | None) -> None:
        """Draw the next epochs' images with these per-image weights (None: back to the plain order).

        Switches between a :class:`TrainSampler` and a :class:`WeightedTrainSampler` with the
        same shards, batch size, seed and epoch.
        """
        plain, epoch = self._plain_sampler, self.sampler.epoch
        if isinstance(plain, EvalSampler):
            raise ValueError("image weights: an evaluation loader sees every image exactly once")
        if weights is None:
            self.sampler = plain
        else:
            self.sampler = WeightedTrainSampler(
                plain.n, plain.batch_size, weights, plain.global_rank, plain.world_size, plain.seed
            )
        self.sampler.set_epoch(epoch)
        self._stale = True  # the workers may hold batches drawn with the old weights

    def _restart(self, epoch: int, first_batch: int = 0) -> None:
        self._iterator = None  # shuts the old workers down
        if self.num_workers > 0:
            if self._pool is None:
                self._pool = self._pool_factory(self.dataset, self.batch_size, self.num_workers, self.prefetch_factor)
            else:
                self._pool.release_all()  # no worker is left to write into a slot
        self._loader = self._make_loader(epoch, first_batch)
        self._iterator = iter(self._loader)
        _RUNNING.add(self)
        self._position = (epoch, first_batch)
        self._stale = False
        self._indices_version = getattr(self.dataset, "indices_version", 0)

    def _make_loader(self, epoch: int, first_batch: int = 0) -> DataLoader:
        # a new DataLoader per start of the workers, each part made with the pool it uses
        pooled = self.num_workers > 0
        return DataLoader(
            PooledDataset(self.dataset) if pooled else self.dataset,
            batch_sampler=_EpochStream(self.sampler, epoch, self._pool, first_batch),
            num_workers=self.num_workers,
            collate_fn=PooledCollate(self.collate_fn, self._pool) if pooled else self.collate_fn,
            pin_memory=self.pin_memory,
            worker_init_fn=init_worker,
            generator=loader_generator(self.seed, self.global_rank),
            prefetch_factor=self.prefetch_factor if pooled else None,
        )

    def __iter__(self) -> Iterator[tuple]:
        epoch, total, first = self.sampler.epoch, len(self), self.start_batch
        self.start_batch = 0  # the epochs after this one begin at their first batch
        if first >= total:
            self.sampler.epoch = epoch + 1
            return
        changed = getattr(self.dataset, "indices_version", 0) != self._indices_version  # dataset.indices assigned
        if self._iterator is None or self._stale or changed or self._position != (epoch, first):
            self._restart(epoch, first)
        for k in range(first, total):
            try:
                batch = unpack(next(self._iterator), self._pool, self.pin_memory)
            except (EOFError, ConnectionError) as exc:
                raise RuntimeError(self._worker_death(exc)) from exc
            except BaseException:
                self.close()  # stop the workers: a broken iterator must not serve the next epoch
                raise
            self._position = (epoch, k + 1)
            yield batch
        self._position = (epoch + 1, 0)
        self.sampler.epoch = epoch + 1

    def _worker_death(self, exc: BaseException) -> str:
        # A worker killed mid-send (the OOM killer, a SIGKILL) leaves a truncated message that
        # torch reports as a bare EOFError when it reads it before it notices the death.
        workers = getattr(self._iterator, "_workers", [])
        deadline = time.monotonic() + 2.0  # the broken pipe can reach us before the death is reapable
        while not (dead := [w for w in workers if not w.is_alive()]) and time.monotonic() < deadline:
            time.sleep(0.02)
        dead = [f"pid {w.pid} (exit code {w.exitcode})" for w in dead]
        self.close()
        who = ", ".join(dead) if dead else "a worker"
        return (
            f"DataLoader worker died while sending a batch: {who} ({type(exc).__name__}: {exc}); "
            "a worker killed by the OOM killer is the usual cause: try fewer workers or a smaller batch"
        )

    def close(self) -> None:
        """Stop the workers now (they also stop when the loader is garbage collected)."""
        self._iterator = None
        self._loader = None
        self._position = None
        self._pool = None  # and free the shared memory; a next epoch makes it again


def _batch_pool(dataset: YoloDataset, batch_size: int, num_workers: int, prefetch: int) -> BatchPool | None:
    """Shared memory for the batches in flight, sized for the largest batch (never more images than the dataset
    has: ``--batch-size 100000`` on 32 images makes batches of 32); None when there is none to spare (the host's
    memory, ``ulimit -v``, /dev/shm) or no images to carry (a dataset that sends recipes)."""
    if getattr(dataset, "recipes", False):
        return None
    if dataset.rect:
        pixels = int(np.prod(dataset.batch_shapes, axis=1).max())
    else:
        pixels = dataset.imgsz**2  # mosaics and letterboxed images (a quad batch has as many pixels)
    # in flight: the DataLoader's prefetch per worker, the batch being copied out, one spare
    slots, slot_bytes = prefetch * num_workers + 2, 3 * pixels * min(batch_size, max(len(dataset), 1))
    need = slots * slot_bytes
    room = memory_room()
    try:
        # tmpfs does not reserve on ftruncate: filling a full /dev/shm would be a SIGBUS, not an error
        free = disk_free("/dev/shm")  # where torch's shared memory lives on Linux
        if free < 2 * need or (room is not None and room[0] < 2 * need):  # a container's 64 MB default: leave it
            LOGGER.debug(  # to torch's own batches
                f"no shared batch pool: {need / 2**20:.0f} MiB wanted, /dev/shm has {free / 2**20:.0f} MiB free"
                + (f", this process can take {room[0] / 2**20:.0f} MiB more ({room[1]})" if room else "")
            )
            return None
        return BatchPool(slots, slot_bytes)
    except (RuntimeError, OSError) as exc:
        LOGGER.debug(f"no shared batch pool ({slots} x {slot_bytes / 2**20:.0f} MiB): {exc}")
        return None


def _workers(workers: int | None, batch_size: int, prefix: str = "") -> int:
    """The workers of each process (:func:`~ddp_utils.data.workers.default_workers`), said in the log."""
    local, cores = max(dist_info().local_world_size, 1), usable_cores()
    n = default_workers(local, workers, batch_size, cores)
    cap = "no cap" if workers is None else f"cap workers={workers}"
    LOGGER.info(f"{prefix}{n} dataloader workers per process ({cores} cores, {local} local process(es), {cap})")
    return n


def _build(  # noqa: PLR0913 (the two public builders' arguments, passed on)
    path,
    imgsz: int,
    batch_size: int,
    stride: int,
    rank: int,
    workers: int | None,
    prefix: str,
    *,
    collate,
    evaluate: bool,
    shuffle: bool,
    seed: int,
    augment_on: str = "workers",
    **dataset_kwargs,
) -> tuple[EpochLoader, YoloDataset]:
    """The dataset (built once per node) and its loader, sharded over the process group.

    Training gets padded shards (every rank the same number of batches), evaluation exact ones.
    """
    # Inside zero_first: the node's first process scans the labels and writes the label
    # cache (and the RAM image cache); the others then read what it wrote.
    with torch_distributed_zero_first(rank, key=f"labels:{path}"):
        im_files = find_images(path, prefix)
        label_set = load_labels(im_files, label_cache_path(im_files, source=path), prefix=prefix)
        dataset = YoloDataset(
            label_set,
            prefix=prefix,
            local_rank=rank,
            imgsz=imgsz,
            batch_size=batch_size,
            stride=int(stride),
            seed=seed,
            **dataset_kwargs,
        )
    dataset.label_cache_written = label_set.cache_written
    dataset.label_cache_loaded = label_set.cache_loaded
    sharded = rank != -1 and is_dist_initialized()
    global_rank, world_size = (get_rank(), get_world_size()) if sharded else (-1, 1)
    if evaluate:
        sampler = EvalSampler(len(dataset), batch_size, global_rank, world_size)
    else:
        sampler = TrainSampler(len(dataset), batch_size, global_rank, world_size, shuffle, seed)
    if dataset_kwargs.get("rect"):
        dataset.set_batches(sampler.rect_batches())
    if augment_on == "device" and dataset.augment:  # the workers plan, the training process renders
        dataset.recipes = True
        collate = RecipeCollate(dataset)
    n_workers = _workers(workers, batch_size, prefix)
    pin = torch.cuda.is_available()
    loader = EpochLoader(dataset, sampler, collate, n_workers, pin_memory=pin, seed=seed, global_rank=global_rank)
    return loader, dataset


def _checked_shuffle(
    augment_on: str, quad: bool, rect: bool, shuffle: bool, image_weights: bool, rank: int, prefix: str
) -> bool:
    """Refuse the options that cannot go together before any work; returns ``shuffle``, off with ``rect``."""
    if augment_on not in ("workers", "device"):
        raise ValueError(f"{prefix}augment_on={augment_on!r}: 'workers' or 'device'")
    if augment_on == "device" and quad:
        raise ValueError(f"{prefix}quad=True makes its batches in the workers: use augment_on='workers'")
    if rect and shuffle:
        LOGGER.warning(f"{prefix}rect=True is incompatible with shuffle: shuffle turned off")
        shuffle = False
    if image_weights and rank != -1:
        raise ValueError(
            f"{prefix}image_weights=True is not supported with DDP (rank {rank}): "
            "each rank would draw its own weighted sample; train without image weights"
        )
    return shuffle


def create_dataloader(
    path: str | Path | Sequence[str | Path],
    imgsz: int,
    batch_size: int,
    stride: int,
    single_cls: bool = False,
    hyp: dict | None = None,
    augment: bool = False,
    cache: bool | str | None = False,
    pad: float = 0.0,
    rect: bool = False,
    rank: int = -1,
    workers: int | None = 8,
    image_weights: bool = False,
    quad: bool = False,
    prefix: str = "",
    shuffle: bool = False,
    seed: int = 0,
    augment_on: str = "workers",
) -> tuple[EpochLoader, YoloDataset]:
    """The training loader and its dataset, sharded over the ranks of the process group.

    Args:
        path: image directory, .txt list of images, or a list of these.
        imgsz: long side of the images.
        batch_size: batch size PER PROCESS.
        stride: the model's largest stride (rect shapes are multiples of it).
        single_cls: every class becomes 0.
        hyp: augmentation hyperparameters (YOLOv5's names).
        augment: augment the images.
        cache: "ram"/True (one shared copy per node), "disk" (.npy), or False.
        pad: extra rectangular padding, in strides.
        rect: rectangular batches (turns shuffle off).
        rank: LOCAL_RANK of this process, -1 for a single process.
        workers: most DataLoader workers per process (YOLOv5's ``min(cores // local processes,
            workers)``); None: every core of this process's share but one (for the training loop).
        image_weights: draw images by weight (``loader.set_image_weights``); single process only.
        quad: 4 images into one of twice the size (:meth:`YoloDataset.collate_fn4`).
        prefix: log prefix.
        shuffle: a new order every epoch (seeded by ``seed`` and the epoch).
        seed: seeds the order and every sample's augmentation.
        augment_on: "workers": the workers make the images (OpenCV); "device": with ``augment``, they
            send each batch as a :class:`~ddp_utils.data.device.recipes.RecipeBatch` (the same draws and labels,
            the JPEG bytes) and :class:`~ddp_utils.data.device.prefetch.DevicePrefetcher` renders it on the
            training device (:mod:`ddp_utils.data.device.render`). Not with ``quad``.

    Returns:
        (loader, dataset): call ``loader.set_epoch(epoch)`` before each epoch.
    """
    shuffle = _checked_shuffle(augment_on, quad, rect, shuffle, image_weights, rank, prefix)
    collate = YoloDataset.collate_fn4 if quad else YoloDataset.collate_fn
    dataset_kwargs = dict(augment=augment, hyp=hyp, rect=rect, image_weights=image_weights, cache=cache, pad=pad)
    where = (path, imgsz, batch_size, stride, rank, workers, prefix)
    options = dict(collate=collate, evaluate=False, shuffle=shuffle, seed=seed, single_cls=single_cls)
    options["augment_on"] = augment_on
    return _build(*where, **options, **dataset_kwargs)


def create_val_dataloader(
    path: str | Path | Sequence[str | Path],
    imgsz: int,
    batch_size: int,
    stride: int,
    single_cls: bool = False,
    hyp: dict | None = None,
    cache: bool | str | None = False,
    pad: float = 0.5,
    rect: bool = True,
    rank: int = -1,
    workers: int | None = 8,
    prefix: str = "val: ",
) -> tuple[EpochLoader, YoloDataset]:
    """The evaluation loader: contiguous, unpadded shards, so every image is evaluated exactly once.

    Arguments as :func:`create_dataloader`; no augmentation, no shuffle. A rank may get one
    batch fewer than another (or none when there are fewer images than ranks).
    """
    dataset_kwargs = dict(augment=False, hyp=hyp, rect=rect, cache=cache, single_cls=single_cls, pad=pad)
    where = (path, imgsz, batch_size, stride, rank, workers, prefix)
    return _build(*where, collate=YoloDataset.collate_fn, evaluate=True, shuffle=False, seed=0, **dataset_kwargs)


__all__ = ["EpochLoader", "create_dataloader", "create_val_dataloader"]
