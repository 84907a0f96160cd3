"""The device path's JPEG decoder (``decode.py``): the guard's order, a refused batch halved, the library chosen.

The guard cannot corrupt anything on the CPU (no streams); what is tested here is that its order is the one the
module states, with a stand-in decoder that records what ran before it: the decode runs inside the decoder's own
stream, and its outputs are handed to the caller's stream (an event waited for, each output marked as used
there) after it, before the caller sees them. ``benchmarks/gpu/decode_order.py`` reproduces the corruption on a
GPU and counts it (0 through this guard).
"""

from __future__ import annotations

import contextlib

import cv2
import numpy as np
import pytest
import torch

import ddp_utils.data.device.decode as decode
from ddp_utils.data.device.decode import JpegDecoder, jpeg_decoder


def jpeg(value: int, shape=(6, 8)) -> bytes:
    return cv2.imencode(".jpg", np.full((*shape, 3), value, np.uint8))[1].tobytes()


class RecordingStreams:
    """Stands in for the CUDA side of the guard: says when the decoder's stream is entered, left, handed over."""

    def __init__(self, log: list) -> None:
        self.log = log

    @contextlib.contextmanager
    def decoding(self):
        self.log.append("enter the decoder's stream")
        yield
        self.log.append("leave the decoder's stream")

    def hand_over(self, outputs) -> None:
        self.log.append(f"the caller's stream waits for the decode; {len(outputs)} outputs marked as used there")


def test_the_decode_runs_on_its_own_stream_and_is_handed_over_before_the_caller_sees_it():
    log = []

    def backend(datas, device, paths):
        log.append(f"decode {len(datas)}")
        return [torch.zeros(3, 2, 2, dtype=torch.uint8) for _ in datas]

    decoder = JpegDecoder(backend, "stand-in", torch.device("cpu"), streams=RecordingStreams(log))
    images = decoder.decode([jpeg(1), jpeg(2)])
    log.append("the caller reads")
    assert len(images) == 2
    assert log == [
        "enter the decoder's stream",
        "decode 2",
        "leave the decoder's stream",
        "the caller's stream waits for the decode; 2 outputs marked as used there",
        "the caller reads",
    ]


@pytest.mark.parametrize(
    "refusal",
    [RuntimeError("Image is incomplete or truncated"), ValueError("bad marker"), OSError(5, "I/O"), KeyError(0)],
    ids=lambda e: type(e).__name__,
)
def test_a_refused_batch_is_halved_so_only_the_bad_file_costs_more(refusal):
    # whatever a library raises for a file (torch's AcceleratorError, an OSError, a KeyError...): the batch is halved
    calls = []
    real = jpeg_decoder("cpu").backend

    def backend(datas, device, paths):
        calls.append(list(paths))
        if "bad" in paths:
            raise refusal  # a batched library fails the whole call
        return real(datas, device, paths)

    names = [f"f{k}" for k in range(7)] + ["bad"]
    decoder = JpegDecoder(backend, "stand-in", torch.device("cpu"), streams=decode.NoStreams())
    images = decoder.decode([jpeg(10 * k) for k in range(7)] + [b"\xff\xd8\xff"], names)
    assert [image is None for image in images] == [False] * 7 + [True]
    assert int(images[3][0, 0, 0]) == 30
    # the whole batch, then halves down to the file: log2(8) + 1 calls hold it, 2 per level at most
    assert calls[0] == names and calls[-1] == ["bad"] and len(calls) <= 1 + 2 * 3
    assert sum(len(c) for c in calls[1:] if "bad" not in c) == 7  # each good file decoded once more, no more


def test_the_cpu_decoder_is_the_cpu_paths_and_gives_its_pixels(tmp_path):
    decoder = jpeg_decoder("cpu")
    assert decoder is jpeg_decoder(torch.device("cpu")) and decoder.name.startswith("libjpeg-turbo through simplejpeg")
    image = np.random.default_rng(0).integers(0, 256, (30, 40, 3), dtype=np.uint8)
    path = tmp_path / "a.jpg"
    cv2.imwrite(str(path), image)
    (decoded,) = decoder.decode([path.read_bytes()], [str(path)])
    from ddp_utils.data.images import read_image

    assert decoded.shape == (3, 30, 40) and decoded.dtype == torch.uint8
    assert np.array_equal(decoded.permute(1, 2, 0).numpy()[:, :, ::-1], read_image(path))  # the workers' pixels


def test_a_library_that_cannot_decode_here_is_passed_over(monkeypatch):
    def broken():
        def backend(datas, device, paths):
            raise OSError("no such library")

        return backend, "broken"

    monkeypatch.setattr(decode, "_DECODERS", {})
    monkeypatch.setitem(decode.BACKENDS, "cpu", [lambda: None, broken, decode._torchcodec_backend])
    decoder = jpeg_decoder("cpu")
    assert decoder is not None and "TorchCodec" in decoder.name
    monkeypatch.setattr(decode, "_DECODERS", {})
    monkeypatch.setitem(decode.BACKENDS, "cpu", [broken])
    assert jpeg_decoder("cpu") is None


def test_a_library_whose_pixels_land_elsewhere_is_no_decoder_for_the_device(monkeypatch):
    # TorchCodec without its CUDA decoder may hand back host tensors when asked for the GPU: not a GPU decoder
    def elsewhere():
        def backend(datas, device, paths):
            return [torch.zeros((3, 8, 8), dtype=torch.uint8, device="meta") for _ in datas]

        return backend, "elsewhere"

    monkeypatch.setattr(decode, "_DECODERS", {})
    monkeypatch.setitem(decode.BACKENDS, "cpu", [elsewhere])
    assert jpeg_decoder("cpu") is None
    monkeypatch.setattr(decode, "_DECODERS", {})
    monkeypatch.setitem(decode.BACKENDS, "cpu", [elsewhere, decode._simplejpeg_backend])
    assert jpeg_decoder("cpu").name.startswith("libjpeg-turbo through simplejpeg")


@pytest.mark.parametrize("make", [decode._torchcodec_backend, decode._torchvision_backend])
def test_the_batched_libraries_decode_the_same_pixels_on_the_cpu(make):
    backend, name = make()
    datas = [torch.frombuffer(bytearray(jpeg(v, (9, 7))), dtype=torch.uint8) for v in (0, 90, 255)]
    images = backend(datas, torch.device("cpu"), ["a", "b", "c"])
    reference = jpeg_decoder("cpu").decode(datas)
    assert all(torch.equal(a, b) for a, b in zip(images, reference)), name
