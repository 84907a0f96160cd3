"""Precision and recall at YOLOv5's operating point: predictions matched to labels at IoU 0.5, then the one
confidence where the (smoothed) mean F1 over the labelled classes peaks.

COCO's mAP comes from the evaluator (:mod:`ddp_utils.yolo.metrics`); these are the P and R that YOLOv5's
val reports beside it, computed from the same matching.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

PR_IOU = 0.5  # the IoU threshold precision and recall are counted at


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
