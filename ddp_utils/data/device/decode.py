"""JPEGs decoded in batches on the training device, in an order that cannot corrupt memory.

:func:`jpeg_decoder` picks the decoder once per device: on CUDA, TorchCodec's ``decode_jpeg`` (nvJPEG's
batched decode), or, where the installed TorchCodec lacks it (an older torch on a GPU host),
torchvision's, which torchvision 0.29 deprecates; on the CPU, the CPU path's own decoder
(libjpeg-turbo through simplejpeg, :func:`~ddp_utils.data.images.decode_jpeg`: the workers' pixels,
a damaged file named once and no raw libjpeg text), then the same two. ``name`` says which, for the log.

The guard (:class:`JpegDecoder`). nvJPEG's hardware decoder may write its outputs before the work
already queued on the stream it is given has run, and torchvision's wrapper submits to a stream of
its own without waiting for the caller's; the caching allocator meanwhile hands a block to a new
allocation as soon as it is freed on the allocating stream, trusting that stream's order. Decoding
on the caller's stream can so overwrite memory that queued kernels have yet to read (pytorch/vision
PR 9606: 134 corrupted results in 200 on an H100). Here every decode runs on a stream of the
decoder's own, on which nothing else is ever queued, so the blocks it is handed have no pending
reader; the caller's stream waits for the decode's event, and each output is marked as used there
(``record_stream``), so its block goes back to the decoder's pool only once the caller's work on it
has run. On the CPU there are no streams and the order is the program's.

A batch the library refuses (a corrupt file fails the whole call, whatever it raises) is split in halves and each
half decoded again, so only the files that fail cost a second try; they come back as None, for the caller
to decode on the host.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import cv2
import numpy as np
import torch

from ..images import decode_jpeg as decode_on_cpu

Backend = Callable[[list[torch.Tensor], torch.device, list[str]], list[torch.Tensor | None]]


def _simplejpeg_backend() -> tuple[Backend, str] | None:
    try:
        import simplejpeg
    except ImportError:
        return None

    def decode(datas: list[torch.Tensor], device: torch.device, paths: list[str]) -> list[torch.Tensor | None]:
        if device.type != "cpu":
            raise RuntimeError("simplejpeg decodes on the CPU only")
        images = []
        for data, path in zip(datas, paths):
            bgr = decode_on_cpu(bytes(data.numpy()), path)
            images.append(
                None if bgr is None else torch.from_numpy(cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)).permute(2, 0, 1)
            )
        return images

    return decode, f"simplejpeg {simplejpeg.__version__}"


def _torchcodec_backend() -> tuple[Backend, str] | None:
    try:
        import torchcodec
        from torchcodec.decoders import decode_jpeg
    except Exception:  # not installed, or built for another torch: its libraries do not load
        return None

    def decode(datas: list[torch.Tensor], device: torch.device, paths: list[str]) -> list[torch.Tensor]:
        return list(decode_jpeg(datas, mode="RGB", device=device))

    return decode, f"TorchCodec {torchcodec.__version__.split('+')[0]}"


def _torchvision_backend() -> tuple[Backend, str] | None:
    try:
        import torchvision
        from torchvision.io import ImageReadMode, decode_jpeg
    except Exception:
        return None

    def decode(datas: list[torch.Tensor], device: torch.device, paths: list[str]) -> list[torch.Tensor]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # its deprecation notice: the log line names the decoder once
            return list(decode_jpeg(datas, mode=ImageReadMode.RGB, device=device))

    return decode, f"torchvision {torchvision.__version__.split('+')[0]} (deprecated)"


BACKENDS: dict[str, list[Callable[[], tuple[Backend, str] | None]]] = {
    "cuda": [_torchcodec_backend, _torchvision_backend],
    "cpu": [_simplejpeg_backend, _torchcodec_backend, _torchvision_backend],
}


class CudaStreams:
    """The guard's CUDA side: a stream of the decoder's own, handed over to the caller's by an event."""

    def __init__(self, device: torch.device) -> None:
        self.stream = torch.cuda.Stream(device)

    def decoding(self) -> contextlib.AbstractContextManager:
        return torch.cuda.stream(self.stream)

    def hand_over(self, outputs: Sequence[torch.Tensor | None]) -> None:
        caller = torch.cuda.current_stream(self.stream.device)
        caller.wait_event(self.stream.record_event())  # queued on the GPU: the host does not wait
        for tensor in outputs:
            if tensor is not None:
                tensor.record_stream(caller)


class NoStreams:
    """The CPU: no streams, nothing to order."""

    def decoding(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def hand_over(self, outputs: Sequence[torch.Tensor | None]) -> None:
        pass


class JpegDecoder:
    """Decodes lists of JPEGs on one device, guarded (module docstring).

    Args:
        backend: ``(datas, device, paths) -> images``, one batched library call (the paths for its messages).
        name: the library, for the log.
        device: where the images are decoded.
        streams: the guard (:class:`CudaStreams` on CUDA, :class:`NoStreams` on the CPU).
    """

    def __init__(self, backend: Backend, name: str, device: torch.device, streams: Any = None) -> None:
        self.backend, self.device = backend, torch.device(device)
        on = "nvJPEG" if self.device.type == "cuda" else "libjpeg-turbo"
        self.name = f"{on} through {name}"
        if streams is None:
            streams = CudaStreams(self.device) if self.device.type == "cuda" else NoStreams()
        self.streams = streams

    def decode(
        self, datas: Sequence[bytes | torch.Tensor], paths: Sequence[str] | None = None
    ) -> list[torch.Tensor | None]:
        """The images, uint8 RGB ``[3, h, w]`` on the device, ready for the caller's stream; None where a file
        cannot be decoded. ``paths`` name the files (for a damaged one's message).

        Examples:
            >>> jpeg = cv2.imencode(".jpg", np.full((4, 6, 3), 200, np.uint8))[1].tobytes()
            >>> [tuple(im.shape) for im in jpeg_decoder("cpu").decode([jpeg, b"not a jpeg"]) if im is not None]
            [(3, 4, 6)]
        """
        tensors = [data if isinstance(data, torch.Tensor) else _as_tensor(data) for data in datas]
        if not tensors:
            return []
        paths = list(paths) if paths is not None else ["<bytes>"] * len(tensors)
        with self.streams.decoding():
            images = self._halving(tensors, paths)
        self.streams.hand_over(images)
        return images

    def _halving(self, tensors: list[torch.Tensor], paths: list[str]) -> list[torch.Tensor | None]:
        # one call for the batch; where it fails, each half again: only the failing files cost more calls
        try:
            return self.backend(tensors, self.device, paths)
        except Exception:  # noqa: BLE001 (whatever the library raises for a file: only the failing files cost more)
            if len(tensors) == 1:
                return [None]
            half = len(tensors) // 2
            return self._halving(tensors[:half], paths[:half]) + self._halving(tensors[half:], paths[half:])


def _on_device(image: torch.Tensor, device: torch.device) -> bool:
    # a library that decodes on the host when asked for the GPU is not a GPU decoder (its pixels would cross back)
    return image.device.type == device.type and (device.index is None or image.device.index == device.index)


def _as_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.zeros(0, dtype=torch.uint8)


_DECODERS: dict[torch.device, JpegDecoder | None] = {}


def jpeg_decoder(device: torch.device | str) -> JpegDecoder | None:
    """The decoder for ``device``: the first library that decodes a test JPEG there; None if none does.

    Examples:
        >>> jpeg_decoder("cpu").name.startswith("libjpeg-turbo through simplejpeg")
        True
    """
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device not in _DECODERS:
        _DECODERS[device] = _first_that_decodes(device)
    return _DECODERS[device]


def _first_that_decodes(device: torch.device) -> JpegDecoder | None:
    probe = cv2.imencode(".jpg", np.full((8, 8, 3), 114, np.uint8))[1].tobytes()
    for make in BACKENDS["cuda" if device.type == "cuda" else "cpu"]:
        found = make()
        if found is None:
            continue
        decoder = JpegDecoder(found[0], found[1], device)
        try:
            image = decoder.decode([probe])[0]
        except Exception:  # noqa: BLE001 (a library that loads but cannot decode here: the next one)
            continue
        if image is not None and tuple(image.shape) == (3, 8, 8) and _on_device(image, device):
            return decoder
    return None


__all__ = ["BACKENDS", "CudaStreams", "JpegDecoder", "NoStreams", "jpeg_decoder"]
