"""COCO metrics through faster-coco-eval: perfect, shifted, hand-counted P/R, per-class rows, and empty inputs."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ddp_utils.yolo import ImageRecord, coco_metrics, fitness
from ddp_utils.yolo.metrics import (
    ClassMetrics,
    DetectionMetrics,
    class_table,
    empty_metrics,
    to_coco,
)
from ddp_utils.yolo.precision_recall import match_at_iou, precision_recall_at_best_f1


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


def test_a_second_detection_of_one_object_is_a_false_positive_not_a_second_hit():
    # issue 12: one object; A (0.9, IoU 0.625) and B (0.8, IoU 0.909). At IoU 0.5 COCO's greedy matching
    # gives the object to A, the more confident, and B is a false positive: at confidence 0.9 only A is
    # kept, P 1 and R 1. B matching the object at IoU 0.75 must not make it a second true positive (R was 2).
    label = np.array([[0, 0, 0, 100, 100]], np.float32)
    a, b = [0, 0, 100, 62.5, 0.9, 0], [0, 0, 100, 90.9, 0.8, 0]
    assert match_at_iou(label, np.array([a, b])).tolist() == [True, False]
    assert match_at_iou(label, np.array([b, a])).tolist() == [False, True]  # the order given does not matter
    metrics = coco_metrics([ImageRecord("a.jpg", 200, 200, label, np.array([a, b], np.float32))])
    assert (metrics["precision"], metrics["recall"]) == (1.0, 1.0)
    assert 0.8 < metrics.confidence <= 0.9  # on YOLOv5's even confidence grid: above B, at most A
    assert metrics["map50"] == 1.0 and metrics["map"] == pytest.approx(0.6)  # the evaluator's: B counts from 0.75
    assert metrics.classes == [ClassMetrics(0, 1, 1, 1.0, 1.0, 1.0, metrics["map"])]


def test_match_at_iou_keeps_classes_apart_and_each_label_found_once():
    labels = np.array([[0, 0, 0, 10, 10], [1, 0, 0, 10, 10]], np.float32)
    preds = np.array([[0, 0, 10, 10, 0.5, 1], [0, 0, 10, 10, 0.9, 1], [0, 0, 10, 10, 0.7, 2]], np.float32)
    assert match_at_iou(labels, preds).tolist() == [False, True, False]
    assert match_at_iou(np.zeros((0, 5)), preds).tolist() == [False] * 3
    assert match_at_iou(labels, np.zeros((0, 6))).tolist() == []


box = st.tuples(st.integers(0, 2), st.floats(0, 80), st.floats(0, 80), st.floats(1, 60), st.floats(1, 60)).map(
    lambda t: [t[0], t[1], t[2], t[1] + t[3], t[2] + t[4]]
)
image = st.tuples(
    st.lists(box, max_size=5),
    st.lists(st.tuples(box, st.floats(0.01, 1.0)), max_size=8),
)


def _record(i: int, labels: list, preds: list) -> ImageRecord:
    label_array = np.array(labels, np.float32).reshape(-1, 5)
    pred_array = np.array([[*b[1:], score, b[0]] for b, score in preds], np.float32).reshape(-1, 6)
    return ImageRecord(f"{i}.jpg", 160, 160, label_array, pred_array)


@settings(max_examples=60, deadline=None)
@given(st.lists(image, min_size=1, max_size=3), st.booleans())
def test_precision_and_recall_lie_in_0_1_for_any_boxes(images, duplicate):
    records = [_record(i, labels, preds) for i, (labels, preds) in enumerate(images)]
    if duplicate:  # every detection twice: the copies can only be false positives
        records = [ImageRecord(r.key, 160, 160, r.labels, np.concatenate([r.predictions] * 2)) for r in records]
    metrics = coco_metrics(records)
    assert all(0.0 <= metrics[k] <= 1.0 for k in ("precision", "recall", "map50", "map"))
    for row in metrics.classes:
        assert 0.0 <= row.precision <= 1.0 and 0.0 <= row.recall <= 1.0
        assert 0.0 <= row.map <= row.map50 + 1e-9 and row.map50 <= 1.0 + 1e-9  # the evaluator's float sums
        assert row.instances >= row.images >= 1
    if metrics.classes and any(len(r.predictions) for r in records):
        assert metrics["precision"] == pytest.approx(np.mean([r.precision for r in metrics.classes]))
        assert metrics["recall"] == pytest.approx(np.mean([r.recall for r in metrics.classes]))
        assert metrics["map"] == pytest.approx(np.mean([r.map for r in metrics.classes]), abs=1e-6)
    assert metrics.instances == sum(len(r.labels) for r in records) and metrics.images == len(records)


def test_per_class_rows_count_images_and_instances():
    recs = records()  # 3 images, each with classes 0, 1, 2, 0
    recs[2].predictions[:, 5] = 1  # the third image's detections all say class 1: its 0s and 2 are missed
    metrics = coco_metrics(recs)
    assert [(r.cls, r.images, r.instances) for r in metrics.classes] == [(0, 3, 6), (1, 3, 3), (2, 3, 3)]
    by_class = {r.cls: r for r in metrics.classes}
    assert by_class[2].recall == pytest.approx(2 / 3) and by_class[2].precision == 1.0
    assert by_class[1].recall == 1.0 and by_class[1].precision == pytest.approx(3 / 6)
    assert by_class[0].recall == pytest.approx(4 / 6) and by_class[0].map50 < 1.0


def test_class_table_has_yolov5_val_layout():
    metrics = coco_metrics(records())
    lines = class_table(metrics, {0: "person", 1: "car", 2: "dog"}).splitlines()
    # YOLOv5's val writes its header and rows with these printf formats: compare against them as written
    header, row = "%22s" + "%11s" * 6, "%22s" + "%11i" * 2 + "%11.3g" * 4
    assert lines[0] == header % ("Class", "Images", "Instances", "P", "R", "mAP50", "mAP50-95")  # noqa: UP031
    assert lines[1] == row % ("all", 3, 12, 1, 1, 1, 1)  # noqa: UP031
    assert lines[2] == row % ("person", 3, 6, 1, 1, 1, 1)  # noqa: UP031
    assert [line.split()[0] for line in lines[1:]] == ["all", "person", "car", "dog"]
    assert class_table(metrics, ["a", "b", "c"]) == class_table(metrics, {0: "a", 1: "b", 2: "c"})
    assert len(class_table(metrics, ["only"])) < len(class_table(metrics))  # one class: no class rows, as YOLOv5
    assert class_table(metrics, per_class=False).count("\n") == 1
    plain = class_table({"precision": 0.5, "recall": 0.25, "map50": 0.125, "map": 0.0625})  # any metrics dict
    assert plain.splitlines()[1].split() == ["all", "0", "0", "0.5", "0.25", "0.125", "0.0625"]


def test_metrics_survive_pickling_with_their_rows():
    import pickle

    metrics = coco_metrics(records())
    again = pickle.loads(pickle.dumps(metrics))
    assert again == metrics and again.classes == metrics.classes and again.images == 3
    assert isinstance(again, DetectionMetrics) and DetectionMetrics() == empty_metrics()


def test_fitness_takes_yolov5s_array_form():
    results = np.array([[0.9, 0.8, 0.6, 0.4, 0.1, 0.2, 0.3], [0, 0, 1.0, 0.0, 0, 0, 0]])
    assert fitness(results) == pytest.approx([0.42, 0.1])
    assert fitness(results).shape == (2,)
    assert fitness(results[0]) == pytest.approx(0.42)
    with pytest.raises(ValueError, match="P, R, mAP"):
        fitness(np.zeros((2, 3)))


def test_many_low_score_detections_do_not_drag_p_down():
    """conf 0.001 leaves thousands of low-score boxes: P and R come from the high-confidence peak of F1."""

    rng = np.random.default_rng(0)
    scores = np.concatenate((rng.uniform(0.001, 0.05, 5000), rng.uniform(0.85, 0.95, 10)))
    hits = np.concatenate((np.zeros(5000, bool), np.ones(10, bool)))
    precision, recall = precision_recall_at_best_f1(scores, np.zeros(len(scores)), hits, {0: 10})
    assert precision == 1.0 and recall == 1.0
