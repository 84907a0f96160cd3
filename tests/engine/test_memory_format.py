"""channels_last: the policy per device (the CPU's by its flags), a detector's outputs unchanged by the layout (CPU)."""

from __future__ import annotations

import copy

import pytest
import torch

from ddp_utils.engine.memory_format import to_channels_last, use_channels_last
from ddp_utils.yolo import Model, load_model_yaml


def test_policy_cuda_always_the_cpu_where_onednn_runs_avx2_or_more():
    assert use_channels_last("cuda:0") and use_channels_last(torch.device("cuda"))
    assert use_channels_last("cpu", flags={"avx2", "fma"}) == torch.backends.mkldnn.is_available()
    assert not use_channels_last("cpu", flags={"avx", "sse4_2"}) and not use_channels_last("cpu", flags=set())
    assert not use_channels_last(torch.device("mps"), flags={"avx2"})


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_channels_last_model_gives_the_nchw_outputs_and_gradients_on_cpu():
    torch.manual_seed(0)
    cfg, _ = load_model_yaml("yolov5n.yaml")
    model = Model({**cfg, "width_multiple": 0.125}, nc=3)
    other = to_channels_last(copy.deepcopy(model))
    conv = other.model[0].conv.weight
    assert conv.is_contiguous(memory_format=torch.channels_last) and not conv.is_contiguous()
    images = torch.rand(2, 3, 96, 128)
    for mode in ("train", "eval"):
        model.train(mode == "train")
        other.train(mode == "train")
        out = model(images)
        out_cl = other(images.contiguous(memory_format=torch.channels_last))
        if mode == "eval":
            out, out_cl = out[0], out_cl[0]
            torch.testing.assert_close(out_cl, out, rtol=1e-4, atol=1e-4)
        else:
            for level, level_cl in zip(out, out_cl):
                torch.testing.assert_close(level_cl, level, rtol=1e-4, atol=1e-4)
            sum(o.square().mean() for o in out).backward()
            sum(o.square().mean() for o in out_cl).backward()
    grad, grad_cl = model.model[0].conv.weight.grad, other.model[0].conv.weight.grad
    torch.testing.assert_close(grad_cl, grad, rtol=1e-3, atol=1e-4)
