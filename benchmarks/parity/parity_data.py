"""Our augmented training samples against YOLOv5's, in distribution: the same images, the same hyp.

    python benchmarks/parity/parity_data.py --yolov5 ../yolov5 --yolov5-python ../yolov5-venv/bin/python
        [--data runs/parity/data.yaml] [--imgsz 160] [--samples 2000] [--hyp hyp.shapes.yaml]

The two pipelines draw differently (YOLOv5 from Python's and NumPy's global generators, ours from a
generator per sample), so their samples cannot be equal one by one; their statistics can. Each side
draws ``--samples`` training samples (mosaic, random perspective, HSV, flips as the hyp says) from the
train split of ``--data``: YOLOv5's ``utils.dataloaders.LoadImagesAndLabels`` in its own interpreter
(nothing of YOLOv5 is imported into this process), our ``YoloDataset`` here. Printed per side:

- labels per sample (mean), and box width and height in pixels (10th, 50th, 90th percentiles);
- the share of the padding grey (114) in the images;
- sharpness: the mean absolute Laplacian of the grey image (YOLOv5 interpolates a mosaic tile twice,
  resize then warp; we warp once, from the decoded image);
- the mean level of each channel (R, G, B).

Without ``--data``, a synthetic shapes set like parity.py's is made in ``--dir``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: child_env
from child_env import without_checkout  # noqa: E402  (children keep the caller's PYTHONPATH)


def sample_stats(images: list, labels: list, imgsz: int) -> dict:
    """The statistics above, from CHW RGB uint8 arrays and [n, 6] (image, class, xc, yc, w, h) label arrays."""
    import cv2
    import numpy as np

    boxes = np.concatenate([lb[:, 4:6] for lb in labels]) * imgsz if labels else np.zeros((0, 2))
    sharp, pad, means = [], [], []
    for img in images:
        hwc = np.ascontiguousarray(img.transpose(1, 2, 0))
        pad.append(float((hwc == 114).all(2).mean()))
        grey = cv2.cvtColor(hwc, cv2.COLOR_RGB2GRAY)
        sharp.append(float(np.abs(cv2.Laplacian(grey, cv2.CV_32F)).mean()))
        means.append(hwc.reshape(-1, 3).mean(0))
    quantiles = np.percentile(boxes, [10, 50, 90], axis=0) if len(boxes) else np.zeros((3, 2))
    return dict(
        samples=len(images),
        labels_per_sample=float(np.mean([len(lb) for lb in labels])),
        box_w=quantiles[:, 0].tolist(),
        box_h=quantiles[:, 1].tolist(),
        pad_share=float(np.mean(pad)),
        sharpness=float(np.mean(sharp)),
        channel_means=np.mean(means, 0).tolist(),
    )


def yolov5_side(setup_file: Path) -> None:
    """Draw the samples from YOLOv5's dataset (run by YOLOv5's interpreter in its checkout)."""
    import random

    import numpy as np
    import torch

    sys.path.insert(0, os.getcwd())
    from utils.dataloaders import LoadImagesAndLabels  # YOLOv5's, found in its checkout only

    setup = json.loads(setup_file.read_text())
    random.seed(setup["seed"])
    np.random.seed(setup["seed"])
    torch.manual_seed(setup["seed"])
    dataset = LoadImagesAndLabels(
        setup["train"], setup["imgsz"], 16, augment=True, hyp=setup["hyp"], stride=32, prefix="yolov5: "
    )
    order = np.random.permutation(setup["samples"]) % len(dataset)
    images, labels = [], []
    for i in order:
        img, lb, _, _ = dataset[int(i)]
        images.append(img.numpy())
        labels.append(lb.numpy())
    stats = sample_stats(images, labels, setup["imgsz"])
    setup_file.with_name("yolov5_data.json").write_text(json.dumps(stats))


def our_side(setup: dict) -> dict:
    import numpy as np

    from ddp_utils.data import create_dataloader
    from ddp_utils.data.dataset import SampleKey

    _, dataset = create_dataloader(
        setup["train"], setup["imgsz"], 16, 32, hyp=setup["hyp"], augment=True, workers=0, seed=setup["seed"]
    )
    order = np.random.default_rng(setup["seed"]).permutation(setup["samples"]) % len(dataset)
    images, labels = [], []
    for slot, i in enumerate(order):
        img, lb, _, _ = dataset[SampleKey(slot // len(dataset), slot, int(i))]
        images.append(img.numpy())
        labels.append(lb.numpy())
    return sample_stats(images, labels, setup["imgsz"])


def table(ours: dict, theirs: dict) -> str:
    def fmt(v: object) -> str:
        return " / ".join(f"{x:.1f}" for x in v) if isinstance(v, list) else f"{v:.3f}"

    lines = ["| statistic | YOLOv5 | ours |", "|---|---|---|"]
    names = dict(
        labels_per_sample="labels per sample",
        box_w="box width px (p10 / p50 / p90)",
        box_h="box height px (p10 / p50 / p90)",
        pad_share="share of padding grey",
        sharpness="sharpness (mean abs Laplacian)",
        channel_means="mean level R / G / B",
    )
    for key, name in names.items():
        lines.append(f"| {name} | {fmt(theirs[key])} | {fmt(ours[key])} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--yolov5", type=Path, help="an ultralytics/yolov5 checkout (v7.0)")
    add("--yolov5-python", default=None, help="the interpreter that runs YOLOv5 (its own venv); default: this one")
    add("--yolov5-side", type=Path, help=argparse.SUPPRESS)
    add("--data", type=Path, help="a data yaml (parity.py's); default: a synthetic shapes set made in --dir")
    add("--imgsz", type=int, default=160)
    add("--samples", type=int, default=2000)
    add("--seed", type=int, default=0)
    add("--hyp", default="hyp.shapes.yaml")
    add("--dir", type=Path, default=REPO / "runs" / "parity_data")
    args = parser.parse_args(argv)
    if args.yolov5_side is not None:
        yolov5_side(args.yolov5_side)
        return 0
    if args.yolov5 is None or not (args.yolov5 / "train.py").is_file():
        parser.error(f"--yolov5 {args.yolov5}: give an ultralytics/yolov5 checkout (a folder with train.py)")
    sys.path.insert(0, str(REPO))
    from ddp_utils.data import check_dataset
    from ddp_utils.data.synthetic import make_shapes_dataset
    from ddp_utils.hyp import load_hyp

    work = args.dir.resolve()
    work.mkdir(parents=True, exist_ok=True)
    if args.data is None:
        root = work / "shapes"
        if not (root / "shapes.json").is_file():
            make_shapes_dataset(root, 1000, 1, (160, 256), seed=0)
        train = str(root / "images" / "train")
    else:
        train = str(check_dataset(args.data)["train"])
    setup = dict(train=train, imgsz=args.imgsz, samples=args.samples, seed=args.seed, hyp=load_hyp(args.hyp))
    setup_file = work / "setup.json"
    setup_file.write_text(json.dumps(setup))
    env = without_checkout()
    command = [args.yolov5_python or sys.executable, str(Path(__file__).resolve()), "--yolov5-side", str(setup_file)]
    done = subprocess.run(command, cwd=args.yolov5.resolve(), env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"parity_data: YOLOv5's side failed:\n{done.stderr[-3000:]}")
    theirs = json.loads((work / "yolov5_data.json").read_text())
    print(f"{args.samples} augmented samples each, imgsz {args.imgsz}, {Path(args.hyp).name}, from {train}\n")
    print(table(our_side(setup), theirs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
