"""Does a JPEG decode write into memory that work queued on the caller's stream still reads? The case of
pytorch/vision PR 9606's reproduction, written here for the GPU check.

Each iteration fills one tensor per JPEG of the batch, as large as that image decoded, with a known value and waits
for the device (the bytes are in place); queues a long kernel (``torch.cuda._sleep``) and then one sum per tensor on
the current stream; frees the tensors while those sums still wait to read them (the caching allocator hands their
blocks to the next allocation on this stream); decodes the batch; waits; and counts the sums that differ from
value x size. Nothing in it is racy by itself: a sum comes out wrong only if the decode wrote into a block before
the queued sum had read it.

Decoders (variants), taken in turn so that each gets as many iterations as the time allows (at most
``--iterations``):

- ``none``: no decode, the harness's own control (0, or the harness is wrong);
- ``ours``: ``ddp_utils.data.device.decode.jpeg_decoder(device).decode``, the guarded decode (must be 0);
- ``torchvision``: ``torchvision.io.decode_jpeg(list, device=...)``, the raw batched call, the positive control
  (134 of 200 on an H100 in that PR: expected > 0 on a card with nvJPEG's hardware engine);
- ``torchcodec``: ``torchcodec.decoders.decode_jpeg(list, device=...)`` where it imports (it waits for the caller's
  stream since meta-pytorch/torchcodec PR 1634).

On the CPU (``--cpu-smoke``) the same logic runs tiny with the CPU decoders: no stream, nothing queued, 0 each.
The last line is ``DECODE_ORDER {json}``.

Run:  python benchmarks/gpu/decode_order.py --images DIR --device 0 --seconds 20
      python benchmarks/gpu/decode_order.py --images DIR --cpu-smoke
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

Decode = Callable[[list[torch.Tensor]], object]
SLEEP_MS = (5.0, 4.0)  # the queued kernel lasts at least 5 ms and at least 4x the batch's decode


class Queue:
    """Work queued on the device's current stream: a long kernel then the reads; :meth:`wait` for all of it."""

    def __init__(self, device: torch.device, sleep_cycles: int = 0) -> None:
        self.device, self.sleep_cycles = device, sleep_cycles

    def read_later(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Each tensor's sum, queued behind the long kernel (on the CPU: now)."""
        if self.device.type == "cuda" and self.sleep_cycles:
            torch.cuda._sleep(self.sleep_cycles)
        return [tensor.sum() for tensor in tensors]

    def wait(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # a deliberate wait: the check reads the sums

    def results(self, sums: list[torch.Tensor]) -> list[int]:
        return [int(value) for value in sums]


def corrupted_in_one(decode: Decode | None, datas: list, sizes: list[int], queue: Queue, seed: int) -> int:
    """One iteration: the sums that came out wrong (fill, wait, queue the reads, free, decode, wait, compare)."""
    values = [(seed * 31 + k) % 250 + 1 for k in range(len(sizes))]
    tensors = [torch.full((size,), value, dtype=torch.uint8, device=queue.device) for size, value in zip(sizes, values)]
    queue.wait()  # the fills are done: every byte holds its value before the reads are queued
    sums = queue.read_later(tensors)
    del tensors  # freed while the reads are still queued: their blocks go back to this stream's pool
    outputs = decode(datas) if decode is not None else None
    queue.wait()
    del outputs
    expected = [value * size for value, size in zip(values, sizes)]
    return sum(got != want for got, want in zip(queue.results(sums), expected))


def decoders(device: torch.device) -> dict[str, tuple[Decode | None, str]]:
    """Each variant's decode and its description; a variant that cannot load says why instead."""
    found: dict[str, tuple[Decode | None, str]] = {"none": (None, "no decode (the harness's control)")}
    try:
        from ddp_utils.data.device.decode import jpeg_decoder

        ours = jpeg_decoder(device)
        found["ours"] = (ours.decode, ours.name)
    except Exception as exc:  # not in this checkout, or no decoder loads here: the row says which
        found["ours"] = (_fails(exc), f"unavailable: {type(exc).__name__}: {exc}")
    from torchvision.io import ImageReadMode, decode_jpeg

    found["torchvision"] = (
        lambda datas: decode_jpeg(datas, mode=ImageReadMode.RGB, device=device),
        f"torchvision.io.decode_jpeg (torchvision {_version('torchvision')})",
    )
    try:
        from torchcodec.decoders import decode_jpeg as codec_decode

        found["torchcodec"] = (
            lambda datas: codec_decode(list(datas), device=device),
            f"torchcodec.decoders.decode_jpeg (torchcodec {_version('torchcodec')})",
        )
    except Exception as exc:
        found["torchcodec"] = (_fails(exc), f"unavailable: {type(exc).__name__}: {exc}")
    return found


def _fails(exc: Exception) -> Decode:
    def decode(datas: list[torch.Tensor]) -> object:
        raise exc

    return decode


def _version(name: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return "?"


def sleep_cycles(device: torch.device, decode_seconds: float) -> tuple[int, float]:
    """Cycles of ``torch.cuda._sleep`` that last max(5 ms, 4x the decode), calibrated on this card; and the ms."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    probe = 10_000_000
    torch.cuda._sleep(probe)  # the first launch loads the kernel
    start.record()
    torch.cuda._sleep(probe)
    end.record()
    end.synchronize()  # a deliberate wait: this is a calibration
    per_ms = probe / max(start.elapsed_time(end), 1e-3)
    ms = max(SLEEP_MS[0], SLEEP_MS[1] * decode_seconds * 1000)
    return int(per_ms * ms), ms


def read_batch(images: Path, n: int) -> tuple[list[torch.Tensor], list[int]]:
    """``n`` JPEGs of ``images`` as uint8 tensors of their bytes, and each one's decoded size in bytes (3 x h x w)."""
    from torchvision.io import ImageReadMode, decode_jpeg

    paths = sorted(images.glob("*.jpg"))[:n]
    if not paths:
        raise FileNotFoundError(f"{images}: no .jpg files to decode")
    datas = [torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8) for path in paths]
    with warnings.catch_warnings():  # torchvision's decoders are deprecated: used here on purpose
        warnings.simplefilter("ignore")
        sizes = [decode_jpeg(data, mode=ImageReadMode.RGB).numel() for data in datas]
    return datas, sizes


def warm(decode: Decode | None, datas: list[torch.Tensor], device: torch.device) -> float:
    """One untimed decode (nvJPEG's start-up), then the seconds one decode of the batch takes."""
    if decode is None:
        return 0.0
    decode(datas)
    Queue(device).wait()
    start = time.perf_counter()
    decode(datas)
    Queue(device).wait()
    return time.perf_counter() - start


def reproduce(datas: list, sizes: list[int], device: torch.device, iterations: int, seconds: float) -> dict:
    """Every variant in turn until ``iterations`` each or ``seconds`` are spent; the counts per variant."""
    with warnings.catch_warnings():  # torchvision's decoders are deprecated: measured here on purpose
        warnings.simplefilter("ignore")
        return _reproduce(datas, sizes, device, iterations, seconds)


def _reproduce(datas: list, sizes: list[int], device: torch.device, iterations: int, seconds: float) -> dict:
    deadline = time.monotonic() + seconds
    rows, ready, slowest = {}, {}, 0.0
    for name, (decode, description) in decoders(device).items():
        try:
            slowest = max(slowest, warm(decode, datas, device))
            ready[name] = decode
            rows[name] = dict(decoder=description, corrupted=0, iterations=0)
        except Exception as exc:
            rows[name] = dict(decoder=description, error=f"{type(exc).__name__}: {str(exc)[:200]}")
    cycles, sleep_ms = sleep_cycles(device, slowest) if device.type == "cuda" else (0, 0.0)
    queue = Queue(device, cycles)
    for i in range(iterations):
        if time.monotonic() > deadline:
            break
        for name, decode in ready.items():
            rows[name]["corrupted"] += corrupted_in_one(decode, datas, sizes, queue, seed=i)
            rows[name]["iterations"] += 1
    return dict(device=str(device), images=len(datas), sleep_ms=round(sleep_ms, 2), variants=rows)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=Path, required=True, help="a directory of JPEGs (the check's train images)")
    parser.add_argument("--device", default="0", help="cuda index (the CPU with --cpu-smoke)")
    parser.add_argument("--batch", type=int, default=8, help="JPEGs decoded together each iteration")
    parser.add_argument("--iterations", type=int, default=200, help="at most this many per variant")
    parser.add_argument("--seconds", type=float, default=20.0, help="stop iterating after this long")
    parser.add_argument("--cpu-smoke", action="store_true", help="the logic, tiny, with the CPU decoders")
    opt = parser.parse_args(argv)
    if opt.cpu_smoke:
        opt.batch, opt.iterations = 2, 3
    device = torch.device("cpu") if opt.cpu_smoke else torch.device("cuda", int(opt.device))
    datas, sizes = read_batch(opt.images, opt.batch)
    result = reproduce(datas, sizes, device, opt.iterations, opt.seconds)
    print("DECODE_ORDER " + json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
