"""ModelEMA: the ramped decay, following the model, wrappers, attributes."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from ddp_utils.engine import ModelEMA, de_parallel, is_parallel


def model_with_bn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU())


def test_ema_copy_is_fp32_eval_and_frozen():
    model = model_with_bn().half()
    ema = ModelEMA(model)
    assert not ema.ema.training
    assert all(p.dtype == torch.float32 and not p.requires_grad for p in ema.ema.parameters())
    assert ema.ema is not model


def test_decay_ramps_from_zero_to_decay():
    ema = ModelEMA(nn.Linear(1, 1), decay=0.9999, tau=2000)
    assert ema.decay(0) == 0.0
    assert ema.decay(2000) == pytest.approx(0.9999 * (1 - math.exp(-1)))
    assert ema.decay(100_000) == pytest.approx(0.9999, rel=1e-9)
    assert all(ema.decay(n) < ema.decay(n + 1) for n in range(0, 5000, 500))


def test_ema_follows_a_model_that_settles():
    model = model_with_bn()
    ema = ModelEMA(model, decay=0.99, tau=20)
    target = {k: torch.randn_like(v) for k, v in model.state_dict().items() if v.is_floating_point()}
    with torch.no_grad():
        for _ in range(2000):
            for k, v in model.state_dict().items():
                if k in target:
                    v.copy_(target[k])
            ema.update(model)
    for k, v in ema.ema.state_dict().items():
        if k in target:
            torch.testing.assert_close(v, target[k], atol=1e-5, rtol=1e-5)
    assert ema.updates == 2000


def test_first_update_copies_the_model_and_later_ones_average():
    model = nn.Linear(3, 1)
    ema = ModelEMA(model, decay=0.5, tau=1e-9)  # ramp over at once: decay 0.5 from the first update
    before = ema.ema.weight.clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    ema.update(model)
    torch.testing.assert_close(ema.ema.weight, 0.5 * before + 0.5 * model.weight)


def test_integer_buffers_are_copied_not_averaged():
    model = model_with_bn()
    ema = ModelEMA(model, tau=1)
    model.train()
    for _ in range(3):
        model(torch.randn(2, 3, 6, 6))
    ema.update(model)
    assert int(ema.ema[1].num_batches_tracked) == 3


def test_ema_of_a_wrapped_model_has_plain_keys():
    inner = model_with_bn()
    wrapped = nn.DataParallel(inner)  # on CPU it just holds the module, which is what de_parallel looks through
    assert is_parallel(wrapped) and not is_parallel(inner)
    assert de_parallel(wrapped) is inner
    ema = ModelEMA(wrapped)
    assert set(ema.ema.state_dict()) == set(inner.state_dict())
    ema.update(wrapped)
    assert not any(k.startswith("module.") for k in ema.ema.state_dict())


def test_update_attr_include_and_exclude():
    model = model_with_bn()
    model.names, model.nc, model.hyp = ["a", "b"], 2, {"lr0": 0.01}
    ema = ModelEMA(model)
    model.names, model.nc = ["x", "y"], 5
    ema.update_attr(model, include=("names",))
    assert ema.ema.names == ["x", "y"] and ema.ema.nc == 2
    ema.update_attr(model, exclude=("nc",))
    assert ema.ema.nc == 2
    ema.update_attr(model)
    assert ema.ema.nc == 5 and not ema.ema.training


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="decay=1.5"):
        ModelEMA(nn.Linear(1, 1), decay=1.5)
    ema = ModelEMA(nn.Linear(2, 1))
    with pytest.raises(KeyError, match="'weight'"):
        ema.update(nn.Sequential(nn.Linear(2, 1)))
    with pytest.raises(ValueError, match=r"'weight' has shape \(1, 3\)"):
        ema.update(nn.Linear(3, 1))


def loop_ema_update(ema_model: nn.Module, model: nn.Module, d: float) -> None:
    """The per-tensor loop ModelEMA.update was before it used multi-tensor kernels: the reference."""
    current = model.state_dict()
    with torch.no_grad():
        for name, value in ema_model.state_dict().items():
            if value.is_floating_point():
                value.mul_(d).add_(current[name].detach().to(value.device, value.dtype), alpha=1.0 - d)
            else:
                value.copy_(current[name])


@pytest.mark.parametrize("half_model", [False, True])
def test_foreach_update_equals_the_per_tensor_loop_bit_for_bit(half_model):
    torch.manual_seed(1)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.SiLU(), nn.Conv2d(8, 4, 1), nn.BatchNorm2d(4))
    ema = ModelEMA(model, decay=0.999, tau=5)
    reference = ModelEMA(model, decay=0.999, tau=5).ema
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(25):
        model.train()
        model(torch.randn(4, 3, 9, 9)).square().mean().backward()  # moves BN running stats and the counter
        optimizer.step()
        optimizer.zero_grad()
        source = copy_as_half(model) if half_model else model
        ema.update(source)
        loop_ema_update(reference, source, ema.decay(step + 1))
    assert ema.updates == 25
    expected = reference.state_dict()
    for name, value in ema.ema.state_dict().items():
        assert value.dtype == expected[name].dtype
        assert torch.equal(value, expected[name]), name
    assert int(ema.ema[1].num_batches_tracked) == 25 and int(ema.ema[4].num_batches_tracked) == 25


def copy_as_half(model: nn.Module) -> nn.Module:
    import copy

    return copy.deepcopy(model).half()


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_update_never_waits_for_the_device():
    model = model_with_bn().cuda()
    ema = ModelEMA(model, tau=1)
    model(torch.randn(2, 3, 6, 6, device="cuda"))
    torch.cuda.set_sync_debug_mode("error")
    try:
        ema.update(model)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert int(ema.ema[1].num_batches_tracked) == 1


def test_update_pairs_once_and_launches_only_three_multi_tensor_ops():
    from ..hostwait import HostWaitCounter

    torch.manual_seed(2)
    model = model_with_bn()
    ema = ModelEMA(model, tau=3)
    reference = ModelEMA(model, tau=3).ema
    ema.update(model)  # pairs the tensors
    loop_ema_update(reference, model, ema.decay(1))
    model(torch.randn(2, 3, 6, 6))  # BatchNorm statistics and counter move
    with HostWaitCounter() as counter:
        ema.update(model)
    loop_ema_update(reference, model, ema.decay(2))
    # no state_dict(), no detach per entry: one mul, one add (floats) and one copy (integer buffers)
    assert dict(counter.by_op) == {"_foreach_mul_": 1, "_foreach_add_": 1, "_foreach_copy_": 1}
    assert not counter.waits
    # buffers replaced by .to() (a new tensor per buffer) are paired again, not left stale
    model.to(torch.float64).to(torch.float32)
    model(torch.randn(2, 3, 6, 6))
    ema.update(model)
    loop_ema_update(reference, model, ema.decay(3))
    expected = reference.state_dict()
    assert all(torch.equal(v, expected[k]) for k, v in ema.ema.state_dict().items())
