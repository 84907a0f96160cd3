"""results.png, labels.jpg and train_batch0.jpg: written, readable, and showing what they should."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch

from ddp_utils.run import ResultsLogger, class_color, plot_images, plot_labels, plot_results, results_values


def assert_image(path, min_side=100):
    image = cv2.imread(str(path))
    assert image is not None, f"{path} is not a readable image"
    assert min(image.shape[:2]) >= min_side and path.stat().st_size > 0
    assert image.std() > 0  # not a blank canvas
    return image


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_results_png(tmp_path):
    logger = ResultsLogger(tmp_path, tensorboard=False)
    for epoch in range(4):
        metrics = {"precision": 0.1 * epoch, "recall": 0.2 * epoch, "map50": 0.1 * epoch, "map": 0.05 * epoch}
        logger.log(epoch, results_values([1 / (epoch + 1)] * 3, metrics, [0.5, 0.4, 0.3], [0.01] * 3))
    out = plot_results(tmp_path / "results.csv")
    assert out == tmp_path / "results.png"
    assert_image(out, min_side=600)


def test_results_png_needs_rows(tmp_path):
    (tmp_path / "results.csv").write_text("epoch,train/box_loss\n")
    with pytest.raises(ValueError, match="results.csv has no epochs"):
        plot_results(tmp_path / "results.csv")


def test_labels_jpg(tmp_path):
    rng = np.random.default_rng(0)
    labels = []
    for _ in range(30):
        n = int(rng.integers(0, 6))
        cls = rng.integers(0, 3, size=(n, 1))
        boxes = rng.uniform(0.1, 0.5, size=(n, 4))
        labels.append(np.concatenate([cls, boxes], 1).astype(np.float32))
    labels.append(np.zeros((0, 5), np.float32))  # an image without objects
    out = plot_labels(labels, ["circle", "square", "triangle"], tmp_path)
    assert out == tmp_path / "labels.jpg"
    assert_image(out, min_side=800)


def test_labels_jpg_without_any_box(tmp_path):
    assert_image(plot_labels([np.zeros((0, 5), np.float32)], None, tmp_path))


def test_train_batch_draws_boxes_where_the_targets_are(tmp_path):
    b, h, w = 4, 96, 128
    imgs = torch.full((b, 3, h, w), 114, dtype=torch.uint8)
    # one box per image, image i's box is of class i; normalised (img, cls, xc, yc, w, h)
    targets = torch.tensor([[i, i, 0.5, 0.6, 0.5, 0.5] for i in range(b)], dtype=torch.float32)
    out = plot_images(imgs, targets, tmp_path / "train_batch0.jpg", paths=[f"im{i}.jpg" for i in range(b)])
    mosaic = assert_image(out, min_side=2 * h)
    assert mosaic.shape[:2] == (2 * h, 2 * w)  # a 2 x 2 grid at full size
    gray = np.array([114, 114, 114])
    for i in range(b):
        x0, y0 = (i % 2) * w, (i // 2) * h
        left, right = int(x0 + (0.5 - 0.25) * w), int(x0 + (0.5 + 0.25) * w)
        bottom, centre_y = int(y0 + (0.6 + 0.25) * h), int(y0 + 0.6 * h)
        edge = mosaic[bottom - 1 : bottom + 2, (left + right) // 2].astype(int)  # BGR, the box's bottom edge
        expected = np.array(class_color(i)[::-1])
        assert np.abs(edge - expected).sum(1).min() < 60, f"image {i}: no class-{i} coloured edge at the box"
        inside = mosaic[centre_y, (left + right) // 2].astype(int)
        assert np.abs(inside - gray).max() < 12, f"image {i}: the box's inside was painted"


def test_train_batch_scales_large_batches_down(tmp_path):
    imgs = np.random.default_rng(0).integers(0, 255, size=(16, 3, 640, 640), dtype=np.uint8)
    targets = np.zeros((0, 6), np.float32)
    out = plot_images(imgs, targets, tmp_path / "train_batch1.jpg", max_size=1280)
    assert max(assert_image(out).shape[:2]) <= 1280


def test_train_batch_rejects_a_wrong_layout(tmp_path):
    with pytest.raises(ValueError, match=r"\[B, 3, H, W\]"):
        plot_images(torch.zeros(2, 8, 8, 3), torch.zeros(0, 6), tmp_path / "x.jpg")


def test_writers_write_on_any_rank_the_caller_decides(tmp_path, monkeypatch):
    """No rank check hidden in a writer (YOLOv5's plots have none either): train.py calls them on rank 0."""
    from ddp_utils.run import build_checkpoint, load_checkpoint, save_checkpoint
    from ddp_utils.run.report import finish_run

    metrics = {"precision": 0.5, "recall": 0.5, "map50": 0.5, "map": 0.25}
    model = torch.nn.Linear(2, 1)
    best = tmp_path / "weights" / "best.pt"
    best.parent.mkdir()
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    logger = ResultsLogger(tmp_path, tensorboard=False)
    for epoch in range(2):
        logger.log(epoch, results_values([0.1] * 3, metrics, [0.5, 0.4, 0.3], [0.01] * 3))
    save_checkpoint(build_checkpoint(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1)), best)
    assert_image(plot_labels([np.ones((1, 5), np.float32) * 0.5], None, tmp_path))
    imgs = torch.full((1, 3, 64, 64), 200, dtype=torch.uint8)
    assert plot_images(imgs, torch.tensor([[0, 0, 0.5, 0.5, 0.5, 0.5]]), tmp_path / "b.jpg").is_file()
    finish_run(tmp_path, metrics, epochs_done=2)
    assert load_checkpoint(best)["optimizer"] is None
    assert_image(tmp_path / "results.png", min_side=600)
    assert {"b.jpg", "labels.jpg", "results.png", "results.csv", "weights"} <= {p.name for p in tmp_path.iterdir()}
