"""ComputeLoss: target assignment by hand, zero-target safety, and a tiny model overfitting one batch."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch

from ddp_utils.detect import ComputeLoss, FocalLoss, Model, load_model_yaml

HYP = {"box": 0.05, "obj": 1.0, "cls": 0.5, "cls_pw": 1.0, "obj_pw": 1.0, "anchor_t": 4.0, "fl_gamma": 0.0}
COLOURS = [(255, 0, 0), (0, 255, 0), (0, 0, 255)]


def tiny_model(nc: int = 3, width: float = 0.125, seed: int = 0) -> Model:
    torch.manual_seed(seed)
    cfg, _ = load_model_yaml("yolov5n.yaml")
    return Model({**cfg, "width_multiple": width}, nc=nc)


def rectangles_batch(batch: int = 2, size: int = 128, per_image: int = 3, seed: int = 0):
    """Images of filled rectangles whose colour is their class, and their targets."""
    rng = np.random.default_rng(seed)
    images, targets = [], []
    for b in range(batch):
        image = np.full((size, size, 3), 114, np.uint8)
        for _ in range(per_image):
            w, h = (int(v) for v in rng.integers(16, 60, 2))
            x0, y0 = int(rng.integers(0, size - w)), int(rng.integers(0, size - h))
            cls = int(rng.integers(0, len(COLOURS)))
            cv2.rectangle(image, (x0, y0), (x0 + w - 1, y0 + h - 1), COLOURS[cls], thickness=-1)
            targets.append([b, cls, (x0 + w / 2) / size, (y0 + h / 2) / size, w / size, h / size])
        images.append(torch.from_numpy(image).permute(2, 0, 1))
    return torch.stack(images).float() / 255, torch.tensor(targets, dtype=torch.float32)


def test_tiny_model_overfits_one_batch():
    model = tiny_model()
    images, targets = rectangles_batch()
    compute_loss = ComputeLoss(model, HYP)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    losses = []
    for _ in range(40):
        loss, items = compute_loss(model(images), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        assert torch.isfinite(items).all() and not items.requires_grad
    assert losses[-1] < 0.6 * losses[0], losses


def test_loss_is_batch_size_times_the_items():
    model = tiny_model()
    images, targets = rectangles_batch(batch=3)
    loss, items = ComputeLoss(model, HYP)(model(images), targets)
    assert loss.shape == (1,) and items.shape == (3,)
    assert loss.item() == pytest.approx(3 * items.sum().item(), rel=1e-6)
    assert (items > 0).all()


def test_no_targets_is_finite_and_trains_objectness():
    model = tiny_model()
    images, _ = rectangles_batch()
    loss, items = ComputeLoss(model, HYP)(model(images), torch.zeros((0, 6)))
    assert torch.isfinite(loss).all() and items[0] == 0 and items[2] == 0 and items[1] > 0
    loss.backward()
    head = model.model[-1].m[0]
    objectness_grad = head.bias.grad.view(3, -1)[:, 4]
    assert torch.isfinite(head.weight.grad).all() and (objectness_grad != 0).all()


def test_target_assignment_by_hand():
    model = tiny_model(nc=2)
    compute_loss = ComputeLoss(model, HYP)
    # 64 px input: grids 8x8, 4x4, 2x2. One 16 px object centred at (0.3, 0.7).
    preds = [torch.zeros(1, 3, n, n, 7) for n in (8, 4, 2)]
    targets = torch.tensor([[0, 1, 0.3, 0.7, 0.25, 0.25]])
    levels = compute_loss.build_targets(preds, targets)
    # P3: all 3 anchors within 4x of 2 x 2 cells; P4: (3.7, 7.4) is too tall for 1 x 1; P5: none
    assert [len(cls) for cls, *_ in levels] == [9, 6, 0]
    cls, box, (image, anchor, gy, gx), anchors = levels[0]
    # centre at grid (2.4, 5.6): its own cell, the left one (x leans left), the one below (y leans down)
    assert set(zip(gy.tolist(), gx.tolist())) == {(5, 2), (5, 1), (6, 2)}
    assert sorted(anchor.tolist()) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert (cls == 1).all() and (image == 0).all()
    assert ((box[:, :2] >= -0.5) & (box[:, :2] <= 1.5)).all() and torch.allclose(box[:, 2:], torch.tensor(2.0))
    for cell_y, cell_x, offset in zip(gy, gx, box[:, :2]):
        assert torch.allclose(offset, torch.tensor([2.4, 5.6]) - torch.stack((cell_x, cell_y)).float(), atol=1e-5)
    assert torch.allclose(anchors, model.model[-1].anchors[0][anchor])


def test_focal_loss_and_label_smoothing():
    model = tiny_model()
    images, targets = rectangles_batch()
    plain = ComputeLoss(model, HYP)
    focal = ComputeLoss(model, {**HYP, "fl_gamma": 1.5, "label_smoothing": 0.1})
    assert isinstance(focal.bce_cls, FocalLoss) and isinstance(focal.bce_obj, FocalLoss)
    assert (focal.cls_pos, focal.cls_neg) == (0.95, 0.05)
    preds = model(images)
    plain_loss, _ = plain(preds, targets)
    focal_loss, _ = focal(preds, targets)
    assert torch.isfinite(focal_loss) and focal_loss.item() < plain_loss.item()  # easy negatives weigh less


def test_wrapped_model_and_missing_hyp():
    model = tiny_model()
    wrapped = torch.nn.DataParallel(model)  # stands in for DDP: both expose .module
    assert ComputeLoss(wrapped, HYP).nc == 3
    with pytest.raises(KeyError, match="anchor_t"):
        ComputeLoss(model, {k: v for k, v in HYP.items() if k != "anchor_t"})


def test_assignment_follows_anchors_changed_after_the_loss_was_made():
    model = tiny_model(nc=2)
    compute_loss = ComputeLoss(model, HYP)
    preds = [torch.zeros(1, 3, n, n, 7) for n in (8, 4, 2)]
    targets = torch.tensor([[0, 1, 0.3, 0.7, 0.25, 0.25]])
    assert len(compute_loss.build_targets(preds, targets)[0][0]) == 9
    model.model[-1].anchors.mul_(10)  # far too large for a 2-cell object now
    assert len(compute_loss.build_targets(preds, targets)[0][0]) == 0
