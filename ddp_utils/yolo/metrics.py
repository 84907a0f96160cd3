"""COCO detection metrics (mAP@0.5, mAP@0.5:0.95, precision, recall), overall and per class.

Predictions and ground truth go to faster-coco-eval as COCO-format dicts built in memory;
mAP is the evaluator's, not a re-implementation of AP. Precision and recall come from
COCO's matching at IoU 0.5 alone, at the one confidence where the (smoothed) mean F1 over
the labelled classes peaks: the operating point YOLOv5's val reports as P and R.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from faster_coco_eval import COCO, COCOeval_faster

METRIC_KEYS = ("precision", "recall", "map50", "map")
FITNESS_WEIGHTS = (0.0, 0.0, 0.1, 0.9)  # [P, R, mAP@0.5, mAP@0.5:0.95], as YOLOv5 weighs them
PR_IOU = 0.5  # the IoU threshold precision and recall are counted at


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


@dataclass
class ClassMetrics:
    """One row of the per-class table: a class with at least one label.

    Attributes:
        cls: class index (0-based).
        images: images holding at least one label of the class.
        instances: labels of the class.
        precision: precision at the confidence chosen for all classes (see :func:`coco_metrics`).
        recall: recall at that confidence.
        map50: AP at IoU 0.5.
        map: AP averaged over IoU 0.5:0.95.
    """

    cls: int
    images: int
    instances: int
    precision: float
    recall: float
    map50: float
    map: float


class DetectionMetrics(dict):
    """``{"precision", "recall", "map50", "map"}`` (floats) with the per-class results as attributes.

    A plain dict for every caller that reads the four numbers (train.py, results.csv,
    :func:`fitness`), so the per-class rows travel with it without changing those callers.

    Attributes:
        classes: one :class:`ClassMetrics` per labelled class, by class index.
        images: images scored.
        instances: labels scored.
        confidence: the confidence precision and recall were taken at (0.0 when none was chosen).
    """

    def __init__(
        self,
        values: Mapping[str, float] | None = None,
        classes: Sequence[ClassMetrics] = (),
        images: int = 0,
        instances: int = 0,
        confidence: float = 0.0,
    ) -> None:
        super().__init__(dict.fromkeys(METRIC_KEYS, 0.0) if values is None else values)
        self.classes = list(classes)
        self.images = int(images)
        self.instances = int(instances)
        self.confidence = float(confidence)


def class_maps(metrics: Mapping[str, float], nc: int) -> np.ndarray:
    """Per-class mAP@0.5:0.95 as YOLOv5's val returns ``maps``: the overall mAP for classes without labels.

    Examples:
        >>> rows = [ClassMetrics(1, 1, 2, 0, 0, 0, 0.9)]
        >>> m = DetectionMetrics({"precision": 0, "recall": 0, "map50": 0, "map": 0.4}, rows)
        >>> class_maps(m, 3).tolist()
        [0.4, 0.9, 0.4]
    """
    maps = np.full(nc, float(metrics.get("map", 0.0)))
    for row in getattr(metrics, "classes", ()):
        if 0 <= row.cls < nc:
            maps[row.cls] = row.map
    return maps


def empty_metrics() -> dict[str, float]:
    """All metrics zero: what an evaluation with nothing to score reports.

    Examples:
        >>> empty_metrics()
        {'precision': 0.0, 'recall': 0.0, 'map50': 0.0, 'map': 0.0}
    """
    return dict.fromkeys(METRIC_KEYS, 0.0)


def fitness(metrics: Mapping[str, float] | np.ndarray | Sequence[float]) -> Any:
    """The number best.pt is chosen by: 0.1 x mAP@0.5 + 0.9 x mAP@0.5:0.95.

    Args:
        metrics: our metrics dict (returns a float); or YOLOv5's form, an array [n, >=4] whose
            first columns are P, R, mAP@0.5, mAP@0.5:0.95 (returns an array [n], one fitness per
            row, as YOLOv5's ``fitness`` does); a 1-d row [>=4] returns a float.

    Examples:
        >>> round(fitness({"precision": 0.9, "recall": 0.8, "map50": 0.6, "map": 0.4}), 4)
        0.42
        >>> fitness(np.array([[0.9, 0.8, 0.6, 0.4, 0.1, 0.1, 0.1]])).round(4)
        array([0.42])
    """
    if isinstance(metrics, Mapping):
        return 0.1 * float(metrics["map50"]) + 0.9 * float(metrics["map"])
    values = np.asarray(metrics, dtype=np.float64)
    if values.ndim not in (1, 2) or values.shape[-1] < 4:
        raise ValueError(
            f"fitness: expected a metrics dict or an array [n, >=4] of P, R, mAP@0.5, mAP@0.5:0.95 "
            f"columns (YOLOv5's form), got shape {values.shape}"
        )
    per_row = values[..., :4] @ np.asarray(FITNESS_WEIGHTS)
    return float(per_row) if values.ndim == 1 else per_row


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


def _iou_matrix(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of xyxy boxes a [n, 4] against b [m, 4]; 0 where the union is empty."""
    top_left = np.maximum(a[:, None, :2], b[None, :, :2])
    bottom_right = np.minimum(a[:, None, 2:], b[None, :, 2:])
    inter = np.clip(bottom_right - top_left, 0, None).prod(2)
    area_a = np.clip(a[:, 2:] - a[:, :2], 0, None).prod(1)
    area_b = np.clip(b[:, 2:] - b[:, :2], 0, None).prod(1)
    union = area_a[:, None] + area_b[None, :] - inter
    return np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)


def match_at_iou(labels: np.ndarray, predictions: np.ndarray, iou_threshold: float = PR_IOU) -> np.ndarray:
    """COCO's greedy matching of one image at one IoU threshold: which predictions are hits.

    Per class, predictions are taken by falling confidence; each takes the still unmatched
    label of its class with the highest IoU, if that IoU is at least ``iou_threshold``. A label
    is found at most once, so a second detection of the same object is a false positive.

    Args:
        labels: [m, 5] class, x1, y1, x2, y2.
        predictions: [n, 6] x1, y1, x2, y2, confidence, class.
        iou_threshold: the least IoU of a hit.

    Returns:
        bool [n], in the order of ``predictions``.

    Examples:
        >>> label = np.array([[0, 0, 0, 100, 100]])
        >>> a, b = [0, 0, 100, 62.5, 0.9, 0], [0, 0, 100, 90.9, 0.8, 0]  # IoU 0.625 and 0.909
        >>> match_at_iou(label, np.array([a, b])).tolist()
        [True, False]
    """
    labels = np.asarray(labels, dtype=np.float64).reshape(-1, 5)
    predictions = np.asarray(predictions, dtype=np.float64).reshape(-1, 6)
    hit = np.zeros(len(predictions), bool)
    for cls in np.unique(predictions[:, 5]):
        truth = labels[labels[:, 0] == cls, 1:5]
        if not len(truth):
            continue
        mine = np.flatnonzero(predictions[:, 5] == cls)
        mine = mine[np.argsort(-predictions[mine, 4], kind="stable")]
        ious = _iou_matrix(predictions[mine, :4], truth)
        ious[ious < iou_threshold] = -1.0
        free = np.ones(len(truth), bool)
        for row in np.flatnonzero(ious.max(1) >= 0).tolist():  # most detections overlap no label: skip them
            candidates = np.where(free, ious[row], -1.0)
            best = int(np.argmax(candidates))
            if candidates[best] >= 0:
                free[best], hit[mine[row]] = False, True
    return hit


def _smooth(values: np.ndarray, fraction: float) -> np.ndarray:
    """Moving average over a window of about ``fraction`` of the points (edges padded with their value)."""
    half = int(round(len(values) * fraction / 2))
    if half < 1:
        return values
    padded = np.concatenate((np.full(half, values[0]), values, np.full(half, values[-1])))
    return np.convolve(padded, np.ones(2 * half + 1) / (2 * half + 1), mode="valid")


def precision_recall_per_class(
    scores: np.ndarray,
    classes: np.ndarray,
    true_positive: np.ndarray,
    labels_per_class: Mapping[int, int],
    steps: int = 1001,
    smooth_fraction: float = 0.1,
) -> tuple[list[int], np.ndarray, np.ndarray, float]:
    """Per-class precision and recall at the one confidence where the smoothed mean F1 peaks.

    For each confidence tried (``steps`` evenly spaced in [0, 1], YOLOv5's grid), each
    labelled class's precision and recall are those of its detections scoring at least that
    confidence (actual values, never interpolated, so both lie in [0, 1]). The mean F1 over the
    labelled classes, smoothed over about ``smooth_fraction`` of the confidences tried, picks the
    confidence (the lowest one on a tie), as YOLOv5's val picks it.

    Args:
        scores: [n] detection confidences.
        classes: [n] detection classes.
        true_positive: [n] bool, the hits at IoU 0.5 (:func:`match_at_iou`).
        labels_per_class: number of ground-truth boxes of each class; classes without labels are left out.
        steps: confidences tried.
        smooth_fraction: width of the moving average over the mean F1 curve (0: none).

    Returns:
        ``(labelled classes ascending, precision [k], recall [k], confidence)``; zeros (and
        confidence 0.0) without detections.
    """
    labelled = [int(c) for c, n in sorted(labels_per_class.items()) if n > 0]
    scores, classes = np.asarray(scores, dtype=np.float64), np.asarray(classes)
    true_positive = np.asarray(true_positive, dtype=bool)
    if not labelled or not len(scores):
        return labelled, np.zeros(len(labelled)), np.zeros(len(labelled)), 0.0
    # an even grid, not quantiles of the scores: with thousands of low-score detections (conf 0.001)
    # quantiles crowd the low end, and the smoothing then blurs away the peak among the few high ones
    thresholds = np.linspace(0.0, 1.0, steps)
    precision = np.zeros((len(labelled), len(thresholds)))
    recall = np.zeros_like(precision)
    for row, cls in enumerate(labelled):
        mine = classes == cls
        order = np.argsort(-scores[mine], kind="stable")
        cls_scores, cum_tp = scores[mine][order], np.cumsum(true_positive[mine][order])
        n_above = np.searchsorted(-cls_scores, -thresholds, side="right")  # detections scoring >= threshold
        tp = cum_tp[np.maximum(n_above - 1, 0)] if len(cum_tp) else np.zeros(len(thresholds))
        tp = np.where(n_above > 0, tp, 0)
        precision[row] = tp / np.maximum(n_above, 1)
        recall[row] = tp / labels_per_class[cls]
    f1 = 2 * precision * recall / np.maximum(precision + recall, 1e-16)
    best = int(np.argmax(_smooth(f1.mean(0), smooth_fraction)))
    return labelled, precision[:, best], recall[:, best], float(thresholds[best])


def precision_recall_at_best_f1(
    scores: np.ndarray,
    classes: np.ndarray,
    true_positive: np.ndarray,
    labels_per_class: Mapping[int, int],
    steps: int = 1001,
) -> tuple[float, float]:
    """Mean precision and recall over the labelled classes at the confidence of best mean F1.

    See :func:`precision_recall_per_class`, whose per-class values this averages.

    Returns:
        (mean precision, mean recall); (0.0, 0.0) without labels or detections.

    Examples:
        >>> scores = np.array([0.95, 0.9, 0.8, 0.7])  # a false positive above three hits
        >>> precision_recall_at_best_f1(scores, np.zeros(4), np.array([0, 1, 1, 1], bool), {0: 4})
        (0.75, 0.75)
    """
    labelled, precision, recall, _ = precision_recall_per_class(scores, classes, true_positive, labels_per_class, steps)
    if not labelled or not len(scores):
        return 0.0, 0.0
    return float(precision.mean()), float(recall.mean())


def _top_per_image(records: Sequence[ImageRecord], max_dets: int) -> list[ImageRecord]:
    kept = []
    for record in records:
        preds = np.asarray(record.predictions).reshape(-1, 6)
        if len(preds) > max_dets:
            preds = preds[np.argsort(-preds[:, 4], kind="stable")[:max_dets]]
        kept.append(ImageRecord(record.key, record.height, record.width, record.labels, preds))
    return kept


def _run_evaluator(gt: dict, dt: list[dict], max_dets: int) -> tuple[np.ndarray, np.ndarray, list[int]]:
    """(stats, precision [T, R, K, A, M], category ids) from faster-coco-eval."""
    with contextlib.redirect_stdout(io.StringIO()):  # the evaluator prints its summary table
        coco_gt = COCO(gt)
        coco_dt = coco_gt.loadRes(dt)
        evaluator = COCOeval_faster(coco_gt, coco_dt, "bbox", print_function=lambda *a, **k: None)
        evaluator.params.maxDets = [1, 10, max_dets]
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    return evaluator.stats, evaluator.eval["precision"], [int(c) for c in evaluator.params.catIds]


def _class_ap(precision: np.ndarray, k: int) -> tuple[float, float]:
    """(AP@0.5, AP@0.5:0.95) of category index k: the mean of the evaluator's valid entries."""
    at_all = precision[:, :, k, 0, -1]  # area "all", most detections

    def mean(x: np.ndarray) -> float:
        return float(x[x > -1].mean()) if (x > -1).any() else 0.0

    return mean(at_all[0]), mean(at_all)


def _label_counts(records: Sequence[ImageRecord]) -> tuple[dict[int, int], dict[int, int]]:
    instances: dict[int, int] = {}
    images: dict[int, int] = {}
    for record in records:
        cls = np.asarray(record.labels).reshape(-1, 5)[:, 0].astype(np.int64)
        for c, n in zip(*np.unique(cls, return_counts=True)):
            instances[int(c)] = instances.get(int(c), 0) + int(n)
            images[int(c)] = images.get(int(c), 0) + 1
    return instances, images


def coco_metrics(records: Sequence[ImageRecord], max_dets: int = 100) -> DetectionMetrics:
    """COCO box metrics of these images, overall and per class.

    Args:
        records: one :class:`ImageRecord` per image (predictions and labels in the same pixels).
        max_dets: detections per image scored, the most confident first (COCO's standard is 100).

    Returns:
        A :class:`DetectionMetrics`: ``{"precision", "recall", "map50", "map"}`` with ``.classes``.
        mAP@0.5 and mAP@0.5:0.95 are the evaluator's. Precision and recall are counted from
        COCO's matching at IoU 0.5 alone (:func:`match_at_iou`), at the confidence of best
        smoothed mean F1 (:func:`precision_recall_per_class`), and averaged over the labelled
        classes; both lie in [0, 1]. All 0.0 when there are no labels or no predictions.

    Examples:
        >>> box = np.array([[0, 10, 10, 50, 50]], np.float32)
        >>> hit = np.array([[10, 10, 50, 50, 0.9, 0]], np.float32)
        >>> coco_metrics([ImageRecord("a.jpg", 64, 64, box, hit)])
        {'precision': 1.0, 'recall': 1.0, 'map50': 1.0, 'map': 1.0}
    """
    records = _top_per_image(records, max_dets)
    instances, images = _label_counts(records)
    gt, dt = to_coco(records)
    empty_rows = [ClassMetrics(c, images[c], n, 0.0, 0.0, 0.0, 0.0) for c, n in sorted(instances.items())]
    if not gt["annotations"] or not dt:
        return DetectionMetrics(None, empty_rows, len(records), sum(instances.values()))
    stats, precision_table, category_ids = _run_evaluator(gt, dt, max_dets)
    predictions = [np.asarray(r.predictions, dtype=np.float64).reshape(-1, 6) for r in records]
    hits = np.concatenate([match_at_iou(r.labels, p) for r, p in zip(records, predictions)])
    detections = np.concatenate(predictions)
    labelled, precision, recall, confidence = precision_recall_per_class(
        detections[:, 4], detections[:, 5].astype(np.int64), hits, instances
    )
    rows = []
    for i, cls in enumerate(labelled):
        ap50, ap = _class_ap(precision_table, category_ids.index(cls + 1))
        rows.append(ClassMetrics(cls, images[cls], instances[cls], float(precision[i]), float(recall[i]), ap50, ap))
    values = {
        "precision": float(precision.mean()) if len(precision) else 0.0,
        "recall": float(recall.mean()) if len(recall) else 0.0,
        "map50": max(float(stats[1]), 0.0),
        "map": max(float(stats[0]), 0.0),
    }
    return DetectionMetrics(values, rows, len(records), sum(instances.values()), confidence)


def _class_name(names: Sequence[str] | Mapping[int, str] | None, cls: int) -> str:
    if isinstance(names, Mapping):
        return str(names.get(cls, cls))
    if names is not None and 0 <= cls < len(names):
        return str(names[cls])
    return str(cls)


def class_table(
    metrics: DetectionMetrics,
    names: Sequence[str] | Mapping[int, str] | None = None,
    per_class: bool | None = None,
) -> str:
    """The table YOLOv5's val prints: a header, an "all" row, then one row per labelled class.

    Columns Class (22 wide, right-aligned), Images, Instances (integers) and P, R, mAP50,
    mAP50-95 (3 significant digits), 11 wide each. A class row's Images counts the images
    holding that class (YOLOv5 repeats the total there).

    Args:
        metrics: from :func:`coco_metrics` or :func:`~ddp_utils.yolo.evaluate.evaluate`.
        names: class names (a list, or YOLOv5's ``{index: name}`` dict); the index when missing.
        per_class: whether to add the class rows; None does as YOLOv5 does: only with more than one class.

    Returns:
        The lines joined by newlines (no trailing newline).

    Examples:
        >>> box = np.array([[0, 10, 10, 50, 50]], np.float32)
        >>> hit = np.array([[10, 10, 50, 50, 0.9, 0]], np.float32)
        >>> print(class_table(coco_metrics([ImageRecord("a.jpg", 64, 64, box, hit)]), ["person"], per_class=True))
                         Class     Images  Instances          P          R      mAP50   mAP50-95
                           all          1          1          1          1          1          1
                        person          1          1          1          1          1          1
    """
    classes = getattr(metrics, "classes", [])
    if per_class is None:
        per_class = (len(names) if names is not None else len(classes)) > 1
    header = f"{'Class':>22}" + "".join(f"{h:>11}" for h in ("Images", "Instances", "P", "R", "mAP50", "mAP50-95"))

    def row(name: str, images: int, instances: int, *values: float) -> str:
        return f"{name:>22}{images:>11d}{instances:>11d}" + "".join(f"{v:>11.3g}" for v in values)

    lines = [
        header,
        row(
            "all",
            getattr(metrics, "images", 0),
            getattr(metrics, "instances", sum(c.instances for c in classes)),
            *(float(metrics[k]) for k in METRIC_KEYS),
        ),
    ]
    if per_class:
        lines += [
            row(_class_name(names, c.cls), c.images, c.instances, c.precision, c.recall, c.map50, c.map)
            for c in classes
        ]
    return "\n".join(lines)
