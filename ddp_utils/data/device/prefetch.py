"""Batches made ready on the device by a thread of their own while the step computes: the prefetcher.

:class:`DevicePrefetcher` hands the training loop each batch as float images on the device. On CUDA,
and wherever the loader sends recipes (``--augment-on device``), a loader thread takes the loader's
batches one or two ahead of the step, and on a CUDA stream of its own copies each to the device (from
the pinned memory the loader gives), converts it to float ``0-1`` in the step's layout, or decodes and
renders it (:mod:`~ddp_utils.data.device.render`); then it records an event. The training thread
only makes the compute stream wait for that event (queued on the GPU: the host never waits) and marks
the batch as used there (``record_stream``), so the caching allocator does not recycle it under the
step. Nothing of the decode or the render runs on the training thread: its launches never queue behind
them.

On the CPU, a loader of ready images is passed through on the training thread, computing exactly what
the plain loop does (``imgs.to(device).float() / 255`` and ``targets.to(device)``, the first as one
allocation: :func:`images_to_float`).
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from .recipes import RecipeBatch
from .render import renderer_for


def to_device_batch(batch: Any, device: torch.device, channels_last: bool = False, non_blocking: bool = False) -> tuple:
    """The plain path: images (uint8 0-255 or float) as float 0-1 on ``device``, targets there too.

    The batch is a tuple ``(images, targets, *rest)`` (the loader's ``(imgs, targets, paths,
    shapes)``); ``rest`` passes through untouched. Images that come as a
    :class:`~ddp_utils.data.device.recipes.RecipeBatch` are rendered on ``device`` first
    (:func:`~ddp_utils.data.device.render.render_batch`).

    Examples:
        >>> imgs = torch.full((1, 3, 2, 2), 255, dtype=torch.uint8)
        >>> out = to_device_batch((imgs, torch.zeros(0, 6), ["a.jpg"]), torch.device("cpu"))
        >>> out[0].dtype, float(out[0].max()), out[2]
        (torch.float32, 1.0, ['a.jpg'])
    """
    images, targets, *rest = batch
    if isinstance(images, RecipeBatch):  # the loader's augment_on="device": the images are made here
        images = renderer_for(device)(images, to_float=True, channels_last=channels_last)
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

    On CUDA, and for a loader that sends recipes (``--augment-on device``), a loader thread prepares the
    batches a step or two ahead (module docstring); errors there (a worker's death, a file that cannot
    be read) are raised here, in the training thread, when their batch is due. On the CPU a loader of
    images is passed through.

    Args:
        loader: any iterable of ``(images, targets, *rest)`` batches (``len`` passes through).
        device: where the batches go.
        channels_last: give the images the ``channels_last`` layout (see
            :func:`ddp_utils.engine.memory_format.use_channels_last`).
        threaded: prepare the batches on a loader thread; default: on CUDA, or where the loader sends recipes.

    Examples:
        >>> batches = [(torch.zeros(2, 3, 4, 4, dtype=torch.uint8), torch.zeros(0, 6))]
        >>> [tuple(imgs.shape) for imgs, _ in DevicePrefetcher(batches, torch.device("cpu"))]
        [(2, 3, 4, 4)]
    """

    ahead = 2  # batches prepared ahead of the one the step holds: one ready, one in the making

    def __init__(
        self, loader: Iterable, device: torch.device | str, channels_last: bool = False, threaded: bool | None = None
    ) -> None:
        self.loader = loader
        self.device = torch.device(device)
        self.channels_last = channels_last
        if threaded is None:
            threaded = self.device.type == "cuda" or bool(getattr(loader, "sends_recipes", False))
        self.threaded = threaded

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __iter__(self) -> Iterator[tuple]:
        if not self.threaded:
            for batch in self.loader:
                yield to_device_batch(batch, self.device, self.channels_last)
            return
        ahead = LoaderThread(iter(self.loader), self._prepare, self.device, self.ahead)
        try:
            for batch, event in ahead:
                if event is not None:
                    compute = torch.cuda.current_stream(self.device)
                    compute.wait_event(event)  # queued on the GPU; the host does not wait here
                    for value in batch[:2]:
                        if isinstance(value, torch.Tensor) and value.device.type == "cuda":
                            value.record_stream(compute)
                yield batch
        finally:
            ahead.close()

    def _prepare(self, batch: Any) -> tuple[tuple, Any]:
        # on the loader thread: the batch on the device, and the event its work on the thread's stream records
        images, targets, *rest = batch
        if self.device.type != "cuda":
            return to_device_batch(batch, self.device, self.channels_last), None
        images, targets = _pinned(images), _pinned(targets)
        stream = side_stream(self.device)
        with torch.cuda.stream(stream):
            ready = to_device_batch((images, targets, *rest), self.device, self.channels_last, non_blocking=True)
            return ready, stream.record_event()


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


_END = object()


class LoaderThread:
    """``prepare(batch)`` for each of ``batches`` on a thread of its own, at most ``ahead`` batches ahead.

    Iterating yields the prepared batches in order and raises, in the caller's thread, what the thread
    raised. :meth:`close` stops it (and waits for the batch it is preparing); the caller must call it.

    Examples:
        >>> thread = LoaderThread(iter(range(3)), lambda x: x * 10, torch.device("cpu"))
        >>> list(thread)
        [0, 10, 20]
        >>> thread.close()
    """

    def __init__(self, batches: Iterator, prepare: Callable[[Any], Any], device: torch.device, ahead: int = 2):
        self._batches, self._prepare, self._device = batches, prepare, device
        self._queue: queue.Queue = queue.Queue(maxsize=max(ahead - 1, 1))  # one ready, one in the making
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ddp_utils-loader", daemon=True)
        self._thread.start()

    def __iter__(self) -> Iterator:
        while True:
            item = self._queue.get()
            if item is _END:
                return
            if isinstance(item, _Failed):
                raise item.error
            yield item

    def _run(self) -> None:
        try:
            if self._device.type == "cuda":
                torch.cuda.set_device(self._device)  # the thread's own current device
            for batch in self._batches:
                if self._stop.is_set() or not self._put(self._prepare(batch)):
                    return
            self._put(_END)
        except BaseException as exc:  # noqa: BLE001 (raised again in the caller's thread)
            self._put(_Failed(exc))
        finally:
            close = getattr(self._batches, "close", None)
            if close is not None:
                close()  # the loader's generator ends here, in the thread that ran it

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def close(self, timeout: float = 120.0) -> None:
        """Stop the thread: it finishes the batch in hand and takes no other."""
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._queue.get_nowait()  # a put waiting for room sees the stop
            except queue.Empty:
                self._thread.join(0.05)
                timeout -= 0.05
                if timeout <= 0:
                    break


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
