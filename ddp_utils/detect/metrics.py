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
        # tolist() first: python floats, and far faster than iterating numpy rows
        for cls, x1, y1, x2, y2 in np.asarray(record.labels, dtype=np.float64).reshape(-1, 5).tolist():
            classes.add(int(cls))
            annotations.append(
                {
                    "id": len(annotations) + 1,
                    "image_id": image_id,
                    "category_id": int(cls) + 1,
                    "bbox": [x1, y1, x2 - x1, y2 - y1],
                    "area": (x2 - x1) * (y2 - y1),
                    "iscrowd": 0,
                }
            )
        preds = np.asarray(record.predictions, dtype=np.float64).reshape(-1, 6)
        classes.update(int(c) for c in np.unique(preds[:, 5]).tolist())
        detections.extend(
            {"image_id": image_id, "category_id": int(cls) + 1, "bbox": [x1, y1, x2 - x1, y2 - y1], "score": conf}
            for x1, y1, x2, y2, conf, cls in preds.tolist()
        )
    categories = [{"id": c + 1, "name": str(c)} for c in sorted(classes)]
    return {"images": images, "annotations": annotations, "categories": categories}, detections


def precision_recall_at_best_f1(
    scores: np.ndarray,
    classes: np.ndarray,
    true_positive: np.ndarray,
    labels_per_class: dict[int, int],
    steps: int = 1001,
) -> tuple[float, float]:
    """Mean precision and recall over the labelled classes at the confidence of best mean F1.

    Precision and recall are the actual (not interpolated) ones of the detections at or
    above a confidence; the confidences tried are ``steps`` quantiles of the detection
    scores (every score when there are fewer), and the lowest confidence reaching the best
    mean F1 wins. Classes without labels are left out, as COCO leaves them out of mAP.

    Args:
        scores: [n] detection confidences.
        classes: [n] detection classes.
        true_positive: [n] bool, the evaluator's match at IoU 0.5.
        labels_per_class: number of ground-truth boxes of each class.
        steps: most confidences tried.

    Returns:
        (mean precision, mean recall); (0.0, 0.0) without labels or detections.

    Examples:
        >>> scores = np.array([0.95, 0.9, 0.8, 0.7])  # a false positive above three hits
        >>> precision_recall_at_best_f1(scores, np.zeros(4), np.array([0, 1, 1, 1], bool), {0: 4})
        (0.75, 0.75)
    """
    labelled = [c for c, n in sorted(labels_per_class.items()) if n > 0]
    if not labelled or not len(scores):
        return 0.0, 0.0
    thresholds = np.unique(np.quantile(scores, np.linspace(0, 1, steps), method="lower"))  # ascending
    precision = np.zeros((len(labelled), len(thresholds)))
    recall = np.zeros_like(precision)
    for row, cls in enumerate(labelled):
        mine = classes == cls
        order = np.argsort(-scores[mine], kind="stable")
        cls_scores, cum_tp = scores[mine][order], np.cumsum(true_positive[mine][order])
        n_above = np.searchsorted(-cls_scores, -thresholds, side="right")  # detections scoring >= threshold
        tp = np.where(n_above > 0, cum_tp[np.maximum(n_above - 1, 0)] if len(cum_tp) else 0, 0)
        precision[row] = np.where(n_above > 0, tp / np.maximum(n_above, 1), 0.0)
        recall[row] = tp / labels_per_class[cls]
    f1 = 2 * precision * recall / np.maximum(precision + recall, 1e-16)
    best = int(np.argmax(f1.mean(0)))
    return float(precision[:, best].mean()), float(recall[:, best].mean())


def _top_per_image(records: Sequence[ImageRecord], max_dets: int) -> list[ImageRecord]:
    kept = []
    for record in records:
        preds = np.asarray(record.predictions).reshape(-1, 6)
        if len(preds) > max_dets:
            preds = preds[np.argsort(-preds[:, 4], kind="stable")[:max_dets]]
        kept.append(ImageRecord(record.key, record.height, record.width, record.labels, preds))
    return kept


def coco_metrics(records: Sequence[ImageRecord], max_dets: int = 100) -> dict[str, float]:
    """COCO box metrics of these images.

    Args:
        records: one :class:`ImageRecord` per image (predictions and labels in the same pixels).
        max_dets: detections per image scored, the most confident first (COCO's standard is 100).

    Returns:
        {"precision", "recall", "map50", "map"}: mAP@0.5 and mAP@0.5:0.95 as the evaluator
        reports them; precision and recall of the evaluator's IoU-0.5 matches at the
        confidence of best mean F1 (see :func:`precision_recall_at_best_f1`). All 0.0 when
        there are no labels or no predictions.

    Examples:
        >>> box = np.array([[0, 10, 10, 50, 50]], np.float32)
        >>> hit = np.array([[10, 10, 50, 50, 0.9, 0]], np.float32)
        >>> coco_metrics([ImageRecord("a.jpg", 64, 64, box, hit)])
        {'precision': 1.0, 'recall': 1.0, 'map50': 1.0, 'map': 1.0}
    """
    gt, dt = to_coco(_top_per_image(records, max_dets))
    if not gt["annotations"] or not dt:
        return empty_metrics()
    with contextlib.redirect_stdout(io.StringIO()):  # the evaluator prints its summary table
        coco_gt = COCO(gt)
        coco_dt = coco_gt.loadRes(dt)
        evaluator = COCOeval_faster(coco_gt, coco_dt, "bbox", extra_calc=True, print_function=lambda *a, **k: None)
        evaluator.params.maxDets = [1, 10, max_dets]
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    stats = evaluator.stats
    matched = {int(key.split("_", 1)[0]) for key, iou in evaluator.eval["matched"].items() if iou >= 0.5}
    detections = coco_dt.anns
    ids = np.fromiter(detections.keys(), dtype=np.int64, count=len(detections))
    labels_per_class: dict[int, int] = {}
    for ann in gt["annotations"]:
        labels_per_class[ann["category_id"]] = labels_per_class.get(ann["category_id"], 0) + 1
    precision, recall = precision_recall_at_best_f1(
        np.array([detections[i]["score"] for i in ids.tolist()], dtype=np.float64),
        np.array([detections[i]["category_id"] for i in ids.tolist()], dtype=np.int64),
        np.isin(ids, np.fromiter(matched, dtype=np.int64, count=len(matched))),
        labels_per_class,
    )
    return {
        "precision": precision,
        "recall": recall,
        "map50": max(float(stats[1]), 0.0),
        "map": max(float(stats[0]), 0.0),
    }
