"""The device path's kernel budget: how many kernels rendering one training batch launches, and its host waits.

With ``--augment-on device`` the training process decodes and augments each batch on the GPU
(``ddp_utils/data/device_augment.py``), in the prefetcher's side stream beside the step. On a GPU each
non-view aten op is (at least) one kernel launch, issued by the host: the render must cost the host
far less than a step, and must never wait for the device. Both are counted here on the CPU, with the
dispatch mode of ``tests/hostwait.py``: a batch of recipes is planned from a synthetic dataset as the
loader's workers plan it and rendered through :class:`~ddp_utils.data.DevicePrefetcher`; the decode
itself (``torchvision.io.decode_jpeg``, nvJPEG's batched call on CUDA) is one torchvision op, not
counted. Also printed: the CPU seconds of the render (its torch ops on the CPU) and of the OpenCV path
for the same samples, for what they say on this CPU only.

Run:  python benchmarks/speed/render_ops.py                       (yolov5s's setting: 640 px, batch 64)
      python benchmarks/speed/render_ops.py --imgsz 64 --batch 4  (a smoke run)
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/speed/: step_ops
from step_ops import _counter_class  # noqa: E402  (tests/hostwait.py's counter, loaded by path)

from ddp_utils.data import DevicePrefetcher, find_images, load_hyp, load_labels, make_shapes_dataset  # noqa: E402
from ddp_utils.data.dataset import SampleKey, YoloDataset  # noqa: E402
from ddp_utils.data.recipes import RecipeCollate, plan_sample  # noqa: E402


def parse_opt(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--hyp", default="hyp.scratch-low.yaml")
    parser.add_argument("--sides", type=int, nargs=2, default=None, help="image sides (default 0.75-1x imgsz)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    opt = parse_opt(argv)
    sides = opt.sides or (opt.imgsz * 3 // 4, opt.imgsz)
    with tempfile.TemporaryDirectory() as tmp:
        root = make_shapes_dataset(Path(tmp) / "shapes", max(opt.batch, 8), 0, size=tuple(sides))
        labels = load_labels(find_images(root / "images" / "train"))
        dataset = YoloDataset(labels, opt.imgsz, opt.batch, augment=True, hyp=load_hyp(opt.hyp), seed=0)
        keys = [SampleKey(0, slot, slot % len(dataset)) for slot in range(opt.batch)]
        start = time.perf_counter()
        dataset.__getitems__(keys)
        cpu_path = time.perf_counter() - start
        batch = (RecipeCollate(dataset)([plan_sample(dataset, key) for key in keys])[0], torch.zeros(0, 6), (), ())
        next(iter(DevicePrefetcher([batch], torch.device("cpu"), channels_last=True)))  # warm
        with _counter_class()() as counter:
            next(iter(DevicePrefetcher([batch], torch.device("cpu"), channels_last=True)))
        start = time.perf_counter()
        next(iter(DevicePrefetcher([batch], torch.device("cpu"), channels_last=True)))
        render = time.perf_counter() - start
        sources = len(batch[0].sources)
    result = dict(imgsz=opt.imgsz, batch=opt.batch, images_decoded=sources, kernels=counter.ops,
                  host_waits=len(counter.waits), render_cpu_s=render, opencv_path_cpu_s=cpu_path)  # fmt: skip
    print(f"render of a batch of {opt.batch} at {opt.imgsz} px ({sources} images decoded in one call):")
    print(f"  {counter.ops} kernels (non-view aten ops), {len(counter.waits)} host waits")
    print(f"  on this CPU: the render {render:.3f} s, the OpenCV path for the same samples {cpu_path:.3f} s")
    print("RESULT " + json.dumps(result))
    return result


if __name__ == "__main__":
    main()
