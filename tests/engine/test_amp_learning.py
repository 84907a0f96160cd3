"""Where a bf16 run could lose its learning, each checked on the real detector: the loss and its box decode, the
step's update, BatchNorm's statistics and the EMA, under bf16 autocast against fp32 from the same weights."""

from __future__ import annotations

import copy

import pytest
import torch

from ddp_utils.engine import ModelEMA, TrainStep
from ddp_utils.yolo import ComputeLoss
from tests.yolo.test_loss import HYP, rectangles_batch, tiny_model

CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _one_thread():
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def test_the_loss_under_bf16_autocast_is_the_fp32_loss_of_the_same_outputs():
    """The head's outputs are bf16 under autocast; the loss (box decode, CIoU, BCE) must compute on them in fp32."""
    model = tiny_model(width=0.125).train()
    images, targets = rectangles_batch(batch=2, per_image=3)
    compute_loss = ComputeLoss(model, HYP)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        preds = model(images)
        loss, items = compute_loss(preds, targets)
    assert {p.dtype for p in preds} == {torch.bfloat16} and loss.dtype == items.dtype == torch.float32
    exact, exact_items = compute_loss([p.float() for p in preds], targets)  # the same values, no autocast
    torch.testing.assert_close(items, exact_items, rtol=1e-6, atol=0)
    torch.testing.assert_close(loss, exact, rtol=1e-6, atol=0)
    fp32_loss, fp32_items = compute_loss(model(images), targets)  # the network itself in fp32: bf16's rounding only
    torch.testing.assert_close(items, fp32_items, rtol=3e-2, atol=0)


def _one_step(model: torch.nn.Module, amp: str) -> tuple[torch.nn.Module, ModelEMA, torch.Tensor]:
    images, targets = rectangles_batch(batch=2, per_image=4)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    ema = ModelEMA(model)
    scaler = torch.amp.GradScaler("cuda", enabled=False)  # as train.py: a scaler only for fp16
    step = TrainStep(model, optimizer, scaler, ema, ComputeLoss(model, HYP), amp=amp)
    items = step(step.prepare((images * 255).round().to(torch.uint8), CPU), targets, 0, 0)
    assert step.optimizer_steps == 1 and ema.updates == 1
    return model, ema, items


def test_a_bf16_step_moves_the_weights_batchnorm_statistics_and_ema_as_an_fp32_step_does():
    start = tiny_model(width=0.125).train()
    fp32, fp32_ema, fp32_items = _one_step(copy.deepcopy(start), "off")
    bf16, bf16_ema, bf16_items = _one_step(copy.deepcopy(start), "bf16")
    torch.testing.assert_close(bf16_items, fp32_items, rtol=3e-2, atol=0)  # the same weights: rounding only
    before = start.state_dict()

    def moved(model: torch.nn.Module, part: str) -> torch.Tensor:
        return torch.cat([(v - before[k]).flatten() for k, v in model.state_dict().items() if k.endswith(part)])

    for part in ("running_mean", "running_var"):  # BatchNorm's statistics: fp32, from the bf16 activations
        a, b = moved(fp32, part), moved(bf16, part)
        assert torch.nn.functional.cosine_similarity(a, b, dim=0) > 0.99 and abs(b.norm() / a.norm() - 1) < 0.05, part
    # the update: bf16's 8 bits, amplified through the untrained network, leave a gradient whose direction is
    # cos 0.6-0.9 from fp32's on this tiny net (fp16: 0.97-0.999; two batches' gradients: about 0); a loss or
    # a decode in bf16, a lost gradient, would show here
    a, b = moved(fp32, "weight"), moved(bf16, "weight")
    assert torch.nn.functional.cosine_similarity(a, b, dim=0) > 0.5 and abs(b.norm() / a.norm() - 1) < 0.3
    for model, ema in ((bf16, bf16_ema), (fp32, fp32_ema)):  # the master weights and the EMA stay fp32
        assert all(v.dtype == torch.float32 for v in model.state_dict().values() if v.is_floating_point())
        assert all(v.dtype == torch.float32 for v in ema.ema.state_dict().values() if v.is_floating_point())
    d, weights = bf16_ema.decay(), bf16.state_dict()  # the EMA averages the fp32 weights, not bf16 copies of them
    for k, v in bf16_ema.ema.state_dict().items():
        if v.is_floating_point():
            torch.testing.assert_close(v, d * before[k] + (1 - d) * weights[k], rtol=1e-6, atol=1e-7)
