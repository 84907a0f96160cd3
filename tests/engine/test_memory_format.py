"""channels_last: the policy per device, and a detector's outputs unchanged by the layout (CPU)."""

from __future__ import annotations

import copy

import pytest
import torch

from ddp_utils.engine.memory_format import to_channels_last, use_channels_last
from ddp_utils.yolo import Model, load_model_yaml


def test_policy_is_cuda_only():
    assert use_channels_last("cuda:0") and use_channels_last(torch.device("cuda"))
    assert not use_channels_last("cpu") and not use_channels_last(torch.device("cpu"))


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
