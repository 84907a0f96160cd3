"""evaluate(): the val loop on hand-made batches, single-process and sharded over a real gloo group."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ddp_utils.yolo import ComputeLoss, evaluate
from ddp_utils.yolo.evaluate import batch_records
from ddp_utils.yolo.metrics import DetectionMetrics, class_table
from tests.multiproc import describe, launch, records
from tests.workers.yolo_scenarios import (
    IMG,
    ORIGINAL,
    PredictionStub,
    build_stub,
    make_batches,
    make_images,
)


def test_perfect_predictions_score_one_in_original_pixels():
    images = make_images(5, jitter=0.0, misses=False)
    stub = PredictionStub(images)
    batches = make_batches(images, 2)
    metrics, val_loss = evaluate(stub, batches)
    assert metrics == {"precision": 1.0, "recall": 1.0, "map50": 1.0, "map": 1.0}
    assert torch.equal(val_loss, torch.zeros(3))
    as_float = [(imgs.float() / 255, *rest) for imgs, *rest in batches]  # already-scaled images work too
    assert evaluate(stub, as_float)[0] == metrics


def test_shifted_predictions_score_lower():
    images = make_images(6, jitter=0.0, misses=False)
    batches = make_batches(images, 3)
    exact = evaluate(PredictionStub(images), batches)[0]
    shifted_images = [(labels, dets + np.array([3.0, 0, 0, 0, 0, 0], np.float32)) for labels, dets in images]
    shifted = evaluate(PredictionStub(shifted_images), batches)[0]
    assert exact["map"] == 1.0 and shifted["map"] < exact["map"] and shifted["map50"] <= exact["map50"]
    noisy_images = make_images(6, jitter=4.0, misses=True)
    noisy = evaluate(PredictionStub(noisy_images), make_batches(noisy_images, 3))[0]
    assert 0 < noisy["map"] < 1 and 0 < noisy["precision"] < 1 and 0 < noisy["recall"] < 1


def test_per_class_rows_come_back_with_the_metrics():
    images = make_images(6, jitter=4.0, misses=True)
    metrics, _ = evaluate(PredictionStub(images), make_batches(images, 4))
    assert isinstance(metrics, DetectionMetrics) and set(metrics) == {"precision", "recall", "map50", "map"}
    assert metrics.images == 6 and metrics.instances == sum(len(labels) for labels, _ in images)
    assert metrics.classes and sum(row.instances for row in metrics.classes) == metrics.instances
    assert metrics["map"] == pytest.approx(np.mean([row.map for row in metrics.classes]), abs=1e-9)
    table = class_table(metrics, {row.cls: f"class{row.cls}" for row in metrics.classes}).splitlines()
    assert table[1].split()[:3] == ["all", "6", str(metrics.instances)] and len(table) == 2 + len(metrics.classes)


def test_records_undo_the_letterbox():
    # one label and one detection at the same letterboxed box: (16, 24)-(48, 40) in the 64 px input
    targets = torch.tensor([[0, 2, 0.5, 0.5, 0.5, 0.25]])
    detection = [torch.tensor([[16.0, 24.0, 48.0, 40.0, 0.8, 2.0]])]
    shapes = ((ORIGINAL, ((0.5, 0.5), (0, 8))),)
    (record,) = batch_records(detection, targets, (IMG, IMG), ("a.jpg",), shapes)
    expected = np.array([32.0, 32.0, 96.0, 64.0])  # (x - pad) / gain, in the 96 x 128 original
    assert (record.height, record.width, record.key) == (96, 128, "a.jpg")
    assert np.allclose(record.labels, [[2, *expected]]) and np.allclose(record.predictions[0, :4], expected)
    (unpadded,) = batch_records(detection, targets, (IMG, IMG), ("a.jpg",), (None,))  # mosaic: no letterbox
    assert np.allclose(unpadded.labels[0, 1:], [16, 24, 48, 40])


def test_real_model_with_loss_and_mode_restored():
    images = make_images(4)
    model, compute_loss = build_stub(images)
    model.train()
    metrics, val_loss = evaluate(model, make_batches(images, 2), compute_loss=compute_loss)
    assert model.training and set(metrics) == {"precision", "recall", "map50", "map"}
    assert val_loss.shape == (3,) and (val_loss > 0).all()


def test_empty_loader_and_no_detections():
    images = make_images(3)
    metrics, val_loss = evaluate(PredictionStub(images), [])
    assert metrics == {"precision": 0.0, "recall": 0.0, "map50": 0.0, "map": 0.0} and val_loss.tolist() == [0, 0, 0]
    silent = PredictionStub([(labels, np.zeros((0, 6), np.float32)) for labels, _ in images])
    assert evaluate(silent, make_batches(images, 2))[0]["map"] == 0.0


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.timeout(180)
def test_two_ranks_gather_the_single_process_metrics():
    n_images, batch_size = 7, 2  # 4 batches: rank 0 gets 4 images, rank 1 gets 3
    images = make_images(n_images)
    model, compute_loss = build_stub(images)
    expected, expected_loss = evaluate(model, make_batches(images, batch_size), compute_loss=compute_loss)
    assert 0 < expected["map"] < 1

    workers = launch("tests.workers.yolo_scenarios:sharded_evaluate", 2, timeout=150, args=(n_images, batch_size))
    assert all(w.returncode == 0 for w in workers), describe(workers)
    results = records(workers)
    assert [r["images"] for r in results] == [4, 3]
    for result in results:
        assert result["metrics"] == pytest.approx(expected, abs=1e-12), describe(workers)
        assert result["val_loss"] == pytest.approx(expected_loss.tolist(), rel=1e-5)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_model_that_learned_one_batch_detects_it():
    """Decoding, NMS, box scaling and metrics agree with what the loss trains."""
    from tests.yolo.test_loss import HYP, rectangles_batch, tiny_model

    model = tiny_model(width=0.125)
    images, targets = rectangles_batch(batch=2, per_image=3)
    batch = [((images * 255).round().to(torch.uint8), targets, ("a.jpg", "b.jpg"), (None, None))]
    compute_loss = ComputeLoss(model, HYP)
    untrained = evaluate(model, batch)[0]
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(150):
        loss, _ = compute_loss(model(images), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    trained = evaluate(model, batch)[0]
    assert model.training
    assert trained["map50"] > 0.4 and trained["map50"] > untrained["map50"] + 0.3, (untrained, trained)


class ConvProbe(torch.nn.Module):
    """A model that records, for each forward, cuDNN's autotuning flag and the dtype its convolution computes in."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner, self.seen = inner, []
        self.conv = torch.nn.Conv2d(3, 4, 3)

    def forward(self, imgs):
        self.seen.append((torch.backends.cudnn.benchmark, self.conv(imgs).dtype))
        return self.inner(imgs)


@pytest.mark.parametrize("tuned", [True, False])
def test_validation_never_autotunes_and_gives_the_flag_back(tuned, monkeypatch):
    # each rect batch shape would cost a tuning pass of every convolution, for a shape seen once an epoch
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", tuned)
    images = make_images(4)
    model, compute_loss = build_stub(images)
    probe = ConvProbe(model)
    evaluate(probe, make_batches(images, 2), compute_loss=compute_loss, verbose=False)
    assert [flag for flag, _ in probe.seen] == [False, False] and torch.backends.cudnn.benchmark is tuned
    with pytest.raises(ZeroDivisionError):  # given back when validation fails too
        evaluate(probe, [(1 / 0 for _ in range(1))], verbose=False)
    assert torch.backends.cudnn.benchmark is tuned


def probed(device: str = "cpu") -> tuple[ConvProbe, list, ComputeLoss]:
    """A :class:`ConvProbe` over the stub detector of 6 images (some missed), on ``device``; the images in batches
    of 3; the stub's loss."""
    images = make_images(6, jitter=4.0, misses=True)
    batches = make_batches(images, 3)
    model, compute_loss = build_stub(images)
    return ConvProbe(model).to(device), batches, compute_loss


def test_half_validation_on_the_cpu_is_the_fp32_one_bit_for_bit():
    probe, batches, compute_loss = probed()
    full, full_loss = evaluate(probe, batches, compute_loss=compute_loss, verbose=False)
    half, half_loss = evaluate(probe, batches, compute_loss=compute_loss, half=True, verbose=False)
    assert {dtype for _, dtype in probe.seen} == {torch.float32}
    assert full == half and full.classes == half.classes and torch.equal(full_loss, half_loss)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_half_validation_computes_in_fp16_and_scores_as_fp32():
    probe, batches, compute_loss = probed("cuda")
    full, full_loss = evaluate(probe, batches, compute_loss=compute_loss, verbose=False)
    half, half_loss = evaluate(probe, batches, compute_loss=compute_loss, half=True, verbose=False)
    assert [dtype for _, dtype in probe.seen] == [torch.float32] * 2 + [torch.float16] * 2
    assert next(probe.parameters()).dtype == torch.float32  # autocast: the EMA's weights stay fp32
    assert full == pytest.approx(half, abs=1e-3)
    torch.testing.assert_close(full_loss, half_loss, rtol=1e-2, atol=1e-3)


def test_validation_runs_the_network_in_the_runs_autocast_dtype_and_scores_near_fp32():
    """train.py passes the dtype it trains in: bf16 on the CPU too (before, evaluate knew only ``half``, fp16)."""
    probe, batches, compute_loss = probed()
    full, full_loss = evaluate(probe, batches, compute_loss=compute_loss, verbose=False)
    bf16, bf16_loss = evaluate(probe, batches, compute_loss=compute_loss, amp_dtype=torch.bfloat16, verbose=False)
    assert [dtype for _, dtype in probe.seen] == [torch.float32] * 2 + [torch.bfloat16] * 2
    assert next(probe.parameters()).dtype == torch.float32  # autocast: the EMA's weights stay fp32
    assert full == pytest.approx(bf16, abs=1e-3)
    torch.testing.assert_close(full_loss, bf16_loss, rtol=2e-2, atol=1e-3)
    probe.seen.clear()
    assert evaluate(probe, batches, amp_dtype=None, verbose=False)[0] == full  # --amp off: fp32
    assert {dtype for _, dtype in probe.seen} == {torch.float32}


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_bf16_run_on_cuda_validates_in_bf16_not_fp16():
    probe, batches, compute_loss = probed("cuda")
    metrics, _ = evaluate(probe, batches, compute_loss, amp_dtype=torch.bfloat16, verbose=False)
    assert [dtype for _, dtype in probe.seen] == [torch.bfloat16] * 2
    assert metrics == pytest.approx(evaluate(probe, batches, verbose=False)[0], abs=1e-3)


def test_half_and_an_autocast_dtype_together_or_an_unknown_dtype_are_refused():
    images = make_images(2)
    stub = PredictionStub(images)
    with pytest.raises(ValueError, match="give one"):
        evaluate(stub, make_batches(images, 2), half=True, amp_dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="torch.float16 or torch.bfloat16"):
        evaluate(stub, make_batches(images, 2), amp_dtype=torch.float64)


def test_boxes_are_decoded_in_fp32_under_bf16_autocast():
    """bf16 keeps 8 significant bits: decoded in it, a box at x = 1000 px lands on a multiple of 4 px. In eval mode
    the head's convolutions run in their weights' dtype outside autocast; in training, in autocast's."""
    from ddp_utils.yolo.model import Detect

    torch.manual_seed(0)
    anchors = [[10, 13, 16, 30, 33, 23], [30, 61, 62, 45, 59, 119], [116, 90, 156, 198, 373, 326]]
    head = Detect(nc=2, anchors=anchors, ch=(4, 4, 4)).eval()
    head.stride = torch.tensor([8.0, 16.0, 32.0])
    head.anchors /= head.stride.view(-1, 1, 1)
    features = [torch.randn(1, 4, 1024 // s, 1024 // s) for s in (8, 16, 32)]  # a 1024 px input
    pred32, raw32 = head(list(features))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        pred, raw = head(list(features))
        trained = head.train()(list(features))
    head.eval()
    assert raw[0].dtype == torch.float32 and trained[0].dtype == torch.bfloat16
    torch.testing.assert_close(pred, pred32, rtol=0, atol=0)  # the eval head: fp32 as without autocast
    for conv in head.m:  # a head whose own weights are bf16 (a model made .bfloat16()): its outputs are bf16
        conv.bfloat16()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        pred, raw = head(list(features))
    assert raw[0].dtype == torch.bfloat16 and pred.dtype == torch.float32
    expected = []  # the same raw outputs decoded in fp32 by hand
    for level, out in enumerate(raw):
        _, na, ny, nx, _ = out.shape
        ys, xs = torch.meshgrid(torch.arange(ny), torch.arange(nx), indexing="ij")
        grid = torch.stack((xs, ys), 2).view(1, 1, ny, nx, 2).float() - 0.5
        xy, wh, conf = out.float().sigmoid().split((2, 2, 3), 4)
        xy = (xy * 2 + grid) * head.stride[level]
        wh = (wh * 2) ** 2 * (head.anchors[level] * head.stride[level]).view(1, na, 1, 1, 2)
        expected.append(torch.cat((xy, wh, conf), 4).view(1, -1, 7))
    expected = torch.cat(expected, 1)
    assert expected[..., 0].max() > 1000  # the far side of the image, where bf16 is coarsest
    torch.testing.assert_close(pred, expected, rtol=0, atol=1e-3)


def test_nms_computes_in_fp32_whatever_the_predictions_dtype():
    from ddp_utils.yolo.ops import non_max_suppression

    torch.manual_seed(0)
    xy = torch.rand(1, 200, 2) * 1024
    pred = torch.cat((xy, 20 + torch.rand(1, 200, 2) * 80, torch.rand(1, 200, 3)), 2)
    coarse = pred.bfloat16()
    (out,) = non_max_suppression(coarse, 0.05, 0.5, multi_label=True)
    (reference,) = non_max_suppression(coarse.float(), 0.05, 0.5, multi_label=True)
    assert out.dtype == torch.float32 and torch.equal(out, reference)
