"""The non-finite guard (ddp_utils/engine/guard.py): one flag skips the step, restores BatchNorm and counts it."""

from __future__ import annotations

import pytest
import torch

from ddp_utils.engine import ModelEMA, TrainStep, smart_optimizer, train_one_epoch
from ddp_utils.engine.guard import NonFiniteGuard
from ddp_utils.run import StepControl
from tests.workers.control_scenarios import _Batches
from tests.workers.engine_scenarios import small_model
from tests.workers.step_scenarios import AMP


def _window(model, guard, optimizer, loss_offset: float) -> torch.Tensor:
    """One accumulation window of one batch whose loss is ``sum(pred) + loss_offset``: the offset (inf) makes the
    loss non-finite while its gradients stay finite. Returns the gradients' norm the step was decided on."""
    guard.before_forward()
    loss = model(torch.randn(4, 3, 8, 8)).square().sum() + loss_offset
    guard.check_loss(loss)
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=10.0)
    guard.optimizer_step(optimizer, None, norm)
    optimizer.zero_grad()
    return norm


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "plain"])
def test_a_non_finite_loss_with_finite_gradients_is_skipped_restored_and_counted_alike(fused):
    torch.manual_seed(0)
    model = small_model()
    optimizer = smart_optimizer(model, "SGD", lr=0.01, momentum=0.9, fused=fused)
    assert bool(optimizer.defaults["fused"]) is fused  # the branch under test is the one that runs
    guard = NonFiniteGuard(model, torch.device("cpu"))
    _window(model, guard, optimizer, 0.0)  # one good step first: the momentum buffers exist
    weights = [p.detach().clone() for p in model.parameters()]
    bn_mean = model[1].running_mean.clone()
    norm = _window(model, guard, optimizer, float("inf"))
    assert torch.isfinite(norm)  # the case: only the loss says the window is bad
    assert all(torch.equal(p, w) for p, w in zip(model.parameters(), weights)), "the step was taken"
    assert torch.equal(model[1].running_mean, bn_mean) and guard.counts.tolist() == [1.0, 1.0, 0.0]
    _window(model, guard, optimizer, 0.0)  # a good window after it steps, and ends the run of skips
    assert not torch.equal(model[0].weight, weights[0]) and guard.counts.tolist() == [1.0, 0.0, 0.0]


def _overflowing_step(model, scaler) -> TrainStep:
    def compute_loss(pred, targets):  # gradients of 1e36 times the loss overflow fp16-scaled
        loss = (pred.float() - targets).square().sum()
        return loss * 1e36, loss.detach().repeat(3)

    optimizer = smart_optimizer(model, "SGD", lr=0.01, momentum=0.9, fused=True)
    return TrainStep(model, optimizer, scaler, ModelEMA(model, tau=2), compute_loss, amp=AMP)  # fp16 here


@pytest.mark.skipif(AMP != "fp16", reason="this torch has no fp16 autocast on the CPU")
def test_a_persistent_gradscaler_overflow_is_counted_and_stops_the_run():
    """Every step overflows: the GradScaler skips it and halves its scale; each skip is counted on the device
    (no read back: the fused optimizer takes the flag), so the run stops as diverged at the limit."""
    torch.manual_seed(0)
    model = small_model()
    scaler = torch.amp.GradScaler("cpu", init_scale=16.0)
    step = _overflowing_step(model, scaler)
    weights = [p.detach().clone() for p in model.parameters()]
    with StepControl(nonfinite_limit=5) as control:
        stats = train_one_epoch(step, _Batches(20), 0, torch.device("cpu"), control=control)
    assert stats.stopped and control.reason == "diverged" and control.in_a_row >= 5, (stats, control.in_a_row)
    assert stats.batch == control.skipped == 5  # on the CPU the counts are current: stopped at the fifth skip
    assert step.guard.counts.tolist() == [5.0, 5.0, 5.0]  # each one the scaler's overflow (the losses were finite)
    assert scaler.get_scale() == 16.0 / 2**5  # the scaler skipped every one of them itself
    assert all(torch.equal(p, w) for p, w in zip(model.parameters(), weights))


def test_the_gradscaler_steps_finite_gradients_and_counts_nothing():
    """The positive control of the test above: the same step with a loss that fits steps and counts no skip."""
    torch.manual_seed(0)
    model = small_model()
    scaler = torch.amp.GradScaler("cpu", init_scale=16.0)
    step = _overflowing_step(model, scaler)
    step.compute_loss = lambda pred, targets: ((pred - targets).square().sum(),) * 2
    weights = [p.detach().clone() for p in model.parameters()]
    with StepControl(nonfinite_limit=5) as control:
        stats = train_one_epoch(step, _Batches(8), 0, torch.device("cpu"), control=control)
    assert not stats.stopped and control.skipped == 0 and step.guard.counts.tolist() == [0.0] * 3
    assert scaler.get_scale() == 16.0 and not torch.equal(model[0].weight, weights[0])


@pytest.mark.skipif(AMP != "fp16", reason="this torch has no fp16 autocast on the CPU")
def test_the_gradscalers_first_overflows_are_counted_but_do_not_make_an_epoch_diverging():
    """A scale far too high overflows the first steps (the scaler's routine as it finds its scale): those are
    skipped and counted, as overflows, and an epoch made mostly of them is not called diverging."""
    torch.manual_seed(0)
    model = small_model()
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**40)
    step = _overflowing_step(model, scaler)
    step.compute_loss = lambda pred, targets: ((pred.float() - targets).square().sum(),) * 2
    with StepControl(nonfinite_limit=25) as control:
        train_one_epoch(step, _Batches(8), 0, torch.device("cpu"), control=control)
        stop = control.epoch_end(step)
    assert control.epoch_skipped == control.epoch_overflows > 4 and control.epoch_steps == 8, control.epoch_skipped
    assert not control.diverging and not stop and scaler.get_scale() < 2.0**40
