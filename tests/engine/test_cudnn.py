"""engine/cudnn.py: cuDNN's modes, and a warm-up that tunes the training shape without touching the run (CPU)."""

from __future__ import annotations

import pytest
import torch

from ddp_utils.engine import TrainStep, set_cudnn_tuning, to_channels_last, warm_up_convolutions
from ddp_utils.engine.cudnn import bare_model, run_warm_up

from .test_loop import CPU, batches, fresh_run


@pytest.fixture
def cudnn_flags(monkeypatch):
    for name in ("benchmark", "deterministic", "benchmark_limit"):
        monkeypatch.setattr(torch.backends.cudnn, name, getattr(torch.backends.cudnn, name))


@pytest.mark.parametrize(
    "mode, deterministic, benchmark",
    [("off", False, False), ("on", False, True), ("warm", False, True), ("on", True, False)],
)
def test_modes_set_cudnns_flags_and_deterministic_wins(cudnn_flags, mode, deterministic, benchmark):
    set_cudnn_tuning(mode, deterministic, limit=3)
    assert torch.backends.cudnn.benchmark is benchmark and torch.backends.cudnn.deterministic is deterministic
    assert torch.backends.cudnn.benchmark_limit == 3


def test_bad_modes_and_limits_are_named(cudnn_flags):
    with pytest.raises(ValueError, match=r"--cudnn-benchmark fast: choose one of off, on, warm"):
        set_cudnn_tuning("fast")
    with pytest.raises(ValueError, match=r"--cudnn-benchmark-limit -1"):
        set_cudnn_tuning("on", limit=-1)
    for limit in (2**31, 2**40, 10**20):  # torch would store -2**31, 0 ("all"), or fail naming no option
        with pytest.raises(ValueError, match=rf"^--cudnn-benchmark-limit {limit}: .* at most 2147483647"):
            set_cudnn_tuning("on", limit=limit)
    set_cudnn_tuning("on", limit=2**31 - 1)
    assert torch.backends.cudnn.benchmark_limit == 2**31 - 1


def make_step(amp: str = "off", channels_last: bool = False) -> TrainStep:
    model, optimizer, ema, compute_loss, warmup, scaler, _ = fresh_run(4, multi_scale=False)
    if channels_last:
        to_channels_last(model)
        to_channels_last(ema.ema)
    step = TrainStep(model, optimizer, scaler, ema, compute_loss, warmup=warmup, amp=amp, channels_last=channels_last)
    return step


def record_convolutions(model: torch.nn.Module) -> list[tuple]:
    """Each convolution's (input shape, output dtype, channels_last input), in call order, copies of the model too."""
    seen: list[tuple] = []

    def hook(_module, inputs, output):
        image = inputs[0]
        seen.append((tuple(image.shape), output.dtype, image.is_contiguous(memory_format=torch.channels_last)))

    for module in model.modules():
        if isinstance(module, torch.nn.Conv2d):
            module.register_forward_hook(hook)
    return seen


def test_off_the_gpu_or_in_another_mode_nothing_is_done(cudnn_flags):
    set_cudnn_tuning("warm")
    step = make_step()
    assert warm_up_convolutions(step, (2, 3, 64, 64), CPU, mode="warm") is None
    assert warm_up_convolutions(step, (2, 3, 64, 64), "cuda", mode="on") is None  # no CUDA needed to say no
    assert step.wait_for is None


@pytest.mark.slow  # 5-30 s on a shared 2-core host
@pytest.mark.timeout(300)
@pytest.mark.parametrize("amp, channels_last", [("off", False), ("bf16", True)])
def test_the_warm_up_convolves_as_the_step_does(amp, channels_last):
    step = make_step(amp, channels_last)
    seen = record_convolutions(step.model)
    warm = run_warm_up(step, (2, 3, 64, 64), CPU)
    warmed, seen[:] = list(seen), []
    imgs, targets, *_ = batches(1, size=64, batch=2)[0]
    step(step.prepare(imgs, CPU), targets, 0, 0)
    assert warmed == seen and len(seen) == sum(isinstance(m, torch.nn.Conv2d) for m in step.model.modules())
    assert {dtype for _, dtype, _ in seen} == {torch.bfloat16 if amp == "bf16" else torch.float32}
    assert all(layout is channels_last for *_, layout in seen)
    assert warm.error is None and warm.seconds > 0
    assert warm.gradients == sum(p.requires_grad for p in step.model.parameters())  # the backward reached them all


def snapshot(step: TrainStep) -> dict:
    return {
        "model": {k: v.clone() for k, v in step.model.state_dict().items()},
        "ema": {k: v.clone() for k, v in step.ema.ema.state_dict().items()},
        "grads": [None if p.grad is None else p.grad.clone() for p in step.model.parameters()],
        "optimizer": repr(step.optimizer.state_dict()),
        "rng": torch.get_rng_state(),
    }


def assert_same(a: dict, b: dict) -> None:
    assert a["model"].keys() == b["model"].keys()
    assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert all(torch.equal(a["ema"][k], b["ema"][k]) for k in a["ema"])
    assert all((x is None and y is None) or torch.equal(x, y) for x, y in zip(a["grads"], b["grads"]))
    assert a["optimizer"] == b["optimizer"] and torch.equal(a["rng"], b["rng"])


def train_steps(step: TrainStep, n: int = 3) -> dict:
    for ni, (imgs, targets, *_) in enumerate(batches(n, size=64, batch=2, seed=4)):
        step(step.prepare(imgs, CPU), targets, ni, 0)
    return snapshot(step)


@pytest.mark.slow  # 5-30 s on a shared 2-core host
@pytest.mark.timeout(300)
def test_the_warm_up_touches_nothing_and_the_run_stays_bit_identical():
    plain = train_steps(make_step())
    step = make_step()
    before = snapshot(step)
    warm = run_warm_up(step, (2, 3, 64, 64), CPU, background=True)  # beside the caller, as train.py runs it
    assert step.wait_for == warm.wait
    warmed = train_steps(step)  # the first step waits for the warm-up
    assert warm.thread is None and warm.error is None and step.wait_for is None
    assert_same(warmed, plain)
    idle = make_step()
    run_warm_up(idle, (2, 3, 64, 64), CPU)
    assert_same(snapshot(idle), before)  # weights, BatchNorm statistics, EMA, gradients, optimizer, generator


def test_bare_model_unwraps_ddp_and_compile_in_either_order():
    class Wrapper(torch.nn.Module):
        def __init__(self, inner: torch.nn.Module, attribute: str) -> None:
            super().__init__()
            setattr(self, attribute, inner)

    net = torch.nn.Conv2d(1, 1, 1)
    assert bare_model(Wrapper(Wrapper(net, "module"), "_orig_mod")) is net
    assert bare_model(Wrapper(Wrapper(net, "_orig_mod"), "module")) is net and bare_model(net) is net


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_warm_up_tunes_beside_the_caller_and_touches_nothing(cudnn_flags):
    set_cudnn_tuning("warm")
    model, optimizer, ema, compute_loss, warmup, _, _ = fresh_run(4, multi_scale=False)
    model.cuda()
    to_channels_last(model)
    ema.ema.cuda()
    scaler = torch.amp.GradScaler("cuda")
    step = TrainStep(model, optimizer, scaler, ema, compute_loss, warmup=warmup, amp="fp16", channels_last=True)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    warm = warm_up_convolutions(step, (2, 3, 64, 64), "cuda", mode="warm")
    assert warm is not None and step.wait_for == warm.wait
    warm.wait()
    assert warm.error is None and warm.seconds > 0
    assert warm.gradients == sum(p.requires_grad for p in model.parameters())
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_a_model_that_cannot_be_copied_gets_no_warm_up_and_a_warning(caplog):
    step = make_step()

    class Uncopyable(torch.nn.Module):
        def __deepcopy__(self, memo):
            raise TypeError("cannot pickle 'ProcessGroup' object")

    step.model.add_module("group_holder", Uncopyable())
    warm = run_warm_up(step, (2, 3, 64, 64), CPU, background=True)
    assert warm.thread is None and step.wait_for is None
    assert warm.error == "TypeError: cannot pickle 'ProcessGroup' object"
    assert "cuDNN warm-up skipped: the model could not be copied" in caplog.text
