"""Batches reach the GPU while the previous step still computes: a side-stream prefetcher.

The training loader already hands out pinned host memory when CUDA is available
(``create_dataloader`` sets ``pin_memory=torch.cuda.is_available()`` and the batch pool's
``take(pin_memory=True)`` copies each batch into pinned memory), so a ``non_blocking`` copy
is a true asynchronous DMA. :class:`DevicePrefetcher` issues that copy, the uint8 -> float
/255 conversion and the optional ``channels_last`` layout on a side CUDA stream for the
*next* batch as soon as the current one is handed out, so they overlap with the current
step's kernels instead of standing in front of the next one. A batch the workers sent as recipes
(``--augment-on device``) is decoded and augmented there too, on the same side stream
(:func:`~ddp_utils.data.device_augment.render_batch`).

On any other device it is a pass-through that computes exactly what the plain loop does
(``imgs.to(device).float() / 255`` and ``targets.to(device)``, the first as one allocation:
:func:`images_to_float`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from .device_augment import render_batch
from .recipes import RecipeBatch


def to_device_batch(batch: Any, device: torch.device, channels_last: bool = False, non_blocking: bool = False) -> tuple:
    """The plain path: images (uint8 0-255 or float) as float 0-1 on ``device``, targets there too.

    The batch is a tuple ``(images, targets, *rest)`` (the loader's ``(imgs, targets, paths,
    shapes)``); ``rest`` passes through untouched. Images that come as a
    :class:`~ddp_utils.data.recipes.RecipeBatch` are rendered on ``device`` first
    (:func:`~ddp_utils.data.device_augment.render_batch`).

    Examples:
        >>> imgs = torch.full((1, 3, 2, 2), 255, dtype=torch.uint8)
        >>> out = to_device_batch((imgs, torch.zeros(0, 6), ["a.jpg"]), torch.device("cpu"))
        >>> out[0].dtype, float(out[0].max()), out[2]
        (torch.float32, 1.0, ['a.jpg'])
    """
    images, targets, *rest = batch
    if isinstance(images, RecipeBatch):  # the loader's augment_on="device": the images are made here
        images = render_batch(images, device)
    images = images_to_float(images.to(device, non_blocking=non_blocking), channels_last)
    if isinstance(targets, torch.Tensor):
        targets = targets.to(device, non_blocking=non_blocking)
    return (images, targets, *rest)


def images_to_float(images: torch.Tensor, channels_last: bool = False) -> torch.Tensor:
    """uint8 images (0-255) as float32 in [0, 1], in one allocation, in ``channels_last`` layout if asked.

    ``empty(..., memory_format).copy_(images).div_(255)`` converts, lays out and scales in
    place: one full-size float tensor instead of three (``.float()``, ``/ 255``, ``.contiguous``),
    with the same values (the same conversion, then the same division). Float images keep
    their values and only change layout when asked.

    Examples:
        >>> imgs = torch.tensor([[[[0, 51], [255, 128]]]], dtype=torch.uint8)
        >>> out = images_to_float(imgs, channels_last=True)
        >>> torch.equal(out, imgs.float() / 255), out.is_contiguous(memory_format=torch.channels_last)
        (True, True)
    """
    layout = torch.channels_last if channels_last and images.dim() == 4 else torch.contiguous_format
    if images.is_floating_point():
        return images.contiguous(memory_format=layout) if channels_last else images
    converted = torch.empty(images.shape, dtype=torch.float32, device=images.device, memory_format=layout)
    return converted.copy_(images).div_(255)


class DevicePrefetcher:
    """Wrap a loader so that each batch arrives on ``device`` as float images, ready to use.

    On CUDA the next batch is copied and converted on a side stream while the caller runs
    the current step; the compute stream waits for that stream (``wait_stream``) before it
    gets the batch, and the batch's tensors are marked as used on the compute stream
    (``record_stream``) so the caching allocator does not recycle them while the step still
    reads them. Host memory that is not pinned yet is pinned first (a copy from pageable
    memory would block the host).

    Args:
        loader: any iterable of ``(images, targets, *rest)`` batches (``len`` passes through).
        device: where the batches go.
        channels_last: give the images the ``channels_last`` layout (see
            :func:`ddp_utils.engine.memory_format.use_channels_last`).

    Examples:
        >>> batches = [(torch.zeros(2, 3, 4, 4, dtype=torch.uint8), torch.zeros(0, 6))]
        >>> [tuple(imgs.shape) for imgs, _ in DevicePrefetcher(batches, torch.device("cpu"))]
        [(2, 3, 4, 4)]
    """

    def __init__(self, loader: Iterable, device: torch.device | str, channels_last: bool = False) -> None:
        self.loader = loader
        self.device = torch.device(device)
        self.channels_last = channels_last

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[tuple]:
        if self.device.type != "cuda":
            for batch in self.loader:
                yield to_device_batch(batch, self.device, self.channels_last)
            return
        yield from self._cuda_batches(iter(self.loader))

    def _cuda_batches(self, batches: Iterator) -> Iterator[tuple]:
        side = side_stream(self.device)
        compute = torch.cuda.current_stream(self.device)
        upcoming = self._issue(next(batches, None), side)
        while upcoming is not None:
            compute.wait_stream(side)  # queued on the GPU; the host does not wait here
            for value in upcoming[:2]:
                if isinstance(value, torch.Tensor) and value.device.type == "cuda":
                    value.record_stream(compute)
            current = upcoming
            # the next copy is queued now, so it runs under this step's kernels
            upcoming = self._issue(next(batches, None), side)
            yield current

    def _issue(self, batch: Any, side: torch.cuda.Stream) -> tuple | None:
        if batch is None:
            return None
        images, targets, *rest = batch
        images, targets = _pinned(images), _pinned(targets)
        with torch.cuda.stream(side):
            return to_device_batch((images, targets, *rest), self.device, self.channels_last, non_blocking=True)


_SIDE_STREAMS: dict[int, torch.cuda.Stream] = {}


def side_stream(device: torch.device | str) -> torch.cuda.Stream:
    """The one side stream of ``device`` for the process: every epoch's prefetcher copies on the same stream.

    The caching allocator keeps freed blocks for the stream that allocated them. A new side stream per
    epoch (torch hands out 32 in turn) would leave the last epoch's batch-sized blocks cached for a stream
    no one allocates on any more, and the reserved memory would grow by a few batches an epoch (the +1 G an
    epoch of yolov5s, 640 px, batch 64) until the allocator frees them at an out-of-memory retry.
    """
    device = torch.device(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    if index not in _SIDE_STREAMS:
        _SIDE_STREAMS[index] = torch.cuda.Stream(index)
    return _SIDE_STREAMS[index]


def _pinned(value: Any) -> Any:
    """``value`` in pinned host memory if it is a CPU tensor that is not there yet."""
    if isinstance(value, torch.Tensor) and value.device.type == "cpu" and not value.is_pinned():
        return value.pin_memory()
    return value
