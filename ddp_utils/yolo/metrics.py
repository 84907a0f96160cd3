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

from .precision_recall import match_at_iou, precision_recall_per_class

METRIC_KEYS = ("precision", "recall", "map50", "map")
FITNESS_WEIGHTS = (0.0, 0.0, 0.1, 0.9)  # [P, R, mAP@0.5, mAP@0.5:0.95], as YOLOv5 weighs them


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
