"""create_dataloader: the dataset built once per node, sharded per rank, fed by workers that stay.

Three small pieces:

- :class:`EpochSampler` decides an epoch: which images, in which order, in which batches,
  for this rank. Its output is a pure function of (seed, epoch, rank, world size).
- :class:`EpochLoader` keeps ONE DataLoader iterator over an endless stream of epochs,
  so workers are started once, not every epoch, and prefetch across epoch boundaries.
- The samples carry their epoch (:class:`~ddp_utils.data.dataset.SampleKey`), so a batch
  the workers prefetched for epoch ``e + 1`` is already epoch ``e + 1``'s: when
  ``set_epoch`` asks for the epoch the stream holds next, nothing is restarted; when it
  asks for another (a resume, a skipped epoch, an epoch left half-way), the stream is
  restarted at that epoch. Either way epoch ``e`` gives epoch ``e``'s order and augmentation.
"""

from __future__ import annotations

import atexit
import ctypes
import itertools
import math
import os
import signal
import threading
import time
import weakref
from collections.abc import Iterator, Sequence
from pathlib import Path

import cv2
import numpy as np
import torch
from torch.utils.data import DataLoader

from ..dist import dist_info, get_rank, get_world_size, is_dist_initialized, torch_distributed_zero_first
from ..log import LOGGER
from ..seed import derive_seed, loader_generator, seed_worker
from .dataset import SampleKey, YoloDataset
from .images import disk_free
from .labels import find_images, label_cache_path, load_labels
from .transfer import BatchPool, BatchRequest, PooledCollate, PooledDataset, unpack


class EpochSampler:
    """This rank's batches of one epoch, as :class:`SampleKey` lists.

    Training (``pad=True``): the epoch's order (a permutation seeded by (seed, epoch) when
    shuffling, else 0..N-1, or N weighted draws with ``weights``) is padded with its first
    images to a multiple of the world size and cut into equal, contiguous, disjoint shards,
    so every rank runs the same number of batches. Evaluation (``pad=False``): contiguous
    shards, unpadded, so each image is seen exactly once over all ranks.

    Args:
        n: images in the dataset.
        batch_size: per-rank batch size.
        rank: global rank (-1 or 0 for a single process).
        world_size: processes in the job.
        shuffle: a new permutation every epoch.
        seed: seeds the permutations and weighted draws.
        pad: pad shards to equal length (training) or not (evaluation).

    Examples:
        >>> s = EpochSampler(10, batch_size=4, rank=1, world_size=2)
        >>> [[k.index for k in b] for b in s.epoch_batches(0)]
        [[5, 6, 7, 8], [9]]
    """

    def __init__(
        self,
        n: int,
        batch_size: int,
        rank: int = -1,
        world_size: int = 1,
        shuffle: bool = False,
        seed: int = 0,
        pad: bool = True,
    ) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size={batch_size}: must be at least 1")
        self.n, self.batch_size = n, batch_size
        self.rank, self.world_size = max(rank, 0), max(world_size, 1)
        self.shuffle, self.seed, self.pad = shuffle, seed, pad
        self.epoch = 0
        self.weights: np.ndarray | None = None

    def set_epoch(self, epoch: int) -> None:
        """The epoch the next pass over the loader gives."""
        self.epoch = int(epoch)

    def order(self, epoch: int) -> np.ndarray:
        """The epoch's global order of image indices (before sharding)."""
        if self.weights is not None:
            rng = np.random.default_rng(derive_seed(self.seed, epoch, 1))
            return rng.choice(self.n, size=self.n, replace=True, p=self.weights / self.weights.sum())
        if self.shuffle:
            return np.random.default_rng(derive_seed(self.seed, epoch)).permutation(self.n)
        return np.arange(self.n)

    def _shard_bounds(self) -> list[tuple[int, int]]:
        if self.pad:
            per = math.ceil(self.n / self.world_size)
            return [(r * per, (r + 1) * per) for r in range(self.world_size)]
        sizes = [len(a) for a in np.array_split(np.arange(self.n), self.world_size)]
        starts = np.concatenate([[0], np.cumsum(sizes)])
        return [(int(starts[r]), int(starts[r + 1])) for r in range(self.world_size)]

    def _batch_slots(self) -> list[list[range]]:
        # per rank, its batches as ranges of slots (positions in the padded global order)
        return [
            [range(s, min(s + self.batch_size, end)) for s in range(start, end, self.batch_size)]
            for start, end in self._shard_bounds()
        ]

    def rect_batches(self) -> list[list[int]]:
        """Every rank's batches of image indices without shuffling, in global batch order."""
        return [[s % self.n for s in b] for rank_batches in self._batch_slots() for b in rank_batches]

    def epoch_batches(self, epoch: int) -> list[list[SampleKey]]:
        """This rank's batches of one epoch."""
        order = self.order(epoch)
        slots = self._batch_slots()
        first = sum(len(b) for b in slots[: self.rank])  # global batch id of this rank's first batch
        return [
            [SampleKey(epoch, s, int(order[s % self.n]), first + j) for s in b] for j, b in enumerate(slots[self.rank])
        ]

    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        return len(self._batch_slots()[self.rank])


class _EpochStream:
    """``batch_sampler`` for the DataLoader: epochs ``start, start + 1, ...`` back to back, forever."""

    def __init__(self, sampler: EpochSampler) -> None:
        self.sampler = sampler
        self.start = 0
        self.pool: BatchPool | None = None  # when set, each batch is asked for with a free slot of it

    def __iter__(self) -> Iterator[list[SampleKey]]:
        for epoch in itertools.count(self.start):
            for keys in self.sampler.epoch_batches(epoch):
                yield keys if self.pool is None else BatchRequest(keys, self.pool.acquire())

    def __len__(self) -> int:
        return len(self.sampler)


def _init_worker(worker_id: int) -> None:
    _outlive_group_sigterm()
    _keep_freed_memory()
    cv2.setNumThreads(0)  # the workers are the parallelism; OpenCV threads inside each would oversubscribe
    seed_worker(worker_id)


def _keep_freed_memory() -> None:
    """Let glibc's malloc keep freed memory for reuse in this process, instead of returning it.

    A worker frees a batch's worth of images every batch and allocates as many again for
    the next. By default glibc hands large blocks back to the kernel (munmap, heap trim),
    and every new one then costs a page fault per 4 KiB page: about a third of a worker's
    CPU time in a VM. Keeping blocks up to 32 MiB on the heap, and trimming only past
    256 MiB free, makes the pages stay mapped. No-op on other C libraries.
    """
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    m_trim_threshold, m_mmap_threshold = -1, -3  # glibc's malloc.h
    mallopt(m_mmap_threshold, 32 * 2**20)  # the largest it accepts on 64-bit
    mallopt(m_trim_threshold, 256 * 2**20)


def _outlive_group_sigterm() -> None:
    """Let a data-loader worker ignore a SIGTERM sent to its whole process group, but not its parent's.

    Preemption (torchrun's agent, a scheduler) sends SIGTERM to the process group; the
    training process catches it to finish its step and save, so its workers must not die
    under it mid-batch. A SIGTERM from the training process itself (multiprocessing ending
    its workers at exit) must still end the worker, or that exit would wait forever. The
    sender's pid tells them apart: SIGTERM is blocked and a thread takes it with
    ``sigwaitinfo``. Where that is not available (macOS, Windows) SIGTERM keeps its default.
    """
    if not hasattr(signal, "sigwaitinfo") or threading.current_thread() is not threading.main_thread():
        return
    parent = os.getppid()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

    def take_sigterm() -> None:
        while True:
            info = signal.sigwaitinfo({signal.SIGTERM})
            if info.si_pid == parent or os.getppid() != parent:
                # die of the signal itself, as an unprotected worker would: the loader reads a
                # SIGTERM death as a worker it stopped, an exit code as a crash
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
                signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
                os._exit(128 + signal.SIGTERM)

    threading.Thread(target=take_sigterm, name="ddp_utils-sigterm", daemon=True).start()


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
    them, and the epoch then advances by itself (call ``set_epoch`` anyway: it is free
    when the epoch is the expected one, and makes a resume or a skip correct).
    """

    def __init__(
        self,
        dataset: YoloDataset,
        sampler: EpochSampler,
        collate_fn,
        num_workers: int = 0,
        pin_memory: bool = False,
        seed: int = 0,
        rank: int = -1,
    ) -> None:
        self.dataset, self.sampler = dataset, sampler
        self.batch_size = sampler.batch_size
        self.num_workers, self.pin_memory = num_workers, pin_memory
        self._stream = _EpochStream(sampler)
        self._pool: BatchPool | None = None
        self._collate = PooledCollate(collate_fn, None) if num_workers > 0 else None
        self._loader = DataLoader(
            PooledDataset(dataset) if num_workers > 0 else dataset,
            batch_sampler=self._stream,
            num_workers=num_workers,
            collate_fn=self._collate or collate_fn,
            pin_memory=pin_memory,
            worker_init_fn=_init_worker,
            generator=loader_generator(seed, rank),
        )
        self._iterator: Iterator | None = None
        self._position: tuple[int, int] | None = None  # (epoch, batches taken) of the running stream
        self._stale = False

    def __len__(self) -> int:
        return len(self.sampler)

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass over the loader epoch ``epoch`` (its shuffle and augmentation)."""
        self.sampler.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def set_image_weights(self, weights: Sequence[float] | np.ndarray | None) -> None:
        """Draw the next epochs' images with these per-image weights (None: back to the plain order)."""
        if weights is not None:
            weights = np.asarray(weights, dtype=np.float64)
            if weights.shape != (self.sampler.n,) or not np.isfinite(weights).all() or weights.sum() <= 0:
                raise ValueError(f"image weights: need {self.sampler.n} finite non-negative values with a positive sum")
        self.sampler.weights = weights
        self._stale = True  # the workers may hold batches drawn with the old weights

    def _restart(self, epoch: int) -> None:
        self._iterator = None  # shuts the old workers down
        if self._collate is not None:
            if self._pool is None:
                self._pool = _batch_pool(self.dataset, self.batch_size, self.num_workers, self._loader.prefetch_factor)
            else:
                self._pool.release_all()  # no worker is left to write into a slot
            self._collate.pool = self._stream.pool = self._pool  # the new workers inherit it
        self._stream.start = epoch
        self._iterator = iter(self._loader)
        _RUNNING.add(self)
        self._position = (epoch, 0)
        self._stale = False

    def __iter__(self) -> Iterator[tuple]:
        epoch, total = self.sampler.epoch, len(self)
        if total == 0:
            self.sampler.epoch = epoch + 1
            return
        if self._iterator is None or self._stale or self._position != (epoch, 0):
            self._restart(epoch)
        for k in range(total):
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
        self._position = None
        if self._collate is not None:  # and free the shared memory; a next epoch makes it again
            self._pool = self._collate.pool = self._stream.pool = None


def _batch_pool(dataset: YoloDataset, batch_size: int, num_workers: int, prefetch: int) -> BatchPool | None:
    """Shared memory for the batches in flight, sized for the largest batch; None when there is none to spare."""
    if dataset.rect:
        pixels = int(np.prod(dataset.batch_shapes, axis=1).max())
    else:
        pixels = dataset.imgsz**2  # mosaics and letterboxed images (a quad batch has as many pixels)
    # in flight: the DataLoader's prefetch per worker, the batch being copied out, one spare
    slots, slot_bytes = prefetch * num_workers + 2, 3 * pixels * batch_size
    need = slots * slot_bytes
    try:
        # tmpfs does not reserve on ftruncate: filling a full /dev/shm would be a SIGBUS, not an error
        free = disk_free("/dev/shm")  # where torch's shared memory lives on Linux
        if free < 2 * need:  # a container's 64 MB default: leave it to torch's own batches
            LOGGER.debug(
                f"no shared batch pool: {need / 2**20:.0f} MiB wanted, /dev/shm has {free / 2**20:.0f} MiB free"
            )
            return None
        return BatchPool(slots, slot_bytes)
    except (RuntimeError, OSError) as exc:
        LOGGER.debug(f"no shared batch pool ({slots} x {slot_bytes / 2**20:.0f} MiB): {exc}")
        return None


def _workers(workers: int, batch_size: int) -> int:
    local = max(dist_info().local_world_size, 1)
    return max(min((os.cpu_count() or 1) // local, batch_size if batch_size > 1 else 0, workers), 0)


def _group() -> tuple[int, int]:
    if is_dist_initialized():
        return get_rank(), get_world_size()
    return -1, 1


def _build_dataset(path, rank: int, prefix: str, **kwargs) -> YoloDataset:
    # Inside zero_first: the node's first process scans the labels and writes the label
    # cache (and the RAM image cache); the others then read what it wrote.
    with torch_distributed_zero_first(rank):
        im_files = find_images(path, prefix)
        label_set = load_labels(im_files, label_cache_path(im_files), prefix=prefix)
        dataset = YoloDataset(label_set, prefix=prefix, local_rank=rank, **kwargs)
    dataset.label_cache_written = label_set.cache_written
    dataset.label_cache_loaded = label_set.cache_loaded
    return dataset


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
    workers: int = 8,
    image_weights: bool = False,
    quad: bool = False,
    prefix: str = "",
    shuffle: bool = False,
    seed: int = 0,
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
        workers: most DataLoader workers per process.
        image_weights: draw images by weight (``loader.set_image_weights``); single process only.
        quad: 4 images into one of twice the size (:meth:`YoloDataset.collate_fn4`).
        prefix: log prefix.
        shuffle: a new order every epoch (seeded by ``seed`` and the epoch).
        seed: seeds the order and every sample's augmentation.

    Returns:
        (loader, dataset): call ``loader.set_epoch(epoch)`` before each epoch.
    """
    if rect and shuffle:
        LOGGER.warning(f"{prefix}rect=True is incompatible with shuffle: shuffle turned off")
        shuffle = False
    if image_weights and rank != -1:
        raise ValueError(
            f"{prefix}image_weights=True is not supported with DDP (rank {rank}): "
            "each rank would draw its own weighted sample; train without image weights"
        )
    dataset = _build_dataset(
        path,
        rank,
        prefix,
        imgsz=imgsz,
        batch_size=batch_size,
        augment=augment,
        hyp=hyp,
        rect=rect,
        image_weights=image_weights,
        cache=cache,
        single_cls=single_cls,
        stride=int(stride),
        pad=pad,
        seed=seed,
    )
    collate = YoloDataset.collate_fn4 if quad else YoloDataset.collate_fn
    return _loader(dataset, batch_size, rank, workers, collate, rect, shuffle=shuffle, seed=seed, pad=True), dataset


def _loader(dataset: YoloDataset, batch_size: int, rank: int, workers: int, collate, rect: bool, *, shuffle: bool,
            seed: int, pad: bool) -> EpochLoader:  # fmt: skip
    """Shard ``dataset`` over the process group (padded shards for training, exact ones for evaluation)."""
    global_rank, world_size = _group() if rank != -1 else (-1, 1)
    sampler = EpochSampler(len(dataset), batch_size, global_rank, world_size, shuffle, seed, pad=pad)
    if rect:
        dataset.set_batches(sampler.rect_batches())
    return EpochLoader(
        dataset, sampler, collate, _workers(workers, batch_size), pin_memory=torch.cuda.is_available(), seed=seed,
        rank=global_rank,
    )  # fmt: skip


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
    workers: int = 8,
    prefix: str = "val: ",
) -> tuple[EpochLoader, YoloDataset]:
    """The evaluation loader: contiguous, unpadded shards, so every image is evaluated exactly once.

    Arguments as :func:`create_dataloader`; no augmentation, no shuffle. A rank may get one
    batch fewer than another (or none when there are fewer images than ranks).
    """
    dataset = _build_dataset(
        path,
        rank,
        prefix,
        imgsz=imgsz,
        batch_size=batch_size,
        augment=False,
        hyp=hyp,
        rect=rect,
        cache=cache,
        single_cls=single_cls,
        stride=int(stride),
        pad=pad,
    )
    loader = _loader(dataset, batch_size, rank, workers, YoloDataset.collate_fn, rect, shuffle=False, seed=0, pad=False)
    return loader, dataset
