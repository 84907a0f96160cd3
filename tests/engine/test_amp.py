"""How a run computes: bf16 on a GPU or CPU that only emulates it warns; the CPU's mode by its flags (faked here,
so the answers hold on any CI machine); bf16 steps keep the weights, optimizer, EMA and BatchNorm statistics fp32."""

from __future__ import annotations

import importlib
import logging

import pytest
import torch
from torch import nn

from ddp_utils.engine import ModelEMA, TrainStep, resolve_amp, to_channels_last, train_mode

amp_module = importlib.import_module("ddp_utils.engine.amp")
layout_module = importlib.import_module("ddp_utils.engine.memory_format")
GPU = torch.device("cuda", 0)
CPU = torch.device("cpu")
AVX2 = frozenset({"sse4_2", "avx", "avx2", "fma"})  # an AVX2 server: no bf16 in the cores
BF16 = AVX2 | {"avx512f", "avx512_bf16"}  # Cooper Lake, Zen 4
AMX = AVX2 | {"avx512f", "amx_bf16", "amx_tile"}  # Sapphire Rapids
needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="torch built without oneDNN")


@pytest.fixture
def fake_cpu(monkeypatch):
    """Make this machine's CPU report ``flags`` to the mode's decision."""

    def fake(flags):
        monkeypatch.setattr(amp_module, "cpu_flags", lambda: frozenset(flags))
        monkeypatch.setattr(layout_module, "cpu_flags", lambda: frozenset(flags))

    return fake


def test_bf16_on_a_gpu_without_native_bf16_warns(monkeypatch, caplog):
    # torch's own query, answering True only when emulation counts (a pre-Ampere card)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    with caplog.at_level(logging.WARNING, logger="ddp_utils"):
        assert resolve_amp("bf16", GPU) == "bf16"
    assert "no native bf16" in caplog.text and "cuda:0" in caplog.text


def test_bf16_on_a_native_gpu_or_cpu_says_nothing(monkeypatch, caplog, fake_cpu):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    fake_cpu(BF16)
    with caplog.at_level(logging.WARNING, logger="ddp_utils"):
        assert resolve_amp("bf16", GPU) == "bf16"
        assert resolve_amp("bf16", CPU) == "bf16"
        assert resolve_amp(None, GPU) == "fp16"
    assert "bf16" not in caplog.text
    assert amp_module._native_bf16()
    assert train_mode(None, GPU) == amp_module.TrainMode("fp16", True, "cuda:0: amp fp16, channels_last")


@needs_onednn
@pytest.mark.parametrize("flags,native", [(BF16, "avx512_bf16"), (AMX, "amx_bf16")])
def test_a_cpu_with_native_bf16_gets_bf16_and_channels_last_once_the_gate_opens(fake_cpu, flags, native):
    fake_cpu(flags)
    opened = train_mode(None, CPU, bf16_by_default=True)
    assert (opened.amp, opened.channels_last) == ("bf16", True) and f"native: {native}" in opened.why
    assert "--amp off: fp32 and NCHW" in opened.why
    gated = train_mode(None, CPU)  # the default per kind: closed until speed and parity on such a CPU say otherwise
    open_here = amp_module.CPU_BF16_BY_DEFAULT[native]
    assert (gated.amp, gated.channels_last) == ("bf16" if open_here else "off", True)
    if not open_here:  # the log claims only what was measured for this kind of CPU
        assert f"computes bf16 natively ({native}): {amp_module.bf16_advice(native)}" in gated.why
        assert amp_module.BF16_FASTER[native] in gated.why


@needs_onednn
def test_the_cpu_default_is_chosen_per_kind_of_cpu_amx_apart_from_avx512_bf16_alone(fake_cpu, monkeypatch):
    # a gate opened for AMX hosts must leave an avx512_bf16 host without AMX fp32 (its figures are its own,
    # docs/cpu.md); a Sapphire Rapids host has both flags and counts as AMX
    assert amp_module.CPU_BF16_BY_DEFAULT == {"amx_bf16": False, "avx512_bf16": False}  # nothing shown yet
    monkeypatch.setitem(amp_module.CPU_BF16_BY_DEFAULT, "amx_bf16", True)
    fake_cpu(AMX | {"avx512_bf16"})
    assert train_mode(None, CPU).amp == "bf16"
    fake_cpu(BF16)
    mode = train_mode(None, CPU)
    assert mode.amp == "off" and amp_module.BF16_FASTER["avx512_bf16"] in mode.why
    assert [amp_module.cpu_kind(flags) for flags in (AMX, BF16, AVX2)] == ["amx_bf16", "avx512_bf16", "none"]


@needs_onednn
def test_a_cpu_without_native_bf16_keeps_fp32_and_warns_when_bf16_is_asked(fake_cpu, caplog):
    fake_cpu(AVX2)
    for gate in (False, True):
        mode = train_mode(None, CPU, bf16_by_default=gate)
        assert (mode.amp, mode.channels_last) == ("off", True) and "no native bf16" in mode.why
    assert resolve_amp(None, CPU) == "off"
    with caplog.at_level(logging.WARNING, logger="ddp_utils"):
        asked = train_mode("bf16", CPU)
    assert (asked.amp, asked.channels_last) == ("bf16", True)
    assert "this CPU has no native bf16" in caplog.text and "9x slower" in caplog.text


LEARNS = amp_module.Bf16Learning(5, (0.830, 0.010), (0.833, 0.014), "a.json")  # within one std of fp32's mean
LOSES = amp_module.Bf16Learning(5, (0.800, 0.010), (0.833, 0.014), "b.json")  # 0.800 < 0.833 - 0.014


@needs_onednn
def test_the_log_recommends_bf16_only_where_it_is_faster_and_learns_within_a_seed_spread_of_fp32(fake_cpu, monkeypatch):
    """The compute line of a run left to its default, per kind of host (its CPU flags faked) and per learning figure."""
    for flags in (BF16, AMX):
        fake_cpu(flags)
        monkeypatch.setattr(amp_module, "BF16_LEARNING", LEARNS)
        why = train_mode(None, CPU).why
        assert "--amp bf16 is faster here" in why and why.endswith("try it") and "0.830 (std 0.010)" in why
        monkeypatch.setattr(amp_module, "BF16_LEARNING", LOSES)
        why = train_mode(None, CPU).why
        assert "learned less than fp32" in why and "try it" not in why and "0.800" in why
        monkeypatch.setattr(amp_module, "BF16_LEARNING", None)
        assert "whether it learns as fp32 does is not measured" in train_mode(None, CPU).why
    fake_cpu(AVX2)  # bf16 emulated: slower, whatever it learns; the line says nothing of --amp bf16
    for learning in (LEARNS, LOSES, None):
        monkeypatch.setattr(amp_module, "BF16_LEARNING", learning)
        why = train_mode(None, CPU).why
        assert "--amp bf16" not in why and "no native bf16" in why
    assert not amp_module.Bf16Learning(4, (0.9, 0.0), (0.8, 0.01), "c.json").learns_as_fp32()  # fewer than 5 seeds


@needs_onednn
def test_the_shipped_figures_recommend_bf16_on_a_native_host_only_if_they_show_it_learns(fake_cpu):
    learning = amp_module.BF16_LEARNING
    fake_cpu(BF16)
    recommended = train_mode(None, CPU).why.endswith("try it")
    assert recommended == (learning is not None and learning.learns_as_fp32())
    fake_cpu(AVX2)
    assert "--amp bf16" not in train_mode(None, CPU).why


def test_amp_off_is_yolov5s_fp32_nchw_and_a_resume_keeps_its_recorded_layout(fake_cpu):
    fake_cpu(BF16)
    assert train_mode("off", CPU) == amp_module.TrainMode("off", False, "CPU: --amp off: fp32 in NCHW")
    assert train_mode("off", CPU, channels_last=True).channels_last  # a resumed auto-mode run (amp settled to off)
    assert not train_mode(None, CPU, channels_last=False).channels_last  # one begun before channels_last on CPU
    assert not train_mode(None, GPU, channels_last=False).channels_last


def test_channels_last_only_where_onednn_runs_the_convolutions(fake_cpu):
    fake_cpu({"fp", "asimd", "bf16"})  # Arm: unmeasured there, so NCHW as before; and no x86 bf16 flag
    mode = train_mode(None, CPU, bf16_by_default=True)
    assert (mode.amp, mode.channels_last) == ("off", False) and "NCHW" in mode.why
    assert not layout_module.use_channels_last("cpu", flags={"sse4_2", "avx"})  # x86 before AVX2
    assert layout_module.use_channels_last("cpu", flags=AVX2) == torch.backends.mkldnn.is_available()


def test_bad_choices_are_refused_naming_the_option():
    with pytest.raises(ValueError, match="--amp fp8: choose one of fp16, bf16, off"):
        train_mode("fp8", CPU)
    with pytest.raises(ValueError, match="--amp fp16 needs a CUDA device"):
        train_mode("fp16", CPU, flags=BF16)


class TinyDetector(nn.Module):
    """Conv, BatchNorm, SiLU, conv: what autocast puts in bf16 and what it must not."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.SiLU())
        self.head = nn.Conv2d(8, 4, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def fp32_loss(pred: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    loss = pred.float().square().mean() + 0 * targets.sum()  # the detector's loss casts to fp32 as ComputeLoss does
    return loss, loss.detach().repeat(3)


@pytest.mark.parametrize("channels_last", [False, True])
def test_bf16_steps_keep_fp32_weights_optimizer_ema_and_batchnorm_statistics(channels_last):
    torch.manual_seed(0)
    model = TinyDetector()
    if channels_last:
        to_channels_last(model)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    ema = ModelEMA(model)
    scaler = torch.amp.GradScaler("cuda", enabled=False)  # as train.py: a scaler only for fp16
    step = TrainStep(model, optimizer, scaler, ema, fp32_loss, amp="bf16", channels_last=channels_last)
    seen = {}
    model.body[1].register_forward_hook(lambda m, i, o: seen.update(bn_in=i[0].dtype))
    model.head.register_forward_hook(lambda m, i, o: seen.update(head_out=o.dtype))
    images = torch.randint(0, 256, (2, 3, 16, 16), dtype=torch.uint8)
    for ni in range(3):
        items = step(step.prepare(images, CPU), torch.zeros(1, 6), ni, 0)
    assert seen == {"bn_in": torch.bfloat16, "head_out": torch.bfloat16}  # autocast did compute in bf16
    assert items.dtype == torch.float32 and step.optimizer_steps == 3
    for name, p in model.named_parameters():
        assert p.dtype == torch.float32 and not torch.equal(p, before[name]), name  # fp32 master weights, updated
        assert optimizer.state[p]["momentum_buffer"].dtype == torch.float32
    assert all(t.dtype == torch.float32 for t in ema.ema.state_dict().values() if t.is_floating_point())
    bn = model.body[1]
    assert bn.running_mean.dtype == bn.running_var.dtype == torch.float32 and bn.num_batches_tracked == 3
    assert not torch.equal(bn.running_var, torch.ones(8))  # the statistics moved, in fp32
    flat = step.guard.stats.flat  # the non-finite guard's one tensor: the buffers still view into it
    assert flat.dtype == torch.float32 and bn.running_mean.data_ptr() in range(flat.data_ptr(), flat.data_ptr() + 64)
    if channels_last:
        assert model.body[0].weight.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize(
    ("amp", "channels_last", "words"),
    [("off", True, "fp32, channels_last"), ("off", False, "fp32, NCHW"), ("bf16", True, "bf16 autocast, channels_last"),
     ("fp16", True, "fp16 autocast, channels_last")],
)  # fmt: skip
def test_the_run_summary_names_the_compute_mode_as_the_compute_line_does(tmp_path, amp, channels_last, words):
    """It said "amp off" on a run whose compute line said "fp32, channels_last"."""
    import argparse

    from ddp_utils.run.records import summary_line
    from ddp_utils.run.start import Run

    run = Run(argparse.Namespace(), tmp_path, "k", {}, {}, "hyp.yaml", 3, amp, 1, {0: "a"}, imgsz=128, batch_size=8,
              channels_last=channels_last)  # fmt: skip
    line = summary_line(run, world_size=2, accumulate=4, images=64)
    assert line == (f"image size 128, 2 process(es) x 4 images, accumulate 4, {words}, 64 training images, 3 epochs, "
                    f"logging to {tmp_path}")  # fmt: skip
    assert "amp" not in line
    if amp == "off":  # the CPU's compute line for the same mode says the same words
        why = train_mode(None, "cpu", flags={"avx2"}, channels_last=channels_last).why
        assert why.startswith(f"CPU: {words.split(',')[0]}") and words.split(", ")[1] in why
