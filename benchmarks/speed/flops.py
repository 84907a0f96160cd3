"""How do thop and FlopCounterMode compare with the published GFLOPs, and how fast is YOLOv5s?

    python benchmarks/speed/flops.py                         # yolov5n, yolov5s; profile yolov5s on cpu (+ cuda:0)
    python benchmarks/speed/flops.py --models all            # all five sizes
    python benchmarks/speed/flops.py --torchvision resnet18  # no detector needed: torchvision's published numbers

Part 1 counts each detector, fused as YOLOv5 publishes it (Conv+BN folded), at 640 x 640,
batch 1, with both counters, next to YOLOv5's table (parameters in millions, GFLOPs =
2 x MACs), then prints model_info's YOLOv5-style summary line before and after fusing.
Part 2 times forward and backward of the training model (train mode, unfused) with
ddp_utils.profiling.profile on the CPU and, when there is one, the first GPU.

With --torchvision the same two parts run on a torchvision model; its "published" column
is the weights' metadata ``_ops`` (torchvision's GFLOPS, which count multiply-adds), doubled
to the 2 x MACs convention.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout's ddp_utils, installed or not
from ddp_utils.profiling import flops, format_table, model_info, profile  # noqa: E402

# YOLOv5 v7.0 README: params (M), GFLOPs at 640 (fused)
PUBLISHED = {
    "yolov5n": (1.9, 4.5),
    "yolov5s": (7.2, 16.5),
    "yolov5m": (21.2, 49.0),
    "yolov5l": (46.5, 109.1),
    "yolov5x": (86.7, 205.7),
}


def detector(name: str, fused: bool) -> nn.Module:
    from ddp_utils.yolo.model import Model  # the part of this benchmark that needs the detector

    model = Model(f"{name}.yaml", ch=3, nc=None)
    return model.eval().fuse() if fused else model


def torchvision_model(name: str) -> tuple[nn.Module, tuple[float | None, float | None]]:
    import torchvision

    model = torchvision.models.get_model(name, weights=None)
    try:
        meta = torchvision.models.get_model_weights(name).DEFAULT.meta
        published = (meta["num_params"] / 1e6, 2 * meta["_ops"])
    except (ValueError, KeyError, AttributeError):
        published = (None, None)
    return model, published


def _num(value: float | None, fmt: str = ".1f") -> str:
    return "-" if value is None else format(value, fmt)


def compare(name: str, model: nn.Module, published: tuple[float | None, float | None], imgsz: int) -> str:
    """One table row: parameters and GFLOPs by both counters beside the published ones."""
    params = sum(p.numel() for p in model.parameters()) / 1e6
    start = time.perf_counter()
    report = flops(model, imgsz=imgsz)
    seconds = time.perf_counter() - start
    pub_params, pub_gflops = published
    diff = None if pub_gflops is None else 100 * (report.gflops / pub_gflops - 1)
    missed = "; ".join(report.thop_uncounted) or "-"
    return (
        f"| {name} | {params:.2f} | {_num(pub_params)} | {_num(report.thop_gflops, '.2f')} | "
        f"{_num(report.torch_gflops, '.2f')} | {_num(pub_gflops, '.2f')} | {_num(diff, '+.1f')} | "
        f"{seconds:.1f} | {missed} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="yolov5n,yolov5s", help='comma list of yolov5 sizes, or "all"')
    parser.add_argument("--torchvision", metavar="NAME", help="use this torchvision model instead of the detector")
    parser.add_argument("--imgsz", type=int, default=640)
    parser.add_argument("--profile-model", default="yolov5s", help="detector to time forward/backward")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per device (median reported)")
    parser.add_argument("--device", default=None, help='devices to time on; default "cpu" plus "0" if CUDA is there')
    opt = parser.parse_args()

    print(f"torch {torch.__version__}, {torch.get_num_threads()} CPU threads, CUDA: {torch.cuda.is_available()}")
    header = (
        "| model | params (M) | published (M) | thop GFLOPs | FlopCounterMode GFLOPs | published GFLOPs "
        "| headline vs published (%) | count time (s) | thop did not count |"
    )
    print(f"\nFLOPs at {opt.imgsz} x {opt.imgsz}, batch 1\n{header}\n|{'---|' * 9}")
    if opt.torchvision:
        model, published = torchvision_model(opt.torchvision)
        print(compare(opt.torchvision, model.eval(), published, opt.imgsz))
        timed, timed_name = model.train(), opt.torchvision
    else:
        names = list(PUBLISHED) if opt.models == "all" else [m.strip() for m in opt.models.split(",")]
        for name in names:
            print(compare(f"{name} (fused)", detector(name, fused=True), PUBLISHED.get(name, (None, None)), opt.imgsz))
        print("\nmodel_info, YOLOv5's summary line (built, then fused with its parameters frozen as a release's are):")
        for name in names:
            model = detector(name, fused=False)
            print(model_info(model, imgsz=opt.imgsz)["summary"])
            print(model_info(model.eval().fuse().requires_grad_(False), imgsz=opt.imgsz)["summary"])
        timed, timed_name = detector(opt.profile_model, fused=False).train(), opt.profile_model

    device = opt.device or ("cpu,0" if torch.cuda.is_available() else "cpu")
    x = torch.rand(1, 3, opt.imgsz, opt.imgsz)
    print(f"\nforward/backward of {timed_name} (train mode, batch 1, {opt.imgsz} px), median of {opt.repeats}:")
    print(format_table(profile(x, timed, n=opt.repeats, device=device)))


if __name__ == "__main__":
    main()
