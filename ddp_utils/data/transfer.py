"""Batches from loader workers to the training process through shared memory that is reused.

torch's DataLoader moves every batch a worker makes into a NEW shared-memory segment, and
the kernel must hand out and zero each of its pages again: for a batch of 16 images at
640 px that is 4,800 page faults, about 1 ms of CPU per image in a VM, as much as
augmenting it. Here the training process maps a few slots of shared memory once, before
the workers start (they inherit them). The request for each batch names a free slot; the
worker stacks the batch's images there and sends only the slot number (and its small
tensors, the labels, pickled inline); the training process copies the images out into
its own (or pinned) memory and frees the slot.

A slot goes back to the free list only once its images are copied out, so a worker never
writes over a batch that is still being read; when no slot is free, or a batch is larger
than a slot, the batch travels the usual way.
"""

from __future__ import annotations

import inspect
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch


class BatchRequest(list):
    """A batch's sample keys (what the DataLoader hands a worker) and the slot for its images (-1: none)."""

    def __init__(self, keys: Sequence[Any], slot: int = -1) -> None:
        super().__init__(keys)
        self.slot = slot


class SlotImages(NamedTuple):
    """Stands in a worker's batch for the images it wrote to slot ``slot`` of the pool."""

    slot: int
    shape: tuple[int, ...]


class InlineArray(NamedTuple):
    """A small tensor of a worker's batch (the labels), sent pickled in the message.

    torch would move each tensor into a shared-memory segment of its own and pass its file
    descriptor over a socket: more work than copying a few hundred bytes.
    """

    array: np.ndarray


class BatchPool:
    """``slots`` shared-memory buffers of ``slot_bytes`` each, and which of them are free.

    Create it in the training process before the workers start; :meth:`acquire` and
    :meth:`take` run there, :meth:`put` in the workers.

    Examples:
        >>> pool = BatchPool(slots=2, slot_bytes=48)
        >>> slot = pool.acquire()
        >>> ref = pool.put(slot, torch.arange(24, dtype=torch.uint8).reshape(2, 3, 2, 2))
        >>> pool.take(ref).flatten()[-3:].tolist(), pool.free_slots
        ([21, 22, 23], 2)
    """

    def __init__(self, slots: int, slot_bytes: int) -> None:
        self.slot_bytes = int(slot_bytes)
        # share_memory_ copies the (empty) contents in: every page is mapped here once, now
        self.buffers = [shared_buffer(self.slot_bytes) for _ in range(slots)]
        self._free = list(range(slots))

    @property
    def free_slots(self) -> int:
        return len(self._free)

    def acquire(self) -> int:
        """A free slot for the next batch, or -1 when all are taken (that batch travels the usual way)."""
        return self._free.pop(0) if self._free else -1

    def release_all(self) -> None:
        """Free every slot; only once no worker can still be writing (after the workers stopped)."""
        self._free = list(range(len(self.buffers)))

    def put(self, slot: int, images: torch.Tensor) -> SlotImages | torch.Tensor:
        """In a worker: copy ``images`` into ``slot`` (unless they were stacked there already) and
        return what to send instead; or the images themselves when there is no slot or they do
        not fit."""
        if slot < 0 or images.dtype != torch.uint8 or images.numel() > self.slot_bytes:
            return images
        buffer = self.buffers[slot]
        if images.data_ptr() != buffer.data_ptr():
            buffer[: images.numel()].view(images.shape).copy_(images)
        return SlotImages(slot, tuple(images.shape))

    def take(self, ref: SlotImages, pin_memory: bool = False) -> torch.Tensor:
        """In the training process: the images of ``ref`` copied out of their slot, which is freed."""
        shape = tuple(ref.shape)  # the pin-memory thread may have made it a list
        view = self.buffers[ref.slot][: math.prod(shape)].view(shape)
        if pin_memory:
            out = torch.empty(shape, dtype=torch.uint8, pin_memory=True)  # cached by torch's host allocator
        else:  # numpy's memory: glibc reuses it, where torch.empty page-faults a fresh batch every time
            out = torch.from_numpy(np.empty(shape, np.uint8))
        # a plain memcpy: torch's copy_ would wake its intra-op threads, whose spinning costs
        # more CPU than the copy itself
        np.copyto(out.numpy(), view.numpy())
        self._free.append(ref.slot)
        return out


SHM_DIR = Path("/dev/shm")  # where torch's shared memory lives on Linux


def shared_buffer(nbytes: int) -> torch.Tensor:
    """``nbytes`` of shared memory (torch's, which a forked worker inherits), or the error torch raised with nothing
    left behind.

    torch names the segment ``/dev/shm/torch_<pid>_...``, sizes it, then maps it, and unlinks it only once mapped:
    when the map fails (``ulimit -v``) the file stays after the process has gone, as large as asked (2.76 GB
    for a batch of 100,000 images of 96 px). Any such file of this process made during the call is removed.
    """
    before = _own_segments()
    try:
        return torch.empty(nbytes, dtype=torch.uint8).share_memory_()
    except BaseException:
        for name in _own_segments() - before:
            (SHM_DIR / name).unlink(missing_ok=True)
        raise


def _own_segments() -> set[str]:
    prefix = f"torch_{os.getpid()}_"
    try:
        return {entry.name for entry in os.scandir(SHM_DIR) if entry.name.startswith(prefix)}
    except OSError:
        return set()


class PooledDataset(torch.utils.data.Dataset):
    """Wraps a dataset so that a worker's fetch of a :class:`BatchRequest` also returns its slot."""

    def __init__(self, dataset: torch.utils.data.Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: Any) -> Any:
        return self.dataset[key]

    def __getitems__(self, request: Sequence[Any]) -> tuple[int, list]:
        fetch = getattr(self.dataset, "__getitems__", None)  # a dataset that makes a batch at once
        return getattr(request, "slot", -1), fetch(list(request)) if fetch else [self.dataset[key] for key in request]


class PooledCollate:
    """Collates a worker's samples with their images in their slot (the batch's first item), and
    its other tensors inline.

    A collate function that takes ``out=`` (a flat uint8 buffer) stacks the images straight
    into the slot; any other is copied there.
    """

    def __init__(self, collate_fn: Callable[..., tuple], pool: BatchPool | None) -> None:
        self.collate_fn, self.pool = collate_fn, pool
        self.takes_out = "out" in inspect.signature(collate_fn).parameters

    def __call__(self, fetched: tuple[int, list]) -> tuple:
        slot, samples = fetched
        if self.pool is None:
            return self.collate_fn(samples)
        if slot >= 0 and self.takes_out:
            images, *rest = self.collate_fn(samples, out=self.pool.buffers[slot].numpy())
        else:
            images, *rest = self.collate_fn(samples)
        small = [InlineArray(x.numpy()) if isinstance(x, torch.Tensor) and x.numel() < 2**16 else x for x in rest]
        return (self.pool.put(slot, images), *small)


def unpack(batch: tuple, pool: BatchPool | None, pin_memory: bool = False) -> tuple:
    """In the training process: a worker's batch with its images copied out of their slot."""
    if pool is None or not isinstance(batch[0], SlotImages):
        return batch
    rest = (torch.from_numpy(x.array) if isinstance(x, InlineArray) else x for x in batch[1:])
    return (pool.take(batch[0], pin_memory), *rest)


__all__ = [
    "BatchPool",
    "BatchRequest",
    "InlineArray",
    "PooledCollate",
    "PooledDataset",
    "SlotImages",
    "shared_buffer",
    "unpack",
]
