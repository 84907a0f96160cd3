"""Validation batches with known answers, and the evaluate() run of each rank (see tests/multiproc.py).

The batches follow the val loader's format: letterboxed uint8 images, normalised targets,
paths, and ``shapes`` that undo the letterbox. :class:`PredictionStub` plays a detector whose
eval-mode output is a chosen set of detections per image (it recognises the image by a
pixel that holds its index) and whose raw level outputs come from a real tiny model, so the
validation loss is real too.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch
from torch import nn

IMG = 64  # letterboxed input size
ORIGINAL = (96, 128)  # (h0, w0): letterboxed by gain 0.5 into 48 x 64, padded 8 px top and bottom
RATIO_PAD = ((0.5, 0.5), (0, 8))
NC = 3


def tiny_model_cfg() -> dict:
    from ddp_utils.yolo import load_model_yaml

    cfg, _ = load_model_yaml("yolov5n.yaml")
    return {**cfg, "width_multiple": 0.0625, "nc": NC}


def make_images(n_images: int, seed: int = 0, jitter: float = 2.0, misses: bool = True):
    """Per image: its targets (cls, xc, yc, w, h normalised to the input) and its detections (input pixels).

    Detections sit ``jitter`` px from their object at falling confidences; with ``misses`` a few
    objects get no detection and a few detections match nothing, so the metrics lie strictly
    between 0 and 1.
    """
    rng = np.random.default_rng(seed)
    images = []
    for _ in range(n_images):
        labels, detections = [], []
        for _ in range(int(rng.integers(1, 4))):
            w, h = rng.uniform(8, 24, 2)
            xc = rng.uniform(w / 2, IMG - w / 2)
            yc = rng.uniform(8 + h / 2, IMG - 8 - h / 2)  # inside the letterboxed picture
            cls = int(rng.integers(0, NC))
            labels.append([cls, xc / IMG, yc / IMG, w / IMG, h / IMG])
            if misses and rng.random() < 0.2:
                continue
            dx, dy = rng.uniform(-jitter, jitter, 2)
            detections.append([xc + dx, yc + dy, w, h, float(rng.uniform(0.3, 1.0)), cls])
        if misses and rng.random() < 0.5:
            detections.append(
                [*rng.uniform(10, 54, 2), 10.0, 10.0, float(rng.uniform(0.3, 1.0)), int(rng.integers(NC))]
            )
        images.append((np.array(labels, np.float32).reshape(-1, 5), np.array(detections, np.float32).reshape(-1, 6)))
    return images


def make_batches(images, batch_size: int, start: int = 0, stop: int | None = None):
    """The val loader's batches over images[start:stop], image i carrying its index in pixel (0, 0, 0)."""
    indices = list(range(len(images)))[start:stop]
    batches = []
    for b in range(0, len(indices), batch_size):
        chunk = indices[b : b + batch_size]
        imgs = torch.zeros((len(chunk), 3, IMG, IMG), dtype=torch.uint8)
        targets = []
        for j, index in enumerate(chunk):
            imgs[j, 0, 0, 0] = index
            labels = images[index][0]
            targets.extend([[j, *row] for row in labels.tolist()])
        paths = tuple(f"/data/images/val/{index:04d}.jpg" for index in chunk)
        shapes = tuple((ORIGINAL, RATIO_PAD) for _ in chunk)
        batches.append((imgs, torch.tensor(targets, dtype=torch.float32).reshape(-1, 6), paths, shapes))
    return batches


class PredictionStub(nn.Module):
    """Eval-mode output: the chosen detections of each image, and a real tiny model's raw outputs."""

    def __init__(self, images, net: nn.Module | None = None, rows: int = 8) -> None:
        super().__init__()
        self.net = net if net is not None else nn.Conv2d(3, 1, 1)
        table = torch.zeros((len(images), rows, 5 + NC))
        for index, (_, detections) in enumerate(images):
            for r, (x, y, w, h, conf, cls) in enumerate(detections.tolist()):
                table[index, r, :5] = torch.tensor([x, y, w, h, conf])
                table[index, r, 5 + int(cls)] = 1.0
        self.register_buffer("table", table)

    def forward(self, x: torch.Tensor):
        index = (x[:, 0, 0, 0] * 255).round().long()
        out = self.net(x)
        return self.table[index], (out[1] if isinstance(out, tuple) else None)


def build_stub(images) -> tuple[nn.Module, object]:
    from ddp_utils.yolo import ComputeLoss, Model

    torch.manual_seed(0)
    net = Model(tiny_model_cfg())
    hyp = {"box": 0.05, "obj": 1.0, "cls": 0.5, "cls_pw": 1.0, "obj_pw": 1.0, "anchor_t": 4.0}
    return PredictionStub(images, net), ComputeLoss(net, hyp)


def sharded_evaluate(n_images: str, batch_size: str) -> None:
    """Each rank evaluates a contiguous share of the batches; prints the metrics it returns."""
    import ddp_utils as du
    from ddp_utils.yolo import evaluate

    torch.set_num_threads(1)
    info = du.init_distributed(backend="gloo", timeout=120)
    images = make_images(int(n_images))
    batches = make_batches(images, int(batch_size))
    per_rank = -(-len(batches) // info.world_size)
    shard = batches[info.rank * per_rank : (info.rank + 1) * per_rank]
    model, compute_loss = build_stub(images)
    # wrapped as train.py's model is; the shards differ in length, so evaluate() must not run DDP's forward
    model = torch.nn.parallel.DistributedDataParallel(model)
    metrics, val_loss = evaluate(model, shard, compute_loss=compute_loss)
    n_local = sum(len(b[2]) for b in shard)
    print(json.dumps({"rank": info.rank, "images": n_local, "metrics": metrics, "val_loss": val_loss.tolist()}))
    sys.stdout.flush()
    du.cleanup()
