"""The training loader alone, as train.py feeds the step on a GPU and nothing else: ``create_dataloader(...,
augment_on="device")`` (the workers send recipes and JPEG bytes; the batch is decoded and rendered on the device)
wrapped in ``DevicePrefetcher(loader, device, channels_last=True)``, one epoch to warm up (workers, decoder, any
compiled render), then one timed epoch.

Figures: images/s of the timed epoch (every batch taken on the device, the device waited for at the end); the
warm epoch's seconds; the render's device memory, the peak allocated during the timed epoch above what was
allocated before it (``torch.cuda.max_memory_allocated``; on the CPU there is none: null), also as a multiple of
the batch's uint8 output (batch x 3 x imgsz x imgsz bytes). The last line is ``LOADER {json}``.

Run:  python benchmarks/gpu/loader_alone.py --images DIR --imgsz 640 --batch 64 --workers 8 --device 0
      python benchmarks/gpu/loader_alone.py --images DIR --imgsz 64 --batch 4 --workers 0 --device cpu
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def device_of(name: str) -> torch.device:
    return torch.device("cpu") if name == "cpu" else torch.device("cuda", int(name) if name.isdigit() else 0)


def _finished(device: torch.device) -> float:
    """A timestamp once the device has finished (a deliberate wait: this is a measurement)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def one_epoch(loader, device: torch.device, epoch: int) -> tuple[int, float]:
    """(images, seconds) of one epoch through the prefetcher, as train.py takes it."""
    from ddp_utils.data import DevicePrefetcher

    if hasattr(loader, "set_epoch"):
        loader.set_epoch(epoch)
    start, images = _finished(device), 0
    for imgs, *_ in DevicePrefetcher(loader, device, channels_last=True):
        images += imgs.shape[0]
    return images, _finished(device) - start


def measure(images_dir: Path, imgsz: int, batch: int, workers: int, device: torch.device) -> dict:
    """The warm epoch, then the timed one; the figures of the module's docstring."""
    from ddp_utils.data import create_dataloader, load_hyp, renderer_for
    from ddp_utils.data.device.kernel_cache import kernels_for

    hyp = load_hyp("hyp.scratch-low.yaml")
    if device.type == "cpu":  # the CPU smoke: the kernels uncompiled (a compile would outlast the part's budget)
        renderer_for(device, compiled=False)
    else:  # the compiled kernels ready before the warm epoch (made by the check's first step: loaded at once)
        renderer_for(device).kernels.wait(kernels_for(channels_last=True, mixup=hyp["mixup"] > 0), 300)
    options = dict(hyp=hyp, augment=True, workers=workers, shuffle=True, augment_on="device")
    loader, _ = create_dataloader(images_dir, imgsz, batch, 32, **options)
    try:
        _, warm_seconds = one_epoch(loader, device, 0)
        cuda = device.type == "cuda"
        if cuda:
            torch.cuda.synchronize(device)  # a deliberate wait: the baseline is read with nothing in flight
            before = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
        count, seconds = one_epoch(loader, device, 1)
        peak = torch.cuda.max_memory_allocated(device) - before if cuda else None
    finally:
        close = getattr(loader, "close", None)
        if close is not None:
            close()
    output = batch * 3 * imgsz * imgsz
    kernels = renderer_for(device).kernels
    return dict(
        kernels=kernels.state() if kernels is not None else "uncompiled",
        img_s=count / seconds,
        epoch_s=seconds,
        warm_epoch_s=warm_seconds,
        images=count,
        render_peak_bytes=peak,
        render_peak_over_output=None if peak is None else peak / output,
    )


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=Path, required=True, help="the training images (YOLO layout: ../labels)")
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--device", default="0", help="cuda index, or cpu")
    opt = parser.parse_args(argv)
    result = measure(opt.images, opt.imgsz, opt.batch, opt.workers, device_of(opt.device))
    print("LOADER " + json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
