"""benchmarks/parity/bf16_conv.py: bf16 autocast's convolutions in fp32 on bf16 operands give torch's bf16 kernel's
numbers where that kernel sums in fp32 and rounds once, and differ by its extra roundings where it does not; and
parity.py keeps the runs that use them apart."""

from __future__ import annotations

import pytest
import torch

from .benchmark_scripts import load_benchmark


@pytest.fixture
def bf16_conv():
    module = load_benchmark("parity/bf16_conv")
    yield module
    module.uninstall()


def _conv_step(bf16_conv, sim: bool, images: int, kernel: int, channels_last: bool) -> list[torch.Tensor]:
    """(output, weight gradient, input gradient, bias gradient) of one conv under bf16 autocast."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(8, 16, kernel, padding=kernel // 2)
    x = torch.randn(images, 8, 12, 12)
    if channels_last:
        conv, x = conv.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
    x.requires_grad_()
    (bf16_conv.install if sim else bf16_conv.uninstall)()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = conv(x)
    (out.float() * torch.randn(out.shape)).sum().backward()
    return [out.detach(), conv.weight.grad, x.grad, conv.bias.grad]


@pytest.mark.parametrize("channels_last", [False, True])
def test_one_image_through_a_1x1_kernel_gives_torchs_bits(bf16_conv, channels_last):
    torch_kernel = _conv_step(bf16_conv, False, 1, 1, channels_last)
    emulated = _conv_step(bf16_conv, True, 1, 1, channels_last)
    assert emulated[0].dtype == torch.bfloat16 and emulated[0].is_contiguous(
        memory_format=torch.channels_last if channels_last else torch.contiguous_format
    )
    for ours, theirs in zip(emulated, torch_kernel):
        assert (ours == theirs).float().mean() > 0.999  # the output's fp32 sums may round apart, rarely


def test_more_images_and_a_3x3_kernel_differ_by_torchs_extra_bf16_roundings_only(bf16_conv):
    torch_kernel = _conv_step(bf16_conv, False, 4, 3, True)
    emulated = _conv_step(bf16_conv, True, 4, 3, True)
    assert (emulated[0] == torch_kernel[0]).float().mean() > 0.999
    for ours, theirs in zip(emulated[1:3], torch_kernel[1:3]):  # weight and input gradients: one bf16 step apart
        assert not torch.equal(ours, theirs)
        assert ((ours - theirs).norm() / theirs.norm()) < 1e-2
    uninstalled = _conv_step(bf16_conv, True, 1, 1, False)  # outside bf16 autocast: torch's conv, untouched
    bf16_conv.uninstall()
    assert torch.nn.Conv2d._conv_forward is bf16_conv._original_conv_forward and uninstalled[0].dtype == torch.bfloat16


def test_parity_keeps_emulated_runs_apart_and_needs_bf16_for_them(capsys):
    parity = load_benchmark("parity")
    record = load_benchmark("parity_record")
    base = ["--ours-only", "--ours-amp", "bf16"]
    assert "bf16_conv" not in record.side_keys(parity.parse_args(base), "regime")["ours"]
    assert record.side_keys(parity.parse_args([*base, "--ours-bf16-conv", "fp32"]), "regime")["ours"]["bf16_conv"] == (
        "fp32"
    )
    with pytest.raises(SystemExit):
        parity.parse_args(["--ours-only", "--ours-bf16-conv", "fp32"])
    assert "--ours-bf16-conv fp32 is for --ours-amp bf16" in capsys.readouterr().err
