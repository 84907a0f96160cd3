"""COCO detection metrics (mAP@0.5, mAP@0.5:0.95, precision, recall) through faster-coco-eval.

Predictions and ground truth go to the evaluator as COCO-format dicts built in memory;
the numbers are the evaluator's, not a re-implementation of AP.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from faster_coco_eval import COCO, COCOeval_faster

METRIC_KEYS = ("precision", "recall", "map50", "map")


@dataclass
class ImageRecord:
    """Ground truth and predictions of one image, in original-image pixels.

    Attributes:
        key: a name unique to the image (its path), used to drop duplicates across ranks.
        height: original image height.
        width: original image width.
        labels: float [m, 5]: class, x1, y1, x2, y2.
        predictions: float [n, 6]: x1, y1, x2, y2, confidence, class.
    """

    key: str
    height: int
    width: int
    labels: np.ndarray = field(default_factory=lambda: np.zeros((0, 5), np.float32))
    predictions: np.ndarray = field(default_factory=lambda: np.zeros((0, 6), np.float32))


def empty_metrics() -> dict[str, float]:
    """All metrics zero: what an evaluation with nothing to score reports.

    Examples:
        >>> empty_metrics()
        {'precision': 0.0, 'recall': 0.0, 'map50': 0.0, 'map': 0.0}
    """
    return dict.fromkeys(METRIC_KEYS, 0.0)


def fitness(metrics: dict[str, float]) -> float:
    """The single number YOLOv5 selects its best checkpoint by: 0.1 x mAP@0.5 + 0.9 x mAP@0.5:0.95.

    Examples:
        >>> round(fitness({"precision": 0.9, "recall": 0.8, "map50": 0.6, "map": 0.4}), 4)
        0.42
    """
    return 0.1 * float(metrics["map50"]) + 0.9 * float(metrics["map"])


def to_coco(records: Sequence[ImageRecord]) -> tuple[dict, list[dict]]:
    """The COCO-format ground-truth dict and detection list for these images (category id = class + 1).

    Examples:
        >>> gt, dt = to_coco([ImageRecord("a.jpg", 10, 20, np.array([[0, 1, 2, 5, 6.0]]), np.zeros((0, 6)))])
        >>> gt["annotations"][0]["bbox"], gt["categories"], dt
        ([1.0, 2.0, 4.0, 4.0], [{'id': 1, 'name': '0'}], [])
    """
    images, annotations, detections, classes = [], [], [], set()
    for image_id, record in enumerate(records, start=1):
        images.append({"id": image_id, "height": int(record.height), "width": int(record.width)})
        for cls, x1, y1, x2, y2 in np.asarray(record.labels, dtype=np.float64).reshape(-1, 5):
            w, h = x2 - x1, y2 - y1
            classes.add(int(cls))
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": int(cls) + 1,
                    "bbox": [float(x1), float(y1), float(w), float(h)],
                    "area": float(w * h),
                    "iscrowd": 0,
                }
            )
        for x1, y1, x2, y2, conf, cls in np.asarray(record.predictions, dtype=np.float64).reshape(-1, 6):
            classes.add(int(cls))
            detections.append(
                {
                    "image_id": image_id,
                    "category_id": int(cls) + 1,
                    "bbox": [float(x1), float(y1), float(x2 - x1), float(y2 - y1)],
                    "score": float(conf),
                }
            )
    categories = [{"id": c + 1, "name": str(c)} for c in sorted(classes)]
    return {"images": images, "annotations": annotations, "categories": categories}, detections


def precision_recall_at_best_f1(
    precision: np.ndarray, scores: np.ndarray, recall_thresholds: np.ndarray, steps: int = 1001
) -> tuple[float, float]:
    """Mean precision and recall over classes at the one confidence that maximises the mean F1.

    For a confidence c, a class's recall is the highest recall threshold the evaluator
    reached with detections scoring at least c, and its precision is the evaluator's
    (interpolated) precision there; a class with nothing above c scores 0 and 0. The
    confidence is swept over ``steps`` points in [0, 1]; the lowest confidence that reaches
    the best mean F1 wins.

    Args:
        precision: the evaluator's precision at one IoU, area and maxDets: [R recall thresholds, K classes],
            -1 for classes without ground truth (left out).
        scores: the matching detection scores, [R, K].
        recall_thresholds: [R].
        steps: confidence grid size.

    Returns:
        (mean precision, mean recall).

    Examples:
        >>> rec = np.linspace(0, 1, 101)
        >>> prec = np.where(rec <= 0.5, 1.0, 0.0)[:, None]  # half the objects found, all correct
        >>> precision_recall_at_best_f1(prec, np.where(rec <= 0.5, 0.9, 0.0)[:, None], rec)
        (1.0, 0.5)
    """
    keep = (precision > -1).any(0)
    if not keep.any():
        return 0.0, 0.0
    precision, scores = precision[:, keep], scores[:, keep]
    confidence = np.linspace(0, 1, steps)
    reached = (precision > 0)[..., None] & (scores[..., None] >= confidence)  # [R, K, C]
    # scores fall as recall rises, so the reached thresholds form a prefix: count them
    last = reached.sum(0) - 1  # [K, C], -1 where nothing is reached
    found = last >= 0
    index = np.clip(last, 0, None)
    recall = np.where(found, recall_thresholds[index], 0.0)
    prec = np.where(found, precision[index, np.arange(precision.shape[1])[:, None]], 0.0)
    f1 = 2 * prec * recall / np.maximum(prec + recall, 1e-16)
    best = int(np.argmax(f1.mean(0)))
    return float(prec[:, best].mean()), float(recall[:, best].mean())


def coco_metrics(records: Sequence[ImageRecord], max_dets: int = 100) -> dict[str, float]:
    """COCO box metrics of these images.

    Args:
        records: one :class:`ImageRecord` per image (predictions and labels in the same pixels).
        max_dets: detections per image the evaluator counts (COCO's standard is 100).

    Returns:
        {"precision", "recall", "map50", "map"}: precision and recall at IoU 0.5 at the
        confidence of best mean F1 (see :func:`precision_recall_at_best_f1`), mAP@0.5 and
        mAP@0.5:0.95 as the evaluator reports them; all 0.0 when there are no labels or no
        predictions.

    Examples:
        >>> box = np.array([[0, 10, 10, 50, 50]], np.float32)
        >>> hit = np.array([[10, 10, 50, 50, 0.9, 0]], np.float32)
        >>> coco_metrics([ImageRecord("a.jpg", 64, 64, box, hit)])
        {'precision': 1.0, 'recall': 1.0, 'map50': 1.0, 'map': 1.0}
    """
    gt, dt = to_coco(records)
    if not gt["annotations"] or not dt:
        return empty_metrics()
    with contextlib.redirect_stdout(io.StringIO()):  # the evaluator prints its summary table
        coco_gt = COCO(gt)
        coco_dt = coco_gt.loadRes(dt)
        evaluator = COCOeval_faster(coco_gt, coco_dt, "bbox", print_function=lambda *a, **k: None)
        evaluator.params.maxDets = [1, 10, max_dets]
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    stats = evaluator.stats
    iou50 = int(np.argmin(np.abs(evaluator.params.iouThrs - 0.5)))
    precision, recall = precision_recall_at_best_f1(
        evaluator.eval["precision"][iou50, :, :, 0, -1],
        evaluator.eval["scores"][iou50, :, :, 0, -1],
        np.asarray(evaluator.params.recThrs),
    )
    return {
        "precision": precision,
        "recall": recall,
        "map50": max(float(stats[1]), 0.0),
        "map": max(float(stats[0]), 0.0),
    }
