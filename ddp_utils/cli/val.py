"""Score a checkpoint on a dataset without training: YOLOv5 val's table, speed line and COCO json.

    python -m ddp_utils val --weights runs/train/exp/weights/best.pt --data shapes.yaml   # or: ddp-val ...
    python -m ddp_utils val --weights yolov5s.pt --data coco128.yaml --save-json --verbose
    torchrun --nproc_per_node 2 -m ddp_utils val --weights best.pt --data shapes.yaml --device cpu

The weights are ours or YOLOv5's (read without running its pickle). Under torchrun each rank
validates its exactly-once shard of the split; rank 0 gathers every image's detections, prints
the per-class table and the speed line, and writes ``<save_dir>/predictions.json`` (``--save-json``)
in COCO's results format: ``image_id`` (the file stem, an int when numeric), ``category_id``
(the class index; COCO's 91-id map for COCO's val2017), ``bbox`` [x, y, w, h] in original-image
pixels and ``score``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

import ddp_utils as du

from ..data import check_dataset, create_val_dataloader
from ..progress import PROGRESS_MODES, set_progress_mode
from ..run.checkpoint import CheckpointError, load_pretrained
from ..run.run_dir import increment_path
from ..yamls import DataConfigError
from ..yolo import Model
from ..yolo.evaluate import batch_records
from ..yolo.foreign import ForeignCheckpointError
from ..yolo.metrics import DetectionMetrics, ImageRecord, class_table, coco_metrics
from ..yolo.ops import non_max_suppression

# COCO's 80 training classes -> its 91 category ids (the ids its annotation files and evaluator use)
COCO80_TO_91 = [
    *range(1, 12), *range(13, 26), 27, 28, *range(31, 45), *range(46, 66), 67, 70, *range(72, 83), *range(84, 91)
]  # fmt: skip


class UsageError(ValueError):
    """Bad input from the command line (a missing file, classes that do not match): exit 2."""


def parse_opt(argv: Sequence[str] | None = None, prog: str = "python -m ddp_utils val") -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add = parser.add_argument
    add("--weights", required=True, help="checkpoint: ours (best.pt, last.pt) or YOLOv5's")
    add("--data", default="shapes.yaml", help="dataset yaml (data/ or a path)")
    add("--batch-size", type=int, default=32, help="total batch size over all processes")
    add("--imgsz", "--img", "--img-size", type=int, default=None,
        help="inference size (pixels); default: the data yaml's train_defaults, as train.py, else 640")  # fmt: skip
    add("--conf-thres", type=float, default=0.001, help="confidence threshold")
    add("--iou-thres", type=float, default=0.6, help="NMS IoU threshold")
    add("--max-det", type=int, default=300, help="maximum detections per image")
    add("--task", default="val", choices=["val", "test", "train"], help="the data yaml's split to score")
    add("--device", default="", help="cuda device, i.e. 0 or 0,1,2,3 or cpu")
    add("--workers", type=int, default=8, help="max data-loader workers per process")
    add("--single-cls", action="store_true", help="treat as single-class dataset")
    add("--verbose", action="store_true", help="report mAP by class (also with one class)")
    add("--save-json", action="store_true", help="write a COCO-format predictions.json")
    add("--project", default="runs/val", help="save to project/name")
    add("--name", default="exp", help="save to project/name")
    add("--exist-ok", action="store_true", help="reuse project/name instead of incrementing")
    add("--half", action="store_true", help="use FP16 half-precision inference (CUDA only)")
    add("--progress", default=None, choices=PROGRESS_MODES, help="progress: a bar, plain lines, or off "
        "(default: $DDP_UTILS_PROGRESS, else a bar on a terminal, plain lines in a file)")  # fmt: skip
    add("--local_rank", "--local-rank", type=int, default=-1, help=argparse.SUPPRESS)
    opt = parser.parse_args(argv)
    set_progress_mode(opt.progress)
    if opt.batch_size < 1 or (opt.imgsz is not None and opt.imgsz < 1):
        parser.error(f"--batch-size {opt.batch_size} and --imgsz {opt.imgsz} must be positive")
    return opt


def load_model(weights: str | Path, device: torch.device) -> tuple[Model, list[str] | None]:
    """The detector a checkpoint holds (eval mode, fused, on ``device``) and its class names, if stored."""
    if not Path(weights).is_file():
        raise UsageError(f"--weights {weights}: no such file")
    ckpt = load_pretrained(weights)
    if not ckpt.get("model_cfg"):
        raise UsageError(f"--weights {weights}: the checkpoint has no model_cfg, so no model can be built from it")
    model = Model(ckpt["model_cfg"])
    model.load_state_dict(ckpt["model"])
    names = ckpt.get("names")
    return model.fuse().eval().to(device), list(names) if names else None


def image_id(path: str) -> int | str:
    """YOLOv5's COCO ``image_id``: the file stem, as an int when it is all digits.

    Examples:
        >>> image_id("images/val/000042.jpg"), image_id("a/cat_1.png")
        (42, 'cat_1')
    """
    stem = Path(path).stem
    return int(stem) if stem.isnumeric() else stem


def coco_predictions(records: Sequence[ImageRecord], class_map: Sequence[int] | None = None) -> list[dict[str, Any]]:
    """COCO results-format detections: one dict per box, [x, y, w, h] in original-image pixels.

    Examples:
        >>> import numpy as np
        >>> record = ImageRecord("7.jpg", 50, 60, predictions=np.array([[10, 20, 30, 45, 0.875, 2]]))
        >>> coco_predictions([record])
        [{'image_id': 7, 'category_id': 2, 'bbox': [10.0, 20.0, 20.0, 25.0], 'score': 0.875}]
    """
    out = []
    for record in records:
        ident = image_id(record.key)
        for x1, y1, x2, y2, score, cls in record.predictions.reshape(-1, 6).tolist():
            category = class_map[int(cls)] if class_map is not None else int(cls)
            bbox = [round(x1, 3), round(y1, 3), round(x2 - x1, 3), round(y2 - y1, 3)]
            out.append({"image_id": ident, "category_id": category, "bbox": bbox, "score": round(score, 5)})
    return out


def is_coco_val(data: dict[str, Any]) -> bool:
    """YOLOv5's test for COCO: the val split is COCO's val2017 list (then category ids are COCO's 91)."""
    val = data.get("val")
    return isinstance(val, str) and val.endswith(("coco/val2017.txt", "coco/images/val2017"))


@torch.no_grad()
def run_shard(
    model: Model, loader: Any, device: torch.device, imgsz: int, opt: argparse.Namespace
) -> tuple[list[ImageRecord], torch.Tensor]:
    """This rank's records and its [pre-process, inference, NMS] seconds, and image count, as float64[4]."""
    half = opt.half and device.type == "cuda"
    model(torch.zeros(1, 3, imgsz, imgsz, device=device, dtype=next(model.parameters()).dtype))  # warm-up: untimed
    times = torch.zeros(4, dtype=torch.float64)
    records: list[ImageRecord] = []
    for imgs, targets, paths, shapes in loader:
        t0 = time.perf_counter()
        imgs = imgs.to(device, non_blocking=True)
        imgs = (imgs.half() if half else imgs.float()) / 255
        t1 = du.time_synchronized(device)
        pred = model(imgs)
        pred = pred[0] if isinstance(pred, (tuple, list)) else pred
        t2 = du.time_synchronized(device)
        detections = non_max_suppression(
            pred.float(), opt.conf_thres, opt.iou_thres, multi_label=True, max_det=opt.max_det
        )
        t3 = du.time_synchronized(device)
        times += torch.tensor([t1 - t0, t2 - t1, t3 - t2, len(imgs)], dtype=torch.float64)
        records.extend(batch_records(detections, targets, tuple(imgs.shape[2:]), paths, shapes))
    return records, times


def gather_records(records: list[ImageRecord]) -> list[ImageRecord] | None:
    """Every rank's records on rank 0 (each image once: the shards are exactly-once); None elsewhere."""
    if not du.is_dist_initialized():
        return records
    gathered: list[Any] | None = [None] * du.get_world_size() if du.get_rank() == 0 else None
    dist.gather_object(records, gathered, dst=0)
    return None if gathered is None else [record for shard in gathered for record in shard]


def report(
    metrics: DetectionMetrics,
    names: Any,
    times: torch.Tensor,
    batch_shape: tuple[int, ...],
    verbose: bool,
    nc: int,
) -> str:
    """YOLOv5 val's printout: the table (class rows when nc > 1 or verbose) and the speed line."""
    table = class_table(metrics, names, per_class=verbose or nc > 1)
    per_image = (times[:3] / max(float(times[3]), 1.0) * 1e3).tolist()
    speed = (
        f"Speed: {per_image[0]:.1f}ms pre-process, {per_image[1]:.1f}ms inference, {per_image[2]:.1f}ms NMS "
        f"per image at shape {batch_shape}"
    )
    return f"{table}\n{speed}"


def validate(opt: argparse.Namespace, device: torch.device, info: du.DistInfo) -> DetectionMetrics:
    """Score ``opt.weights`` on the data yaml's ``opt.task`` split; rank 0 prints and writes."""
    model, ckpt_names = load_model(opt.weights, device)  # first: a bad file is named before any download
    data = check_dataset(opt.data, autodownload=True)
    if not data.get(opt.task):
        raise UsageError(f"--task {opt.task}: {data['yaml_file']} has no '{opt.task}' split")
    nc = 1 if opt.single_cls else int(data["nc"])
    if model.nc != nc:
        raise UsageError(
            f"--weights {opt.weights} has {model.nc} classes but --data {opt.data} has {nc}: "
            "pass weights and data that were trained together (or --single-cls for a 1-class model)"
        )
    names = ckpt_names or (["item"] if opt.single_cls and nc != len(data["names"]) else data["names"])
    if opt.half and device.type == "cuda":
        model.half()
    opt.imgsz = opt.imgsz or data.get("train_defaults", {}).get("imgsz", 640)  # the size train.py used by default
    stride = max(int(model.stride.max()), 32)
    imgsz = math.ceil(opt.imgsz / stride) * stride
    if imgsz != opt.imgsz:
        du.LOGGER.warning(f"--imgsz {opt.imgsz} is not a multiple of the stride {stride}: using {imgsz}")
    batch_per_rank = max(opt.batch_size // info.world_size, 1)
    loader, _ = create_val_dataloader(
        data[opt.task], imgsz, batch_per_rank, stride, single_cls=opt.single_cls, rank=info.local_rank,
        workers=opt.workers, prefix=f"{opt.task}: ",
    )  # fmt: skip

    records, times = run_shard(model, loader, device, imgsz, opt)
    times = du.reduce_tensor(times, op="sum")  # seconds and images of all ranks: the job's mean per image
    everything = gather_records(records)
    metrics: Any = None
    if everything is not None:
        try:
            metrics = coco_metrics(everything, max_dets=opt.max_det)
            print(report(metrics, names, times, (batch_per_rank, 3, imgsz, imgsz), opt.verbose, nc), flush=True)
            if opt.save_json:
                save_dir = increment_path(Path(opt.project) / opt.name, exist_ok=opt.exist_ok, mkdir=True)
                class_map = COCO80_TO_91 if is_coco_val(data) else None
                file = save_dir / "predictions.json"
                file.write_text(json.dumps(coco_predictions(everything, class_map)))
                print(f"Results saved to {save_dir} ({file.name}: {len(everything)} images)", flush=True)
        except Exception as exc:  # the other ranks wait in the broadcast below: tell them, do not hang them
            metrics = {"error": f"{type(exc).__name__}: {exc}"}
    metrics = du.broadcast_object(metrics, src=0)
    if "error" in metrics:
        raise RuntimeError(f"rank 0 failed: {metrics['error']}")
    return metrics


def main(argv: Sequence[str] | None = None, prog: str = "python -m ddp_utils val") -> int:
    """``python -m ddp_utils val`` (``ddp-val``): 0 when scored, 2 with one line on bad input."""
    opt = parse_opt(argv, prog)
    info = du.dist_info()
    du.set_logging(info.rank)
    try:
        device = du.select_device(opt.device, batch_size=opt.batch_size)
    except ValueError as exc:  # a device that is not there, before any process group starts
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    du.init_distributed(device=device)
    finished = False
    try:
        validate(opt, device, info)
        finished = True
    except (UsageError, FileNotFoundError, DataConfigError, CheckpointError, ForeignCheckpointError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    finally:
        du.cleanup(wait=finished)  # on an error, leave at once: the others fail fast, not hang
    return 0
