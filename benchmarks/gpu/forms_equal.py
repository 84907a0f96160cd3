"""Do the device render's two forms make the same images on this device? The compiled kernels against their
uncompiled form, batch by batch, over real training batches: the count of values that differ (must be 0).

A run renders uncompiled until its compiled kernels are ready, then compiled (``ddp_utils/data/device/compiled.py``):
where the switch falls is a matter of time, so it must change nothing. On the CPU the tests hold the two equal bit
for bit (``tests/data/device/test_compiled.py``); on a card the compiled kernels are Triton's, and this counts it.

The batches: ``create_dataloader(..., augment_on="device")`` over the training images, ``hyp.scratch-low.yaml``'s
augmentation (mosaics, HSV, flips) with mixups (0.1), rotation, shear, perspective and up-down flips added, so every
kernel and every branch of them runs; each batch rendered by both forms as float32 ``channels_last`` (what the step
takes). Printed: batches, values compared, values that differ, the largest difference, and each form's time per batch.
The last line is ``FORMS {json}``.

Run:  python benchmarks/gpu/forms_equal.py --images DIR --device 0                    (50 batches of 16 at 640 px)
      python benchmarks/gpu/forms_equal.py --images DIR --device cpu --imgsz 64 --batch 4 --batches 4
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch


def _finished(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # a deliberate wait: this is a measurement
    return time.perf_counter()


def compare(opt: argparse.Namespace) -> dict:
    from ddp_utils.data import create_dataloader, load_hyp
    from ddp_utils.data.device.kernel_cache import kernels_for
    from ddp_utils.data.device.render import Renderer

    device = torch.device("cpu") if opt.device == "cpu" else torch.device("cuda", int(opt.device))
    hyp = dict(load_hyp("hyp.scratch-low.yaml"), mixup=opt.mixup, degrees=10.0, shear=3.0, perspective=5e-4, flipud=0.3)
    compiled, uncompiled = Renderer(device), Renderer(device, compiled=False)
    kernels = kernels_for(channels_last=True, mixup=opt.mixup > 0)
    start = time.perf_counter()
    ready = compiled.kernels.wait(kernels, opt.compile_timeout)
    figures = dict(kernels=compiled.kernels.state(), compile_wait_s=time.perf_counter() - start)
    if not ready:
        return dict(figures, error="the compiled kernels are not ready")
    loader, _ = create_dataloader(opt.images, opt.imgsz, opt.batch, 32, hyp=hyp, augment=True, shuffle=True,
                                  workers=opt.workers, augment_on="device")  # fmt: skip
    batches = values = differ = 0
    worst, took = 0.0, {"compiled": 0.0, "uncompiled": 0.0}
    try:
        epoch = 0
        while batches < opt.batches:
            loader.set_epoch(epoch)
            for recipes, *_ in loader:
                images = {}
                for name, renderer in (("compiled", compiled), ("uncompiled", uncompiled)):
                    begun = _finished(device)
                    images[name] = renderer(recipes, to_float=True, channels_last=True)
                    took[name] += _finished(device) - begun
                diff = (images["compiled"] - images["uncompiled"]).abs()
                batches, values = batches + 1, values + diff.numel()
                differ += int((diff != 0).sum())  # read once a batch: this is a measurement
                worst = max(worst, float(diff.max()))
                if batches >= opt.batches:
                    break
            epoch += 1
    finally:
        loader.close()
    fell_back = [name for name, state in compiled.kernels.state().items() if state != "loaded"]
    per_batch = {f"{name}_s_per_batch": seconds / batches for name, seconds in took.items()}
    return dict(figures, batches=batches, values=values, differing=differ, max_abs=worst, fell_back=fell_back,
                **per_batch)  # fmt: skip


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=Path, required=True, help="the training images (YOLO layout: ../labels)")
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--batches", type=int, default=50, help="batches compared, at least")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--mixup", type=float, default=0.1, help="the hyp's mixup (0: the mixups' kernel left out)")
    parser.add_argument("--device", default="0", help="cuda index, or cpu")
    parser.add_argument("--compile-timeout", type=float, default=600, help="seconds to wait for the compiled kernels")
    opt = parser.parse_args(argv)
    result = compare(opt)
    print("FORMS " + json.dumps(result), flush=True)
    return result


if __name__ == "__main__":
    main()
