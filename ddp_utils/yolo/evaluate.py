"""The distributed validation loop: each rank scores its shard, rank 0 computes COCO metrics.

Every rank runs the model over its own exactly-once shard of the validation set and
turns its detections and labels into original-image pixels. Rank 0 gathers those
records, computes the metrics with faster-coco-eval, and broadcasts them, so each rank
returns the same numbers a single process would compute over the whole set.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

from ..distributed import broadcast_object, get_rank, get_world_size, is_dist_initialized, reduce_tensor
from ..log import LOGGER
from ..progress import progress as progress_reporter
from .metrics import DetectionMetrics, ImageRecord, coco_metrics
from .ops import non_max_suppression, scale_boxes, xywh2xyxy


class ValidationInterrupted(RuntimeError):
    """A stop was asked for (a signal) on some rank during :func:`evaluate`; every rank raises it, at the same point."""


def _gather_to_rank0(records: list[ImageRecord]) -> list[ImageRecord] | None:
    """Every rank's records on rank 0 (in rank order); None on the other ranks."""
    if not is_dist_initialized():
        return records
    gathered: list[Any] | None = [None] * get_world_size() if get_rank() == 0 else None
    dist.gather_object(records, gathered, dst=0)
    if gathered is None:
        return None
    return [record for rank_records in gathered for record in rank_records]


def _unique(records: list[ImageRecord]) -> list[ImageRecord]:
    # a padded sampler shows some images twice; score each image once
    seen: dict[str, ImageRecord] = {}
    for record in records:
        seen.setdefault(record.key, record)
    if len(seen) < len(records):
        LOGGER.warning(f"evaluate: {len(records) - len(seen)} images were evaluated twice; each is scored once")
    return list(seen.values())


def batch_records(
    detections: list[torch.Tensor], targets: torch.Tensor, input_shape: tuple[int, int], paths: Any, shapes: Any
) -> list[ImageRecord]:
    """Turn one batch's detections and targets into :class:`ImageRecord`s in original-image pixels.

    Args:
        detections: per image, [n, 6] x1, y1, x2, y2, conf, cls in network-input pixels.
        targets: [m, 6] image index, class, xc, yc, w, h normalised to the input.
        input_shape: (height, width) of the network input.
        paths: per image, its path (the key that identifies it across ranks).
        shapes: per image, ``((h0, w0), ((h / h0, w / w0), (pad_w, pad_h)))``, or None (no letterbox to undo).

    Returns:
        One record per image.
    """
    height, width = input_shape
    targets = targets.detach().float().cpu()
    records = []
    for index, det in enumerate(detections):
        shape = shapes[index] if shapes is not None else None
        original, ratio_pad = (shape[0], shape[1]) if shape is not None else ((height, width), ((1.0, 1.0), (0, 0)))
        labels = targets[targets[:, 0] == index, 1:6].clone()
        boxes = xywh2xyxy(labels[:, 1:5]) * torch.tensor([width, height, width, height])
        scale_boxes(input_shape, boxes, original, ratio_pad)
        pred = det.detach().float().cpu().clone()
        scale_boxes(input_shape, pred[:, :4], original, ratio_pad)
        records.append(
            ImageRecord(
                key=str(paths[index]),
                height=int(original[0]),
                width=int(original[1]),
                labels=torch.cat((labels[:, :1], boxes), 1).numpy().astype(np.float32),
                predictions=pred.numpy().astype(np.float32),
            )
        )
    return records


@torch.no_grad()
def evaluate(
    model: nn.Module,
    loader: Iterable,
    compute_loss: Any = None,
    conf_thres: float = 0.001,
    iou_thres: float = 0.6,
    max_det: int = 300,
    device: torch.device | str | None = None,
    half: bool = False,
    verbose: bool = True,
    stop: Callable[[], bool] | None = None,
    progress: bool = False,
    watchdog: Any = None,
    *,
    amp_dtype: torch.dtype | None = None,
) -> tuple[DetectionMetrics, torch.Tensor]:
    """Validate a detector over a (sharded) loader; every rank returns the same metrics.

    Args:
        model: the detector (plain, or DDP-wrapped: then its ``.module`` runs). It runs in eval mode, returning
            ``(pred [B, N, 5 + nc], raw level outputs)`` or just ``pred``; its mode is restored afterwards.
        loader: yields ``(imgs uint8 [B, 3, H, W] (or float in 0-1), targets [n, 6], paths, shapes)``; under DDP
            this rank's shard (each image on exactly one rank).
        compute_loss: a :class:`~ddp_utils.yolo.loss.ComputeLoss` for the validation losses, or None.
        conf_thres: NMS confidence threshold (low, so the PR curve is complete).
        iou_thres: NMS IoU threshold.
        max_det: detections kept per image by NMS, and scored by the evaluator (as YOLOv5 scores all 300 it keeps;
            COCO's official protocol stops at 100: pass 100 for that).
        device: where the batches go (the model must already be there); None uses the model's device.
        half: YOLOv5's ``val.run(half=...)``: fp16 on CUDA (by autocast: the weights stay fp32), fp32 on the CPU.
        verbose: log the "val: ..." summary line on rank 0 (train.py logs one line per epoch of its own).
        stop: asked before each batch on this rank (no collective: e.g. "a stop signal arrived here"); True ends
            the loop, the ranks agree at the loss reduction, and every rank raises :class:`ValidationInterrupted`.
        progress: show this rank's progress through its batches ("val 3/8"; a bar, plain lines or nothing, as
            :func:`ddp_utils.progress.progress_mode` says): pass it on the main process.
        watchdog: a :class:`~ddp_utils.distributed.StallWatchdog`: rank 0's COCO evaluation, which the other
            ranks wait for, is an unbounded phase of it (it takes minutes on COCO on a CPU); or None.
        amp_dtype: the network's autocast dtype, the run's (``torch.float16``: ``--amp fp16``; ``torch.bfloat16``:
            ``--amp bf16``, CUDA or CPU; None: fp32); not with ``half``. Box decode and NMS compute in fp32 anyway.

    Returns:
        ``(metrics, val_loss)``: metrics, a :class:`~ddp_utils.yolo.metrics.DetectionMetrics` (a dict ``{"precision",
        "recall", "map50", "map"}``, with the per-class rows as ``.classes``; print them with
        :func:`~ddp_utils.yolo.metrics.class_table`), from :func:`~ddp_utils.yolo.metrics.coco_metrics` over all
        ranks' images, the same on every rank; ``val_loss`` tensor[3] (box, obj, cls), the mean over all batches of
        all ranks (zeros without ``compute_loss``).

    Raises:
        ValidationInterrupted: ``stop`` answered True on some rank.
        ValueError: both ``half`` and ``amp_dtype``, or an ``amp_dtype`` autocast does not know.
    """
    if hasattr(model, "module"):  # DDP's forward may sync buffers across ranks, and shards differ in length
        model = model.module
    device = torch.device(device) if device is not None else next(model.parameters()).device
    autocast = _autocast(device, half, amp_dtype)
    shard = _score_shard(model, loader, device, compute_loss, conf_thres, iou_thres, max_det, autocast, stop, progress)
    loss_sum, batches, records, interrupted = shard
    val_loss = _mean_val_loss(loss_sum, batches, interrupted, device)
    metrics = _rank0_metrics(records, max_det, verbose, watchdog)
    return metrics, val_loss


def _autocast(device: torch.device, half: bool, amp_dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """The context the network runs in: autocast in ``amp_dtype``, YOLOv5's ``half`` (fp16 on CUDA only), or none."""
    if half and amp_dtype is not None:
        raise ValueError(f"evaluate(half=True, amp_dtype={amp_dtype}): give one; amp_dtype=torch.float16 is half's")
    if half:
        amp_dtype = torch.float16 if device.type == "cuda" else None  # YOLOv5: half &= device.type != "cpu"
    if amp_dtype is None:
        return contextlib.nullcontext()
    if amp_dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"evaluate(amp_dtype={amp_dtype}): autocast computes in torch.float16 or torch.bfloat16")
    return torch.autocast(device_type=device.type, dtype=amp_dtype)


def _score_shard(
    model: nn.Module,
    loader: Iterable,
    device: torch.device,
    compute_loss: Any,
    conf_thres: float,
    iou_thres: float,
    max_det: int,
    autocast: contextlib.AbstractContextManager,
    stop: Callable[[], bool] | None,
    progress: bool,
) -> tuple[torch.Tensor, int, list[ImageRecord], bool]:
    """This rank's pass over its own shard, the model's mode restored: ``(loss_sum, batches, records, interrupted)``."""
    param_dtype = next(model.parameters()).dtype
    was_training = model.training
    model.eval()
    loss_sum = torch.zeros(3, device=device)
    batches = 0
    records: list[ImageRecord] = []
    interrupted = False
    bar = progress_reporter(len(loader), desc="val", mode=None if progress else "off", file=sys.stderr)
    # cuDNN's autotuning (benchmark) times every algorithm of every convolution once per input shape: rect
    # batches have a shape each, seen once an epoch, so a tuning pass would cost more than it saves here
    tuned, torch.backends.cudnn.benchmark = torch.backends.cudnn.benchmark, False
    try:
        for imgs, targets, paths, shapes in loader:
            if stop is not None and stop():
                interrupted = True
                break
            imgs = imgs.to(device, non_blocking=True)
            imgs = imgs.float() / 255 if imgs.dtype == torch.uint8 else imgs.float()
            if param_dtype == torch.float16 and device.type == "cuda":  # a model already made half
                imgs = imgs.half()
            targets = targets.to(device)
            with autocast:
                out = model(imgs)
            pred, raw = (out[0], out[1]) if isinstance(out, (tuple, list)) else (out, None)
            if compute_loss is not None and raw is not None:
                loss_sum += compute_loss([r.float() for r in raw], targets)[1].to(device)
            batches += 1
            detections = non_max_suppression(
                pred.float(), conf_thres, iou_thres, multi_label=True, agnostic=False, max_det=max_det
            )
            records.extend(batch_records(detections, targets, tuple(imgs.shape[2:]), paths, shapes))
            bar.update(1)
    finally:
        torch.backends.cudnn.benchmark = tuned
        bar.close()
        model.train(was_training)
    return loss_sum, batches, records, interrupted


def _mean_val_loss(loss_sum: torch.Tensor, batches: int, interrupted: bool, device: torch.device) -> torch.Tensor:
    """The mean loss over every rank's batches, agreed in one reduction that also says whether any rank stopped."""
    # sums and batch counts, not per-rank means, so an uneven shard split weighs every batch alike; with them,
    # whether a rank was interrupted (every rank reaches this reduction either way, then all agree)
    counts = torch.tensor([float(batches), float(interrupted)], dtype=torch.float64)
    totals = reduce_tensor(torch.cat((loss_sum.cpu().double(), counts)))
    if totals[4] > 0:
        raise ValidationInterrupted("validation stopped: a stop signal arrived")
    return (totals[:3] / max(float(totals[3]), 1.0)).float().to(device)


def _rank0_metrics(records: list[ImageRecord], max_det: int, verbose: bool, watchdog: Any) -> DetectionMetrics:
    """Every rank's records scored on rank 0 and broadcast: each rank gets the same metrics (or the same error)."""
    everything = _gather_to_rank0(records)
    metrics = None
    computing = watchdog.phase("metrics", None) if watchdog is not None else contextlib.nullcontext()
    if everything is not None:  # rank 0, while the others wait in the broadcast below
        try:
            with computing:
                metrics = coco_metrics(_unique(everything), max_dets=max_det)
            (LOGGER.info if verbose else LOGGER.debug)(
                f"val: {metrics.images} images, {metrics.instances} labels: P {metrics['precision']:.3f} "
                f"R {metrics['recall']:.3f} mAP50 {metrics['map50']:.3f} mAP50-95 {metrics['map']:.3f}"
            )
        except Exception as exc:  # every rank must still reach the broadcast, or the others hang
            LOGGER.error(f"evaluate: COCO evaluation failed on rank 0 ({type(exc).__name__}: {exc})")
            metrics = {"error": f"{type(exc).__name__}: {exc}"}
    metrics = broadcast_object(metrics, src=0)
    if "error" in metrics:
        raise RuntimeError(f"COCO evaluation failed on rank 0: {metrics['error']}")
    return metrics
