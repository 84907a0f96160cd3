"""How long the COCO evaluation and NMS of one validation pass take on the CPU.

    python benchmarks/speed/detect_metrics.py --images 1000 --dets 300

Random predictions (the first of each image a near-hit) over images of up to 9 labels,
80 classes: the shape of a COCO val pass with conf_thres=0.001.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from ddp_utils.yolo import ImageRecord, coco_metrics, non_max_suppression


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--dets", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)

    records = []
    for i in range(args.images):
        n = int(rng.integers(1, 10))
        xy, wh = rng.uniform(0, 500, (n, 2)), rng.uniform(10, 100, (n, 2))
        labels = np.concatenate([rng.integers(0, 80, (n, 1)), xy, xy + wh], 1).astype(np.float32)
        pxy, pwh = rng.uniform(0, 500, (args.dets, 2)), rng.uniform(10, 100, (args.dets, 2))
        scores, classes = rng.uniform(0, 1, (args.dets, 1)), rng.integers(0, 80, (args.dets, 1))
        preds = np.concatenate([pxy, pxy + pwh, scores, classes], 1).astype(np.float32)
        preds[:n, :4], preds[:n, 5] = labels[:, 1:] + 1, labels[:, 0]
        records.append(ImageRecord(f"{i}.jpg", 640, 640, labels, preds))
    start = time.perf_counter()
    metrics = coco_metrics(records, max_dets=args.dets)
    seconds = time.perf_counter() - start
    print(f"coco_metrics: {args.images} images x {args.dets} detections in {seconds:.2f} s  {metrics}")

    raw = torch.rand(16, 25200, 85)  # a 640 px batch of 16 from yolov5s, worst case: scores all uniform
    raw[..., :4] *= 640
    start = time.perf_counter()
    non_max_suppression(raw, conf_thres=0.001, iou_thres=0.6, multi_label=True, max_det=300)
    seconds = time.perf_counter() - start
    print(f"non_max_suppression: batch 16 x 25200 candidates, 80 classes in {seconds:.2f} s (worst case)")


if __name__ == "__main__":
    main()
