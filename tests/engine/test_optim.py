"""smart_optimizer's groups, the LR lambdas, warm-up and accumulation."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from ddp_utils.engine import (
    Warmup,
    accumulate_steps,
    cosine_lr,
    linear_lr,
    lr_lambda,
    one_cycle,
    param_groups,
    scaled_weight_decay,
    smart_optimizer,
)


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.head = nn.Conv2d(8, 4, 1)
        self.ln = nn.LayerNorm(4)
        self.frozen = nn.Linear(4, 4)
        self.frozen.requires_grad_(False)


def ids(params):
    return {id(p) for p in params}


def test_parameters_land_in_the_right_group():
    net = Net()
    groups = param_groups(net)
    assert ids(groups["weight"]) == ids([net.conv.weight, net.head.weight])
    assert ids(groups["norm"]) == ids([net.bn.weight, net.ln.weight])
    assert ids(groups["bias"]) == ids([net.bn.bias, net.head.bias, net.ln.bias])
    all_trainable = [p for p in net.parameters() if p.requires_grad]
    assert sum(map(len, groups.values())) == len(all_trainable)  # each exactly once, frozen ones left out


@pytest.mark.parametrize(
    "name,cls", [("SGD", torch.optim.SGD), ("adam", torch.optim.Adam), ("AdamW", torch.optim.AdamW)]
)
def test_optimizer_groups_and_decay(name, cls):
    net = Net()
    opt = smart_optimizer(nn.DataParallel(net), name, lr=0.02, momentum=0.9, decay=5e-4)
    assert type(opt) is cls
    assert [g["name"] for g in opt.param_groups] == ["bias", "weight", "norm"]
    assert [g["weight_decay"] for g in opt.param_groups] == [0.0, 5e-4, 0.0]
    assert all(g["lr"] == 0.02 for g in opt.param_groups)
    if cls is torch.optim.SGD:
        assert all(g["nesterov"] and g["momentum"] == 0.9 for g in opt.param_groups)
    else:
        assert all(g["betas"] == (0.9, 0.999) for g in opt.param_groups)


def test_unknown_optimizer_lists_the_choices():
    with pytest.raises(ValueError, match="'RMSprop' is not supported: choose one of SGD, Adam, AdamW"):
        smart_optimizer(Net(), "RMSprop")


@pytest.mark.parametrize("schedule", [linear_lr, cosine_lr])
def test_lr_lambdas_start_at_one_and_end_at_lrf(schedule):
    lf = schedule(lrf=0.1, epochs=30)
    assert lf(0) == pytest.approx(1.0)
    assert lf(30) == pytest.approx(0.1)
    values = [lf(e) for e in range(31)]
    assert all(a >= b for a, b in zip(values, values[1:]))


def test_cosine_is_the_half_cosine_and_linear_is_linear():
    assert cosine_lr(0.0, 10)(5) == pytest.approx(0.5)
    assert cosine_lr(0.0, 10)(2.5) == pytest.approx((1 + math.cos(math.pi / 4)) / 2)
    assert linear_lr(0.0, 10)(2.5) == pytest.approx(0.75)
    assert isinstance(lr_lambda(0.01, 10, cos_lr=False), linear_lr)


def test_lambdalr_state_dict_is_plain_and_restores():
    opt = smart_optimizer(Net(), lr=0.01)
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda=cosine_lr(0.01, 10))
    state = scheduler.state_dict()
    assert state["lr_lambdas"][0] == {"lrf": 0.01, "epochs": 10}


def test_accumulation_and_decay_scaling():
    assert [accumulate_steps(b) for b in (1, 8, 16, 48, 64, 100, 512)] == [64, 8, 4, 1, 1, 1, 1]
    # the decay is per 64 images of accumulated gradient
    assert scaled_weight_decay(5e-4, 16, accumulate_steps(16)) == pytest.approx(5e-4)
    assert scaled_weight_decay(5e-4, 256, accumulate_steps(256)) == pytest.approx(2e-3)
    with pytest.raises(ValueError, match="total_batch_size=0"):
        accumulate_steps(0)


def make_warmup(nb=50, epochs=10, warmup_epochs=3.0, name="SGD"):
    opt = smart_optimizer(Net(), name, lr=0.01, momentum=0.937)
    lf = linear_lr(0.01, epochs)
    scheduler = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda=lf)
    warmup = Warmup(opt, lf, nb, warmup_epochs=warmup_epochs, warmup_bias_lr=0.1, warmup_momentum=0.8, momentum=0.937)
    return opt, scheduler, warmup


def test_warmup_iterations():
    assert make_warmup(nb=50, warmup_epochs=3)[2].iters == 150
    assert make_warmup(nb=10, warmup_epochs=3)[2].iters == 100  # at least 100
    assert make_warmup(nb=10, warmup_epochs=0)[2].iters == 0


def test_warmup_values_at_start_middle_and_end():
    opt, _, warmup = make_warmup(nb=50)
    assert warmup.step(0, epoch=0)
    lrs = [g["lr"] for g in opt.param_groups]
    assert lrs == [0.1, 0.0, 0.0]
    assert all(g["momentum"] == 0.8 for g in opt.param_groups)
    warmup.step(75, epoch=1)
    end = 0.01 * linear_lr(0.01, 10)(1)
    assert opt.param_groups[0]["lr"] == pytest.approx((0.1 + end) / 2)
    assert opt.param_groups[1]["lr"] == pytest.approx(end / 2)
    assert opt.param_groups[2]["momentum"] == pytest.approx((0.8 + 0.937) / 2)
    warmup.step(150, epoch=2)
    end = 0.01 * linear_lr(0.01, 10)(2)
    assert [g["lr"] for g in opt.param_groups] == pytest.approx([end] * 3)
    assert all(g["momentum"] == pytest.approx(0.937) for g in opt.param_groups)
    before = [dict(g) for g in opt.param_groups]
    assert not warmup.step(151, epoch=3)
    assert [g["lr"] for g in opt.param_groups] == [g["lr"] for g in before]


def test_warmup_sets_adam_beta1():
    opt, _, warmup = make_warmup(name="Adam")
    warmup.step(0, epoch=0)
    assert all(g["betas"] == (0.8, 0.999) for g in opt.param_groups)


def test_warmup_accumulate_ramps_to_target():
    _, _, warmup = make_warmup(nb=50)
    values = [warmup.accumulate(ni, 4) for ni in range(0, 200, 10)]
    assert values[0] == 1 and values[-1] == 4
    assert all(a <= b for a, b in zip(values, values[1:]))


def test_one_cycle_is_yolov5s_half_cosine_from_y1_to_y2():
    lf = one_cycle(1, 0.01, 100)  # YOLOv5's train.py: one_cycle(1, hyp["lrf"], epochs)
    for x in (0, 10, 33.5, 50, 99, 100):
        assert lf(x) == pytest.approx(((1 - math.cos(x * math.pi / 100)) / 2) * (0.01 - 1) + 1)
        assert lf(x) == pytest.approx(cosine_lr(0.01, 100)(x))
    assert one_cycle()(0) == 0.0 and one_cycle()(100) == pytest.approx(1.0)  # defaults y1=0, y2=1, steps=100
    assert one_cycle(y1=0.2, y2=0.8, steps=4)(2) == pytest.approx(0.5)


def test_one_cycle_in_a_lambda_lr_saves_and_restores():
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=one_cycle(1, 0.01, 10))
    for _ in range(3):
        optimizer.step()
        scheduler.step()
    state = scheduler.state_dict()
    assert state["lr_lambdas"][0] == {"y1": 1.0, "y2": 0.01, "steps": 10}  # a lambda would not be saved
    fresh = torch.optim.lr_scheduler.LambdaLR(torch.optim.SGD(model.parameters(), lr=0.1), lr_lambda=one_cycle())
    fresh.load_state_dict(state)
    assert fresh.lr_lambdas[0](5) == pytest.approx(one_cycle(1, 0.01, 10)(5))


@pytest.mark.cuda
def test_fused_is_automatic_on_cuda_only_and_can_be_asked_for():
    net = Net()
    assert all(not g["fused"] for g in smart_optimizer(net, "SGD").param_groups)  # CPU parameters
    for name in ("SGD", "Adam", "AdamW"):
        assert all(g["fused"] is True for g in smart_optimizer(net, name, fused=True).param_groups)
    if torch.cuda.is_available():
        assert all(g["fused"] is True for g in smart_optimizer(Net().cuda(), "SGD").param_groups)


def skipped_step(optimizer: torch.optim.Optimizer) -> None:
    """One step as GradScaler hands a fused optimizer an overflow: ``found_inf`` set, nothing applied."""
    optimizer.grad_scale, optimizer.found_inf = None, torch.ones(())
    try:
        optimizer.step()
    finally:
        del optimizer.grad_scale, optimizer.found_inf


def test_a_fused_sgd_whose_first_step_is_skipped_then_steps_as_the_plain_one():
    """torch's fused SGD allocates its momentum with empty_like at the first step and the kernel fills it, unless
    that step is skipped: on an H100, fp16's first overflow left uninitialised buffers and NaN weights a step later.
    Here the buffers exist (zeros) from the start, and a skipped first step leaves the run as if it had not been."""
    torch.manual_seed(0)
    fused_net, plain_net = (nn.Sequential(nn.Conv2d(3, 8, 3, bias=False), nn.BatchNorm2d(8), nn.Conv2d(8, 4, 1))
                            for _ in range(2))  # fmt: skip
    plain_net.load_state_dict(fused_net.state_dict())
    fused = smart_optimizer(fused_net, "SGD", lr=0.1, decay=5e-4, fused=True)
    plain = smart_optimizer(plain_net, "SGD", lr=0.1, decay=5e-4, fused=False)
    buffers = [fused.state[p]["momentum_buffer"] for g in fused.param_groups for p in g["params"]]
    assert len(buffers) == sum(len(g["params"]) for g in fused.param_groups)
    assert all(torch.equal(b, torch.zeros_like(b)) for b in buffers)
    for p in fused_net.parameters():  # what an overflowing fp16 backward leaves
        p.grad = torch.full_like(p, float("inf"))
    skipped_step(fused)
    for _ in range(3):  # then finite steps on both
        x = torch.randn(2, 3, 6, 6)
        for net, optimizer in ((fused_net, fused), (plain_net, plain)):
            optimizer.zero_grad()
            net(x).sum().backward()
            optimizer.step()
    for (name, a), b in zip(fused_net.named_parameters(), plain_net.parameters()):
        assert torch.isfinite(a).all(), name
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, msg=name)


def test_a_fused_sgd_keeps_zero_buffers_after_loading_a_state_without_them():
    net = Net()
    fused = smart_optimizer(net, "SGD", fused=True)
    empty = smart_optimizer(Net(), "SGD", fused=False).state_dict()  # saved before any step: no buffers
    fused.load_state_dict(empty)
    assert all(fused.state[p]["momentum_buffer"] is not None for p in net.parameters() if p.requires_grad)
