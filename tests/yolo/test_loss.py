"""ComputeLoss: target assignment by hand, zero-target safety, and a tiny model overfitting one batch."""

from __future__ import annotations

import cv2
import numpy as np
import pytest
import torch

from ddp_utils.data import load_hyp
from ddp_utils.yolo import ComputeLoss, FocalLoss, Model, load_model_yaml, scale_loss_gains
from ddp_utils.yolo.loss import ciou_loss

from ..hostwait import HostWaitCounter, cuda_sync_errors

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


class ReferenceLoss(ComputeLoss):
    """ComputeLoss as it was before the dense, sync-free assignment: the reference it must equal."""

    def __call__(self, preds, targets):
        from torchvision.ops import complete_box_iou_loss

        from ddp_utils.boxes import xywh2xyxy

        device = preds[0].device
        loss_box, loss_obj, loss_cls = (torch.zeros(1, device=device) for _ in range(3))
        for level, (pred, (cls, box, index, anchors)) in enumerate(zip(preds, self.old_build_targets(preds, targets))):
            obj_target = torch.zeros(pred.shape[:4], dtype=pred.dtype, device=device)
            if cls.shape[0]:
                picked = pred[index]
                pxy, pwh, _, pcls = picked.split((2, 2, 1, self.nc), 1)
                pxy = pxy.sigmoid() * 2 - 0.5
                pwh = (pwh.sigmoid() * 2) ** 2 * anchors
                ciou_loss = complete_box_iou_loss(
                    xywh2xyxy(torch.cat((pxy, pwh), 1).float()), xywh2xyxy(box), reduction="none"
                )
                loss_box += ciou_loss.mean()
                obj_target[index] = (1.0 - ciou_loss).detach().clamp(0).to(obj_target.dtype)
                if self.nc > 1:
                    cls_target = torch.full_like(pcls, self.cls_neg)
                    cls_target[torch.arange(cls.shape[0], device=device), cls] = self.cls_pos
                    loss_cls += self.bce_cls(pcls, cls_target)
            loss_obj += self.bce_obj(pred[..., 4], obj_target) * self.balance[level]
        loss_box *= self.hyp["box"]
        loss_obj *= self.hyp["obj"]
        loss_cls *= self.hyp["cls"]
        return (loss_box + loss_obj + loss_cls) * preds[0].shape[0], torch.cat((loss_box, loss_obj, loss_cls)).detach()

    def old_build_targets(self, preds, targets):
        device = targets.device
        n_targets = targets.shape[0]
        anchor_index = torch.arange(self.na, device=device, dtype=torch.float32).view(self.na, 1).repeat(1, n_targets)
        per_anchor = torch.cat((targets.float().repeat(self.na, 1, 1), anchor_index[..., None]), 2)
        offsets_all = torch.tensor([[0, 0], [1, 0], [0, 1], [-1, 0], [0, -1]], dtype=torch.float32, device=device) * 0.5
        result = []
        for level, pred in enumerate(preds):
            ny, nx = pred.shape[2], pred.shape[3]
            gain = torch.tensor([1, 1, nx, ny, nx, ny, 1], device=device, dtype=torch.float32)
            t = per_anchor * gain
            anchors = self.detect.anchors[level].detach().to(device)
            if n_targets:
                ratio = t[..., 4:6] / anchors[:, None]
                t = t[torch.max(ratio, 1 / ratio).max(2)[0] < self.anchor_t]
                xy = t[:, 2:4]
                xy_inv = gain[[2, 3]] - xy
                left, up = ((xy % 1 < 0.5) & (xy > 1)).T
                right, down = ((xy_inv % 1 < 0.5) & (xy_inv > 1)).T
                use = torch.stack((torch.ones_like(left), left, up, right, down))
                t = t.repeat((5, 1, 1))[use]
                offsets = (torch.zeros_like(xy)[None] + offsets_all[:, None])[use]
            else:
                t = per_anchor[0]
                offsets = torch.zeros_like(t[:, 2:4])
            image, cls = t[:, 0].long(), t[:, 1].long()
            xy, wh, anchor = t[:, 2:4], t[:, 4:6], t[:, 6].long()
            cell = (xy - offsets).long()
            gx, gy = cell[:, 0].clamp(0, nx - 1), cell[:, 1].clamp(0, ny - 1)
            box = torch.cat((xy - torch.stack((gx, gy), 1), wh), 1)
            result.append((cls, box, (image, anchor, gy, gx), anchors[anchor]))
        return result


def random_targets(gen: torch.Generator, batch: int, per_image: int, nc: int, grid: int = 8) -> torch.Tensor:
    """Random labels; a third snapped to cell borders of the finest grid (and the image edges)."""
    n = batch * per_image
    image = torch.arange(batch).repeat_interleave(per_image).float()
    cls = torch.randint(0, nc, (n,), generator=gen).float()
    xy = torch.rand(n, 2, generator=gen)
    snapped = torch.rand(n, generator=gen) < 0.33
    xy[snapped] = (xy[snapped] * grid).round() / grid  # 0, 1/grid, ..., 1: exactly on a border
    wh = torch.rand(n, 2, generator=gen) * 0.6 + 0.01
    return torch.cat((image[:, None], cls[:, None], xy, wh), 1)


@pytest.mark.parametrize(
    ("nc", "per_image", "extra_hyp"),
    [(3, 0, {}), (3, 1, {}), (3, 4, {}), (5, 40, {}), (1, 6, {}), (4, 8, {"fl_gamma": 1.5, "label_smoothing": 0.1})],
)
def test_dense_loss_equals_the_reference_values_and_gradients(nc, per_image, extra_hyp):
    model = tiny_model(nc=nc)
    hyp = {**HYP, **extra_hyp}
    gen = torch.Generator().manual_seed(nc * 100 + per_image)
    batch = 3
    for _ in range(3):
        targets = random_targets(gen, batch, per_image, nc)
        base = [torch.randn(batch, 3, n, n, 5 + nc, generator=gen) for n in (8, 4, 2)]
        results = []
        for loss_fn in (ComputeLoss(model, hyp, dense=True), ComputeLoss(model, hyp), ReferenceLoss(model, hyp)):
            preds = [p.clone().requires_grad_() for p in base]
            loss, items = loss_fn(preds, targets)
            loss.backward()
            results.append((loss.detach(), items, [p.grad for p in preds]))
        (loss, items, grads), (cpu_loss, cpu_items, cpu_grads), (ref_loss, ref_items, ref_grads) = results
        # both forms (dense on a GPU, selected elsewhere): torchvision's CIoU and the mask-free one
        # agree to float rounding, summed in another order
        for got_loss, got_items, got_grads in ((loss, items, grads), (cpu_loss, cpu_items, cpu_grads)):
            torch.testing.assert_close(got_loss, ref_loss, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(got_items, ref_items, rtol=1e-5, atol=1e-6)
            for grad, ref_grad in zip(got_grads, ref_grads):
                torch.testing.assert_close(grad, ref_grad, rtol=1e-4, atol=1e-7)


def test_dense_assignment_selects_what_the_old_one_did():
    model = tiny_model(nc=3)
    compute_loss = ReferenceLoss(model, HYP)
    gen = torch.Generator().manual_seed(7)
    targets = random_targets(gen, 2, 25, 3)
    preds = [torch.zeros(2, 3, n, n, 8) for n in (8, 4, 2)]
    dense = compute_loss.dense_targets(preds, targets)
    for level, (new, old) in enumerate(
        zip(compute_loss.build_targets(preds, targets), compute_loss.old_build_targets(preds, targets))
    ):
        # every candidate keeps its slot: the shapes follow from the number of targets alone
        assert dense[level].valid.shape == (5 * 3 * targets.shape[0],)
        assert len(new[0]) == len(old[0]) > 0
        torch.testing.assert_close(new[1], old[1])
        assert all(torch.equal(a, b) for a, b in zip(new[2], old[2]))
        assert torch.equal(new[0], old[0]) and torch.equal(new[3], old[3])


def test_compute_loss_takes_hyp_from_the_model_as_yolov5_does():
    model = tiny_model()
    images, targets = rectangles_batch()
    with pytest.raises(ValueError, match=r"ComputeLoss\(model, hyp\)"):
        ComputeLoss(model)
    model.hyp = HYP
    preds = model(images)
    from_model, _ = ComputeLoss(model)(preds, targets)
    explicit, _ = ComputeLoss(model, HYP)(preds, targets)
    assert torch.equal(from_model, explicit)
    assert ComputeLoss(torch.nn.DataParallel(model)).hyp is HYP


def test_autobalance_keeps_weights_relative_to_stride_16_on_the_device():
    model = tiny_model()
    model.hyp = HYP
    images, targets = rectangles_batch()
    compute_loss = ComputeLoss(model, True)  # YOLOv5's positional autobalance
    assert compute_loss.autobalance and compute_loss.ssi == 1
    for _ in range(2):
        loss, _ = compute_loss(model(images), targets)
        assert torch.isfinite(loss).all()
    assert all(isinstance(b, torch.Tensor) for b in compute_loss.balance)
    assert float(compute_loss.balance[1]) == pytest.approx(1.0)
    assert float(compute_loss.balance[0]) > float(compute_loss.balance[2])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_loss_never_waits_for_the_device_and_matches_the_reference():
    model = tiny_model(nc=4).cuda()
    gen = torch.Generator().manual_seed(5)
    targets = random_targets(gen, 2, 10, 4).cuda()
    preds = [torch.randn(2, 3, n, n, 9, generator=gen).cuda().requires_grad_() for n in (8, 4, 2)]
    compute_loss = ComputeLoss(model, HYP)
    compute_loss(preds, targets)  # the first call copies its few constants to the device
    with cuda_sync_errors() as backward_syncs:  # any sync raises; the backward's aten ops are checked one by one
        loss, items = compute_loss(preds, targets)
        loss.backward()
    assert backward_syncs.ops == {}
    ref_loss, ref_items = ReferenceLoss(model, HYP)(preds, targets)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(items, ref_items, rtol=1e-5, atol=1e-6)


def test_ciou_loss_equals_torchvisions_and_has_no_mask():
    from torchvision.ops import complete_box_iou_loss

    from ddp_utils.boxes import xywh2xyxy

    gen = torch.Generator().manual_seed(3)
    xy = torch.rand(200, 2, 2, generator=gen) * 4
    wh = torch.rand(200, 2, 2, generator=gen) * 3 + 0.05
    xy[:20, 1] = xy[:20, 0] + 10  # far apart: no intersection
    ours = ciou_loss(xy[:, 0], wh[:, 0], xy[:, 1], wh[:, 1])
    theirs = complete_box_iou_loss(
        xywh2xyxy(torch.cat((xy[:, 0], wh[:, 0]), 1)), xywh2xyxy(torch.cat((xy[:, 1], wh[:, 1]), 1))
    )
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)
    with HostWaitCounter() as counter:
        ciou_loss(xy[:, 0].requires_grad_(), wh[:, 0], xy[:, 1], wh[:, 1]).sum().backward()
    assert not counter.waits, counter.lines()


def yolov5s_loss_inputs(batch: int = 2, size: int = 64):
    torch.manual_seed(0)
    model = Model("yolov5s.yaml", ch=3, nc=80)
    hyp = scale_loss_gains(load_hyp("hyp.scratch-low.yaml"), 3, 80, size)
    gen = torch.Generator().manual_seed(1)
    targets = random_targets(gen, batch, 6, 80)
    return model, hyp, model(torch.rand(batch, 3, size, size, generator=gen)), targets


def test_dense_loss_on_cpu_never_waits_and_stays_within_its_op_budget():
    model, hyp, preds, targets = yolov5s_loss_inputs()
    compute_loss = ComputeLoss(model, hyp, dense=True)
    compute_loss(preds, targets)  # the first call makes its constants
    with HostWaitCounter() as forward:
        loss, items = compute_loss(preds, targets)
    with HostWaitCounter() as backward:
        loss.backward()
    assert not forward.waits and not backward.waits, (forward.lines(), backward.lines())
    assert forward.ops <= 200, forward.by_op.most_common(20)  # was 544 (torchvision CIoU, level by level)
    assert torch.isfinite(items).all()


def test_bf16_predictions_give_the_float32_loss():
    model, hyp, preds, targets = yolov5s_loss_inputs()
    compute_loss = ComputeLoss(model, hyp, dense=True)
    rounded = [p.detach().to(torch.bfloat16) for p in preds]
    loss_bf16, items_bf16 = compute_loss(rounded, targets)
    loss_fp32, items_fp32 = compute_loss([p.float() for p in rounded], targets)
    assert loss_bf16.dtype == items_bf16.dtype == torch.float32
    assert torch.equal(loss_bf16, loss_fp32) and torch.equal(items_bf16, items_fp32)
