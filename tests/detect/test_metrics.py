"""COCO metrics through faster-coco-eval: perfect, shifted, hand-counted P/R, and empty inputs."""

from __future__ import annotations

import numpy as np
import pytest

from ddp_utils.detect import ImageRecord, coco_metrics, fitness
from ddp_utils.detect.metrics import empty_metrics, precision_recall_at_best_f1, to_coco


def boxes_image(key: str, n: int = 4, size: int = 200) -> np.ndarray:
    """Non-overlapping 30 px boxes along the diagonal, classes cycling 0, 1, 2."""
    return np.array([[i % 3, 10 + 45 * i, 10 + 45 * i, 40 + 45 * i, 40 + 45 * i] for i in range(n)], np.float32)


def perfect(labels: np.ndarray) -> np.ndarray:
    return np.concatenate([labels[:, 1:5], np.full((len(labels), 1), 0.9), labels[:, :1]], 1).astype(np.float32)


def records(shift: float = 0.0) -> list[ImageRecord]:
    out = []
    for i in range(3):
        labels = boxes_image(f"{i}.jpg")
        preds = perfect(labels)
        preds[:, [0, 2]] += shift
        out.append(ImageRecord(f"{i}.jpg", 200, 200, labels, preds))
    return out


def test_perfect_predictions_score_one():
    assert coco_metrics(records()) == {"precision": 1.0, "recall": 1.0, "map50": 1.0, "map": 1.0}


def test_shifted_predictions_score_lower():
    exact = coco_metrics(records())
    slightly = coco_metrics(records(shift=3.0))  # IoU 0.82: still a hit at 0.5, a miss at high IoU
    badly = coco_metrics(records(shift=20.0))  # IoU 0.2: a miss everywhere
    assert slightly["map50"] == pytest.approx(1.0) and 0.5 < slightly["map"] < exact["map"]
    assert badly["map50"] == 0.0 and badly["map"] == 0.0 and badly["recall"] == 0.0
    assert fitness(badly) < fitness(slightly) < fitness(exact) == pytest.approx(1.0)


def test_precision_and_recall_at_best_f1_by_hand():
    # one class, 4 objects; detections: a false positive at 0.95, then hits at 0.9, 0.8, 0.7
    labels = np.array([[0, 10 + 40 * i, 10, 40 + 40 * i, 40] for i in range(4)], np.float32)
    preds = np.array(
        [[100, 150, 130, 180, 0.95, 0], [10, 10, 40, 40, 0.9, 0], [50, 10, 80, 40, 0.8, 0], [90, 10, 120, 40, 0.7, 0]],
        np.float32,
    )
    metrics = coco_metrics([ImageRecord("a.jpg", 200, 200, labels, preds)])
    # best F1 at confidence <= 0.7: 3 of 4 detections right, 3 of 4 objects found
    assert metrics["precision"] == pytest.approx(0.75) and metrics["recall"] == pytest.approx(0.75)
    # AP@0.5 from the 101-point interpolated curve: precision 0.75 up to recall 0.75, then 0
    assert metrics["map50"] == pytest.approx(0.75 * 76 / 101)


def test_precision_recall_helper():
    scores = np.array([0.9, 0.8, 0.6, 0.5, 0.4])
    classes = np.array([0, 0, 1, 0, 2])  # class 2 has no labels: left out
    hits = np.array([True, False, True, True, False])
    # class 0 (2 labels): at 0.5 P 2/3, R 1; class 1 (1 label): P 1, R 1 -> mean F1 0.9 beats every other threshold
    precision, recall = precision_recall_at_best_f1(scores, classes, hits, {0: 2, 1: 1, 2: 0})
    assert precision == pytest.approx((2 / 3 + 1) / 2) and recall == pytest.approx(1.0)
    assert precision_recall_at_best_f1(scores, classes, hits, {2: 0}) == (0.0, 0.0)
    assert precision_recall_at_best_f1(np.zeros(0), np.zeros(0), np.zeros(0, bool), {0: 3}) == (0.0, 0.0)


def test_empty_cases_are_zeros():
    labels = boxes_image("a.jpg")
    no_predictions = [ImageRecord("a.jpg", 200, 200, labels, np.zeros((0, 6), np.float32))]
    no_labels = [ImageRecord("a.jpg", 200, 200, np.zeros((0, 5), np.float32), perfect(labels))]
    assert coco_metrics(no_predictions) == empty_metrics()
    assert coco_metrics(no_labels) == empty_metrics()
    assert coco_metrics([]) == empty_metrics()
    # an image without labels among labelled ones: its detections are false positives
    mixed = [*records(), ImageRecord("empty.jpg", 200, 200, np.zeros((0, 5), np.float32), perfect(labels))]
    assert 0 < coco_metrics(mixed)["precision"] < 1.0


def test_coco_dicts():
    gt, dt = to_coco(records()[:1])
    assert [c["id"] for c in gt["categories"]] == [1, 2, 3]
    assert gt["annotations"][1]["bbox"] == [55.0, 55.0, 30.0, 30.0] and gt["annotations"][1]["category_id"] == 2
    assert dt[0] == {"image_id": 1, "category_id": 1, "bbox": [10.0, 10.0, 30.0, 30.0], "score": pytest.approx(0.9)}


def test_max_dets_keeps_the_most_confident():
    labels = np.array([[0, 10, 10, 40, 40]], np.float32)
    decoys = np.array([[150, 150, 180, 180, 0.5, 0]] * 150, np.float32)
    preds = np.concatenate([decoys, [[10, 10, 40, 40, 0.1, 0]]]).astype(np.float32)  # the hit scores lowest
    image = [ImageRecord("a.jpg", 200, 200, labels, preds)]
    assert coco_metrics(image, max_dets=100)["recall"] == 0.0
    assert coco_metrics(image, max_dets=300)["recall"] == 1.0
